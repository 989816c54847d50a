"""C-balanced realisation in the paper's MNIST setting, reproduced on the offline digits data.

A seeded 4×256 SiLU MLP is trained on digits, ranked by the three Gramian tests and realised at its C widths
(warm start + distillation, with the scratch / warm / uniform-width controls). Baselines on the same data:
unstructured magnitude pruning 50%, structured pruning to the C ranks (magnitude-selected neurons) without
and with fine-tuning, truncated SVD at rank fraction 0.5, ONNX Runtime dynamic INT8, a linear classifier.
Also times the Gramians for a 784-input 4×256 MLP on 2,000 samples and a [2048,1024,1024,512] MLP on 1,000.

Run: ``OMP_WAIT_POLICY=PASSIVE python benchmarks/cbalanced_digits.py [--out benchmarks]``.
Writes ``cbalanced_digits.json``, ``cbalanced_digits_spectra.png`` and ``cbalanced_digits_table.png``.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F
from _common import pyplot, save_figure, write_json
from onnxruntime.quantization import QuantType, quantize_dynamic
from torch import nn
from torch.nn.utils import prune

from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.datasets import digits
from minreal.compress.methods.cbalanced import CBalancedConfig, analyse_states, realise
from minreal.compress.methods.cbalanced.empirical_gramians import collect_gramians, collect_states, default_state_points
from minreal.compress.methods.svd import SVDConfig
from minreal.compress.models import mlp
from minreal.compress.registry import compress
from minreal.export.onnx_export import to_onnx
from minreal.runtime_bench.sessions import create_session
from minreal.runtime_bench.timing import latency_stats, time_interleaved

PAPER = {"mnist": {"states": [1024, 277], "ranks_c": [114, 90, 63, 10], "params": [400906, 106323],
                   "accuracy": [0.9660, 0.9545]},
         "cifar10": {"params": [9.97e6, 1.69e6], "accuracy": [0.5445, 0.5444], "speedup": 3.0}}
EPOCHS = 60


def _fit(model: nn.Module, train_set: Dataset, val: Dataset, teacher: nn.Module | None = None) -> nn.Module:
    train(model, train_set, val, TrainConfig(epochs=EPOCHS, lr=2e-3, patience=12, seed=0), teacher)
    return model.eval()


def _state_order(model: nn.Module, x: torch.Tensor) -> int:
    """Σ widths of the hidden activations (0 for a network without any)."""
    try:
        points = default_state_points(model)
    except CompressionError:
        return 0
    return sum(h.shape[1] for h in collect_states(model, Dataset(x[:1]), points).values())


def _torch_metrics(model: nn.Module, test: Dataset) -> dict:
    with torch.no_grad():
        out = model(test.x).double()
    nonzero = sum(int((p != 0).sum()) for p in model.parameters())
    return {"accuracy": float((out.argmax(1) == test.y).double().mean()),
            "cross_entropy": float(F.cross_entropy(out, test.y)), "state_order": _state_order(model, test.x),
            "params": sum(p.numel() for p in model.parameters()), "nonzero_params": nonzero}


def _ort_metrics(path: Path, test: Dataset) -> dict:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: test.x.numpy()})[0]).double()
    return {"accuracy": float((out.argmax(1) == test.y).double().mean()),
            "cross_entropy": float(F.cross_entropy(out, test.y)), "onnx_bytes": path.stat().st_size}


def _latencies(paths: dict[str, Path], x: np.ndarray, batch: int) -> dict[str, float]:
    """p50 ms per model at ``batch`` rows, one intra-op thread, timed interleaved by the project's one loop."""
    sessions = {k: create_session(p, "CPUExecutionProvider", 1) for k, p in paths.items()}
    feeds = {k: {s.get_inputs()[0].name: x[:batch]} for k, s in sessions.items()}
    fns = [lambda s=s, f=feeds[k]: s.run(None, f) for k, s in sessions.items()]
    runs = time_interleaved(fns, warmup=20, min_runs=200, min_seconds=1.0)
    return {k: latency_stats(r, batch).p50_ms for k, r in zip(sessions, runs)}


def _magnitude_50(model: nn.Module) -> nn.Module:
    """Unstructured magnitude pruning: zero the 50% smallest |w| of every Linear weight (dense latency unchanged)."""
    pruned = copy.deepcopy(model)
    for m in pruned.modules():
        if isinstance(m, nn.Linear):
            prune.l1_unstructured(m, "weight", amount=0.5)
            prune.remove(m, "weight")
    return pruned.eval()


def _linear_classifier(train_set: Dataset, val: Dataset) -> nn.Module:
    torch.manual_seed(0)
    return _fit(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), train_set, val)


def _models(model: nn.Module, train_set: Dataset, val: Dataset) -> tuple[dict[str, nn.Module], dict]:
    """All compared torch models and the cbalanced report (as a dict)."""
    cfg = CBalancedConfig(controls=True)
    recovery = RecoveryConfig(epochs=EPOCHS, lr=2e-3, patience=12, seed=0)  # the run's shared --recover-* knobs
    realised, rep = compress(model, train_set, "cbalanced", cfg, recovery)
    analyses = analyse_states(collect_gramians(model, train_set.take(cfg.gramian_samples)), cfg.energy_eps)
    widths = {layer.name: layer.rank for layer in rep.layers}
    structured = realise(model, analyses, widths, "warm", selection="magnitude", refit=False)
    svd, _ = compress(model, train_set, "svd", SVDConfig(rank_fraction=0.5))
    at_paper, rep_paper = compress(model, train_set, "cbalanced", CBalancedConfig(
        state_budget=PAPER["mnist"]["states"][1], controls=True), recovery)
    models = {"original": model, "cbalanced (warm+distill)": realised,
              "cbalanced @ paper's 277 states": at_paper,
              "magnitude 50% (unstructured)": _magnitude_50(model),
              "structured to C ranks": structured,
              "structured to C ranks + fine-tune": _fit(copy.deepcopy(structured), train_set, val),
              "svd rank 0.5": svd.eval(), "linear classifier": _linear_classifier(train_set, val)}
    return models, {"predicted": rep.predicted, "measured": rep.measured, "timings_s": rep.timings_s,
                    "recovery": rep.recovery,
                    "params_before": rep.params_before, "params_after": rep.params_after,
                    "layers": [{"name": l.name, "rank_a": l.details["rank_a"], "rank_b": l.details["rank_b"],
                                "rank_c": l.details["rank_c"], "spectra": rep.spectra[l.name]} for l in rep.layers],
                    "at_paper_state_order": {"ranks_c": rep_paper.predicted["ranks_c"],
                                             "params_after": rep_paper.params_after,
                                             "variants": rep_paper.measured["variants"],
                                             "recovery": rep_paper.recovery}}


def _table(models: dict[str, nn.Module], test: Dataset, workdir: Path) -> list[dict]:
    rows, paths = [], {}
    for name, m in models.items():
        paths[name] = workdir / f"{len(paths)}.onnx"
        to_onnx(m, test.x[:2], paths[name])
        rows.append({"model": name, **_torch_metrics(m, test)})
    int8 = workdir / "int8.onnx"
    quantize_dynamic(str(paths["original"]), str(int8), weight_type=QuantType.QInt8)
    rows.append({"model": "original ORT dynamic INT8", **_ort_metrics(int8, test), "state_order": 1024,
                 "params": rows[0]["params"]})
    paths["original ORT dynamic INT8"] = int8
    x = test.x.numpy()
    for batch in (1, 256):
        lat = _latencies(paths, x, batch)
        for r in rows:
            r[f"ort_p50_ms_b{batch}"] = lat[r["model"]]
    full = rows[0]
    for r in rows:
        r["state_compression"] = 1 - r["state_order"] / full["state_order"]
        r["param_ratio"] = r["params"] / full["params"]
        r["latency_ratio_b256"] = r["ort_p50_ms_b256"] / full["ort_p50_ms_b256"]
    return rows


def gramian_timing() -> list[dict]:
    """Wall time of Gc + exact Go (10 outputs) and of the A/B/C analysis, random data, 2 intra-op threads."""
    out = []
    for widths, n, d_in in (([256] * 4, 2000, 784), ([2048, 1024, 1024, 512], 1000, 3072)):
        torch.manual_seed(0)
        model = mlp(d_in, widths, 10, "silu").eval()
        data = Dataset(torch.rand(n, d_in))
        t0 = time.perf_counter()
        grams = collect_gramians(model, data)
        t1 = time.perf_counter()
        analyse_states(grams, 1e-4)
        out.append({"widths": widths, "inputs": d_in, "samples": n, "gramians_s": t1 - t0,
                    "analysis_s": time.perf_counter() - t1, "threads": torch.get_num_threads()})
    return out


def plot(result: dict, out: Path) -> None:
    plt = pyplot()
    layers = result["cbalanced"]["layers"]
    fig, axes = plt.subplots(1, len(layers), figsize=(4 * len(layers), 3.2), squeeze=False)
    for ax, layer in zip(axes[0], layers):
        for test, colour in zip("ABC", ("tab:blue", "tab:orange", "tab:green")):
            lam = np.asarray(layer["spectra"][test])
            ax.semilogy(np.arange(1, len(lam) + 1), lam / lam[0], colour,
                        label=f"{test} (r={layer[f'rank_{test.lower()}']})")
        ax.set_title(f"state {layer['name']}")
        ax.set_xlabel("index")
        ax.set_ylim(1e-12, 2)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("eigenvalue / largest")
    save_figure(fig, out / "cbalanced_digits_spectra.png", dpi=110)
    rows = result["table"]
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in rows:
        ax.scatter(r["params"], r["accuracy"], label=r["model"])
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, out / "cbalanced_digits_table.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    torch.set_num_threads(2)
    data, test = digits(as_images=False)
    train_set, val = data.split(0.15, seed=1)
    torch.manual_seed(0)
    model = _fit(mlp(64, [256] * 4, 10, "silu"), train_set, val)
    t0 = time.perf_counter()
    models, rep = _models(model, data, val)
    with tempfile.TemporaryDirectory() as tmp:
        table = _table(models, test, Path(tmp))
    result = {"setting": "digits (8x8, 64 inputs), 4x256 SiLU MLP; test split 25%", "paper": PAPER,
              "cbalanced": rep, "table": table, "gramian_timing": gramian_timing(),
              "total_s": time.perf_counter() - t0, "torch": torch.__version__, "onnxruntime": ort.__version__}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "cbalanced_digits.json", result)
    plot(result, args.out)
    for r in table:
        print(f"{r['model']:<36} acc {r['accuracy']:.4f} ce {r['cross_entropy']:.3f} states {r['state_order']:>5} "
              f"params {r['params']:>7} b1 {r['ort_p50_ms_b1']:.3f}ms b256 {r['ort_p50_ms_b256']:.3f}ms")
    print(json.dumps(result["gramian_timing"], indent=1))


if __name__ == "__main__":
    main()
