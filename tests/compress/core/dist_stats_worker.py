"""Statistics passes on tiny seeded models, run as one process or as every rank of a ``torchrun`` launch.

``python -m torch.distributed.run --nproc-per-node 2 tests/compress/core/dist_stats_worker.py OUT`` runs
:func:`run_cases` on every rank (gloo); rank 0 alone writes ``OUT/distributed.pt``, and each rank gives the
factorize cache its own directory ``OUT/cache-rank{r}``, so a write by a non-writer rank would show.
tests/compress/core/test_distributed.py loads this file by path and calls :func:`run_cases` in one process
for the reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.chain import extract_chain
from minreal.compress.core.data import Dataset
from minreal.compress.core.distributed import is_writer, process_group, shard, world
from minreal.compress.core.stats import collect_moments
from minreal.compress.core.width import analyse
from minreal.compress.core.width.importance import wanda_importance
from minreal.compress.methods.cbalanced import group_gramians, select_groups
from minreal.compress.methods.cbalanced.empirical_gramians import collect_gramians
from minreal.compress.methods.factorize.config import FactorizeConfig
from minreal.compress.methods.fde.graph import dead_atoms, plan_groups
from minreal.compress.methods.ssm import SSMClassifier, SSMConfig
from minreal.compress.methods.ssm.method import ssm_compress
from minreal.compress.methods.wanda import activation_norms
from minreal.compress.models import mlp, small_cnn

#: 101 samples in batches of 16: the ranks' shards (50, 51) split into other batches than one process does.
SAMPLES, BATCH = 101, 16


def mlp_case(dtype: torch.dtype) -> tuple[nn.Module, Dataset]:
    """A seeded 12-32-24-5 ReLU MLP and 101 Gaussian inputs, in ``dtype``."""
    torch.manual_seed(1)
    model = mlp(12, [32, 24], 5).to(dtype).eval()
    x = torch.randn(SAMPLES, 12, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return model, Dataset(x.to(dtype))


def linears(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def dead_case() -> tuple[nn.Module, torch.Tensor]:
    """Hidden neuron 0 fires on the last half of the inputs only, neuron 1 never: one process (and a correct
    reduction) finds neuron 1 dead and neuron 0 alive; rank 0's half alone would call neuron 0 dead too."""
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double().eval()
    with torch.no_grad():
        model[0].weight[:2] = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 0]])
        model[0].bias[:2] = torch.tensor([0.0, -1.0])
        model[0].bias[2:] = 10.0  # the others always fire
    x = 0.1 * torch.randn(20, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    x[:, 0] = torch.where(torch.arange(20) < 10, -5.0, 5.0)
    return model, x


def dead_neurons(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    wg = analyse(model, x[:2])
    found = dead_atoms(wg, plan_groups(wg), list(shard(Dataset(x)).inputs(4)))
    return torch.from_numpy(next(iter(found.values())))


def ssm_case() -> tuple[nn.Module, Dataset]:
    torch.manual_seed(8)
    model = SSMClassifier(1, 4, 6, 1, 3).double().eval()
    return model, Dataset(torch.randn(24, 16, 1, generator=torch.Generator().manual_seed(9), dtype=torch.float64))


def run_cases(cache_dir: Path) -> dict[str, torch.Tensor]:
    """Every statistics pass on its tiny case; a flat name → float64 tensor map (same on every rank)."""
    out: dict[str, torch.Tensor] = {}
    for dtype, stats in ((torch.float64, "float64"), (torch.float32, "float32")):
        model, data = mlp_case(dtype)
        for name, st in collect_moments(model, linears(model), data, BATCH, dtype=stats).items():
            out[f"moments.{stats}.{name}.total"] = st.total
            out[f"moments.{stats}.{name}.rows"] = torch.tensor(float(st.rows), dtype=torch.float64)
    model, data = mlp_case(torch.float64)
    layers = linears(model)
    for name, st in collect_moments(model, layers, data, BATCH, dtype="float64", output_side=layers).items():
        out[f"grams.float64.{name}.total"] = st.total
        out[f"grams.float64.{name}.rows"] = torch.tensor(float(st.rows), dtype=torch.float64)
    for p, g in collect_gramians(model, data, batch_size=BATCH).items():
        out[f"gramians.{p}.mean"], out[f"gramians.{p}.gc"], out[f"gramians.{p}.go"] = g.mean, g.gc, g.go
    for l, n in enumerate(activation_norms(extract_chain(model), data.x)):
        out[f"wanda.{l}"] = n
    torch.manual_seed(3)
    cnn = small_cnn(3, (8, 16, 16), 4).double().eval()
    images = torch.randn(10, 3, 12, 12, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    wg = analyse(cnn, images[:2])
    for g, score in wanda_importance(wg, select_groups(wg), images, batch_size=4).items():
        out[f"wanda_graph.{g}"] = score
    for g, s in group_gramians(wg, select_groups(wg), Dataset(images), batch_size=4).items():
        out[f"groups.{g}.gc"], out[f"groups.{g}.go"] = s.gc, s.go
        out[f"groups.{g}.samples"] = torch.tensor([float(s.samples_gc), float(s.samples_go)], dtype=torch.float64)
    out["fde.dead"] = dead_neurons(*dead_case()).double()
    model, data = ssm_case()
    _, report = ssm_compress(model, data, SSMConfig(trunc=0.5, error_samples=len(data)))
    for key, v in report.measured.items():
        if key.endswith(".gain_error"):
            out[f"ssm.{key}"] = torch.tensor(v, dtype=torch.float64)
    model, data = mlp_case(torch.float64)
    compress(model, data, "factorize", FactorizeConfig(cache_dir=str(cache_dir), calib_batch_size=BATCH))
    return out


def main(out: Path) -> None:
    with process_group(backend="gloo", timeout_s=120):
        rank, size = world()  # type: ignore[misc]
        results = run_cases(out / f"cache-rank{rank}")
        results["world_size"] = torch.tensor(float(size), dtype=torch.float64)
        if is_writer():
            torch.save(results, out / "distributed.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
