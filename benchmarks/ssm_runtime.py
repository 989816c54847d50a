"""ONNX Runtime CPU latency of reduced/original SSM classifiers at truncation 50–90%, lengths 64 and 1024.

The model is a seeded, untrained SSMClassifier (latency does not depend on the weights' values; the
orders come from the explicit truncation ratio). Both models are exported with a dynamic sequence axis
and timed with runtime_bench's one timing loop (interleaved, warm-up discarded).
Writes benchmarks/ssm_runtime.json and benchmarks/ssm_runtime.png.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/ssm_runtime.py
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import onnxruntime as ort
import torch
from _common import pyplot, save_figure, write_json

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.methods.ssm import (
    SSMClassifier,
    SSMConfig,
)
from minreal.export.onnx_export import to_onnx
from minreal.runtime_bench.timing import time_interleaved

TRUNCS = (0.5, 0.6, 0.7, 0.8, 0.9)
LENGTHS = (64, 1024)
PAPER_GPU_RATIO = {0.5: 0.66, 0.6: 0.57, 0.7: 0.51, 0.8: 0.45, 0.9: 0.40}


def _session(path: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def export_models(model: torch.nn.Module, calib: Dataset, workdir: Path) -> dict[str, Path]:
    paths = {"original": workdir / "original.onnx"}
    to_onnx(model, calib.x[:2], paths["original"], dynamic_dims={1: "seq"})
    for trunc in TRUNCS:
        reduced, _ = compress(model, calib, "ssm", SSMConfig(trunc=trunc))
        paths[str(trunc)] = workdir / f"reduced_{trunc}.onnx"
        to_onnx(reduced, calib.x[:2], paths[str(trunc)], dynamic_dims={1: "seq"})
    return paths


def time_models(paths: dict[str, Path], batch: int, length: int, threads: int, min_seconds: float) -> dict:
    sessions = {k: _session(p, threads) for k, p in paths.items()}
    x = np.random.default_rng(0).standard_normal((batch, length, 1)).astype(np.float32)
    fns = [lambda s=s: s.run(None, {s.get_inputs()[0].name: x}) for s in sessions.values()]
    lat = time_interleaved(fns, warmup=3, min_runs=10, min_seconds=min_seconds)
    med = {k: float(np.median(v)) for k, v in zip(sessions, lat)}
    return {"median_ms": med, "runs": len(lat[0]),
            "ratio_reduced_over_original": {k: med[k] / med["original"] for k in med if k != "original"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/ssm_runtime.json")
    ap.add_argument("--plot", default="benchmarks/ssm_runtime.png")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-seconds", type=float, default=3.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    spec = {"features": 64, "state": 128, "depth": 2}
    model = SSMClassifier(1, spec["features"], spec["state"], spec["depth"], 10).eval()
    calib = Dataset(torch.randn(32, 64, 1))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = export_models(model, calib, Path(tmp))
        for length in LENGTHS:
            results[str(length)] = time_models(paths, args.batch, length, args.threads, args.min_seconds)
            print(length, {k: round(v, 3) for k, v in results[str(length)]["ratio_reduced_over_original"].items()},
                  flush=True)
    meta = {"model": spec, "batch": args.batch, "intra_op_threads": args.threads, "ort": ort.__version__,
            "paper_gpu_ratio": PAPER_GPU_RATIO,
            "form": "causal grouped conv1d with in-graph modal kernel (O(L²·r) per layer)"}
    write_json(args.out, {"meta": meta, "results": results})
    fig, ax = pyplot().subplots(figsize=(5, 3.6))
    for length, res in results.items():
        r = res["ratio_reduced_over_original"]
        ax.plot([float(k) for k in r], list(r.values()), "o-", label=f"ORT CPU, L={length}")
    ax.plot(list(PAPER_GPU_RATIO), list(PAPER_GPU_RATIO.values()), "k--", label="paper (GPU)")
    ax.set(xlabel="truncation ratio", ylabel="latency reduced / original", title="SSM runtime ratio")
    ax.legend(fontsize=7)
    save_figure(fig, args.plot)


if __name__ == "__main__":
    main()
