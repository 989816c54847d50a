"""Statistics under torch.distributed: two gloo ranks (torchrun) give the single-process statistics.

One ``torchrun --nproc-per-node 2`` launch of dist_stats_worker.py (about 10 s) serves the module; the
reference is the same worker's :func:`run_cases` in this process, with no process group.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core import distributed
from minreal.compress.core.data import Dataset
from minreal.compress.core.distributed import (
    DistributedSetupError,
    all_reduce_sum,
    is_writer,
    shard,
    shard_bounds,
    world,
)
from minreal.compress.methods.factorize.config import FactorizeConfig

WORKER = Path(__file__).with_name("dist_stats_worker.py")
EPS32 = torch.finfo(torch.float32).eps


def _load_worker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dist_stats_worker", WORKER)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def worker() -> ModuleType:
    return _load_worker()


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output folder of one two-rank gloo launch."""
    out = tmp_path_factory.mktemp("torchrun")
    env = {k: v for k, v in os.environ.items() if k not in distributed.TORCHRUN_VARS}
    env.update(OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(WORKER), str(out)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def dist_stats(launched: Path) -> dict[str, torch.Tensor]:
    return torch.load(launched / "distributed.pt", weights_only=True)


@pytest.fixture(scope="module")
def single_stats(worker: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], Path]:
    cache = tmp_path_factory.mktemp("single") / "cache"
    return worker.run_cases(cache), cache


# ---- one process: every helper is a no-op -------------------------------------------------------------------------

def test_single_process_helpers_are_no_ops() -> None:
    data = Dataset(torch.randn(5, 3))
    t = torch.ones(4, dtype=torch.float64)
    assert world() is None and is_writer()
    assert shard(data) is data and shard(data.x) is data.x
    assert all_reduce_sum(t) is t and torch.equal(t, torch.ones(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="float64"):
        all_reduce_sum(torch.ones(2))


def test_shards_tile_the_data_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    bounds = []
    for rank in range(3):
        monkeypatch.setattr(distributed, "world", lambda rank=rank: (rank, 3))
        bounds.append(shard_bounds(10))
    assert bounds == [(0, 3), (3, 6), (6, 10)]
    with pytest.raises(DistributedSetupError, match="at least 3 samples"):
        shard_bounds(2)


def test_init_without_torchrun_says_how_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in distributed.TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    assert not distributed.launched_by_torchrun()
    with pytest.raises(DistributedSetupError, match="torchrun --nproc-per-node"):
        distributed.init_from_env()


# ---- two ranks --------------------------------------------------------------------------------------------------

def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("prefix", ["moments.float64.", "grams.float64.", "gramians.", "groups.", "wanda.", "ssm."])
def test_float64_statistics_equal_single_process(prefix: str, dist_stats: dict, single_stats: tuple) -> None:
    """Sums of float64 terms in another order (and float64 activations of other batch shapes): rounding only."""
    ref = {k: v for k, v in single_stats[0].items() if k.startswith(prefix)}
    assert ref and set(ref) == {k for k in dist_stats if k.startswith(prefix)}
    assert int(dist_stats["world_size"]) == 2
    for key, expected in ref.items():
        assert _relative(dist_stats[key], expected) <= 1e-12, key


def test_float32_moments_within_the_rounding_bound(worker: ModuleType, dist_stats: dict, single_stats: tuple) -> None:
    """float32 products XᵀX over a chunk of m rows err by at most γ_m |X|ᵀ|X| (γ_m ≤ m·eps32, Higham 2002 §3.5),
    and a layer input computed through Linear layers of total fan-in K (biases counted) by K·eps32 relative to
    its terms, assuming no cancellation; one process and two ranks split into other chunks, so their totals
    differ by at most 2·(m + K)·eps32·Σ_n |x_n||x_n|ᵀ (plus float64 rounding)."""
    model, data = worker.mlp_case(torch.float32)
    seen: dict[str, torch.Tensor] = {}
    layers = worker.linears(model)
    hooks = [m.register_forward_pre_hook(lambda _m, a, n=n: seen.__setitem__(n, a[0].double().abs()))
             for n, m in layers.items()]
    with torch.no_grad():
        model(data.x)
    for h in hooks:
        h.remove()
    fan_in = 0
    for name, layer in layers.items():
        abs_terms = seen[name].T @ seen[name]
        bound = 2 * (worker.BATCH + fan_in) * EPS32 * abs_terms + 1e-12 * abs_terms.max()
        key = f"moments.float32.{name}"
        diff = (dist_stats[f"{key}.total"][0] - single_stats[0][f"{key}.total"][0]).abs()
        assert bool((diff <= bound).all()), (name, float((diff / bound).max()))
        assert float(dist_stats[f"{key}.rows"]) == single_stats[0][f"{key}.rows"] == worker.SAMPLES
        fan_in += layer.in_features + 1


def test_dead_channels_are_reduced_by_maximum(worker: ModuleType, dist_stats: dict, single_stats: tuple) -> None:
    expected = torch.tensor([0.0, 1.0, 0, 0, 0, 0], dtype=torch.float64)
    assert torch.equal(dist_stats["fde.dead"], expected) and torch.equal(single_stats[0]["fde.dead"], expected)
    model, x = worker.dead_case()
    assert bool(worker.dead_neurons(model, x[:10])[0])  # rank 0's half alone would call neuron 0 dead


def test_only_the_writer_rank_writes_cache_entries(launched: Path) -> None:
    assert not (launched / "cache-rank1").exists()
    assert sorted(p.name for p in launched.iterdir()) == ["cache-rank0", "distributed.pt"]
    assert any((launched / "cache-rank0").glob("*.pt"))


def test_distributed_and_single_process_share_the_cache(launched: Path, worker: ModuleType,
                                                        single_stats: tuple) -> None:
    """Keys hash the whole calibration data, not the shard: both runs name the same entries, and one process
    reads every basis rank 0 wrote."""
    ours = sorted(p.name for p in single_stats[1].glob("*.pt"))
    assert ours == sorted(p.name for p in (launched / "cache-rank0").glob("*.pt"))
    model, data = worker.mlp_case(torch.float64)
    targets = sum(isinstance(m, nn.Linear) for m in model.modules())
    _, report = compress(model, data, "factorize", FactorizeConfig(cache_dir=str(launched / "cache-rank0"),
                                                                   calib_batch_size=worker.BATCH))
    assert 0 < report.predicted["cache_hits"] == len(ours) // 2 <= targets
