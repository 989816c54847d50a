"""Issue 18 item 4: is static INT8 of a balanced-truncated SSM classifier still slower than its fp32 file on CPU?

The demo's model (SSMClassifier, 24 features, 32 states, 2 layers, trained 12 epochs on sequential digits with the
Hankel regulariser; trained here, no downloaded weights) and its balanced truncation at 70 % of the states. Each is
exported with a dynamic sequence axis and quantised twice by quantize_int8: with the Q/DQ placement as ONNX
Runtime's quantiser writes it (``drop_roundtrips=False``: Pad, the computed-kernel Conv/ConvTranspose of the
chunked convolution and the ops around them run in float between a dequantise and a re-quantise) and with the
default, which leaves those nodes in float and quantises again. All six files are timed with runtime_bench's
protocol: interleaved, warm-up discarded, 5 fresh processes per batch size on the CPU provider, one intra-op
thread; ratios per process (median, min, max). Accuracy on the held-out split.

Writes benchmarks/ssm_int8.json atomically.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/ssm_int8.py [--out PATH] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from _common import write_json

from minreal.compress import compress
from minreal.compress.datasets import sequential_digits
from minreal.compress.methods.ssm import SSMConfig, SSMTrainSpec, train_ssm_classifier
from minreal.export.int8 import QuantConfig, quantize_int8
from minreal.export.onnx_export import to_onnx
from minreal.runtime_bench import BenchConfig, ModelEntry, run_benchmark


def _models(folder: Path) -> tuple[list[ModelEntry], dict, torch.Tensor, torch.Tensor]:
    """Train, reduce, export and quantise (both placements); the entries (original fp32 first) and INT8 records."""
    train, test = sequential_digits(seed=0)
    fit, val = train.split(0.15, seed=0)
    torch.manual_seed(0)
    model, _ = train_ssm_classifier(fit, val, SSMTrainSpec(epochs=12))
    reduced, _ = compress(model, fit, "ssm", SSMConfig(trunc=0.7))
    entries, records, calib = [], {}, fit.x[:256].numpy()
    for name, module in (("original", model), ("ssm trunc 70%", reduced)):
        fp32 = folder / f"{name.replace(' ', '_').replace('%', '')}.onnx"
        to_onnx(module.eval(), fit.x[:2], fp32, dynamic_dims={1: "seq"})
        entries.append(ModelEntry(name, fp32))
        for label, drop in ((".int8 (ORT placement)", False), (".int8", True)):
            out = fp32.with_name(fp32.stem + ("" if drop else "_ortqdq") + ".int8.onnx")
            result = quantize_int8(fp32, out, calib, QuantConfig(drop_roundtrips=drop))
            entries.append(ModelEntry(name + label, out))
            records[name + label] = {"float_roundtrips": result.float_roundtrips,
                                     "roundtrip_nodes": result.roundtrip_nodes,
                                     "integer_kernels": result.integer_kernels}
    return entries, records, test.x, test.y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/ssm_int8.json")
    ap.add_argument("--repeats", type=int, default=5, help="fresh processes per batch size")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        entries, records, x, y = _models(Path(tmp))
        config = replace(BenchConfig(), batch_sizes=(1, 8), repeats=args.repeats, intra_op_threads=1)
        report = run_benchmark(entries, config, x.numpy(), y.numpy(), progress=print)
    latency = {f"{r.model} b{r.batch_size}": {"p50_ms": r.stats.p50_ms, "process_p50_ms": r.process_p50_ms}
               for r in report.latency}
    ratios = {f"{r.model} b{r.batch_size}": {"median": r.median, "min": r.min, "max": r.max,
                                             "per_process": r.per_process} for r in report.ratios}
    int8_vs_fp32 = {}
    for fp32 in ("original", "ssm trunc 70%"):
        for b in config.batch_sizes:
            ref = latency[f"{fp32} b{b}"]["process_p50_ms"]
            for label in (".int8 (ORT placement)", ".int8"):
                own = latency[f"{fp32}{label} b{b}"]["process_p50_ms"]
                per = [m / r for m, r in zip(own, ref)]
                int8_vs_fp32[f"{fp32}{label} b{b}"] = {"median": statistics.median(per), "min": min(per),
                                                       "max": max(per), "per_process": per}
    write_json(args.out, {
        "meta": {"repeats": args.repeats, "batch_sizes": config.batch_sizes, "provider": "cpu", "threads": 1,
                 "environment": asdict(report.environment)},
        "accuracy": {m.model: m.accuracy for m in report.metrics},
        "quantization": records, "latency": latency, "ratio_vs_original_fp32": ratios,
        "int8_over_own_fp32": int8_vs_fp32})
    for k, v in int8_vs_fp32.items():
        print(f"{k}: INT8 / its fp32 = {v['median']:.3f} [{v['min']:.3f}, {v['max']:.3f}]")


if __name__ == "__main__":
    main()
