"""Benchmark 3 (issue 3): ONNX Runtime CPU latency ratio vs MAC ratio for factorised resnet18.

resnet18 (random weights, 224×224) factorised at several FLOP budgets with and without --rank-multiple 16,
exported with the TorchScript exporter, timed against the original with runtime_bench's interleaved timing
loop at batch 1 and 32. Writes benchmarks/factorize_latency.json.
Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/factorize_latency.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from statistics import median

import numpy as np
import torch
import torchvision
from _common import write_json

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.methods.factorize import FactorizeConfig
from minreal.runtime_bench.sessions import create_session
from minreal.runtime_bench.timing import time_interleaved

OUT = Path(__file__).with_suffix(".json")
THREADS = 2


def _export(model: torch.nn.Module, path: Path) -> None:
    torch.onnx.export(model, (torch.randn(2, 3, 224, 224),), str(path), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


def _p50(paths: list[Path], batch: int) -> list[float]:
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    sessions = [create_session(p, "CPUExecutionProvider", THREADS) for p in paths]
    fns = [lambda s=s: s.run(None, {"input": x}) for s in sessions]
    lat = time_interleaved(fns, warmup=2, min_runs=5 if batch > 1 else 20, min_seconds=2.0)
    return [median(v) for v in lat]


def main() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    calib = Dataset(torch.randn(64, 3, 224, 224, generator=torch.Generator().manual_seed(0)))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _export(model, tmp / "original.onnx")
        variants = []
        for flops in (0.7, 0.5):
            for multiple in (1, 16):
                new, rep = compress(model, calib, "factorize", FactorizeConfig(
                    layer_mac_ratio=flops, rank_multiple=multiple, cache_dir=str(tmp / "cache"), stats_dtype="float32"))
                path = tmp / f"f{flops}_m{multiple}.onnx"
                _export(new, path)
                variants.append((flops, multiple, rep, path))
        for batch in (1, 32):
            p50 = _p50([tmp / "original.onnx"] + [v[3] for v in variants], batch)
            for (flops, multiple, rep, _), ms in zip(variants, p50[1:]):
                rows.append({"flops": flops, "rank_multiple": multiple, "batch": batch,
                             "whole_model_mac_ratio": rep.mac_ratio,
                             "factorizable_mac_ratio": rep.predicted["factorizable_mac_ratio"],
                             "latency_ms": ms, "original_ms": p50[0], "latency_ratio": ms / p50[0],
                             "latency_over_mac_ratio": (ms / p50[0]) / rep.mac_ratio})
                print(rows[-1], flush=True)
    write_json(OUT, {"model": "torchvision resnet18 (random weights), 224x224, calib 64 images",
                     "provider": "CPUExecutionProvider", "intra_op_threads": THREADS,
                     "cpu_count": os.cpu_count(), "load_avg_1min": os.getloadavg()[0], "rows": rows})


if __name__ == "__main__":
    main()
