"""Does widening an RGB stem to 4 input channels pay in INT8 on this CPU? (``QuantConfig.align_channels``).

MLAS's x86 symmetric int8 convolution takes only input channels on a multiple of 4; a 3-channel stem goes through
im2col and a GEMM instead (``benchmarks/int8_width.json``'s profile: 8 GMAC/s against 74 for ResNet-32's 16→16
convolutions at batch 32). ``minreal.export.qdq_channels`` adds a zero input channel and a ``Pad`` on the (quantised)
input, which changes no output. This benchmark decides the default: the pretrained CIFAR-10 ResNet-32 of
``../shared/data``, exported once, quantised twice with the default ``QuantConfig`` for this CPU (static QDQ, 256
calibration images of the first 7,000), with ``align_channels`` on and off; both files timed with
``minreal.runtime_bench.run_benchmark`` at batch 1 and 32 in ``--processes`` fresh processes, in BOTH orders (on first,
then off first: a position effect in the interleaving cannot pass for a saving), per process the widened file's p50 over
the plain one's (median, min, max, and how many processes it was lower in); the held-out top-1 of both files on the last
2,000 images, and the widened file's largest output difference in units of its output's quantisation step (the integer
sums are the same: at most one step, from requantising).

Needs ``../shared/data``; without it one line and exit status 2. About 3 minutes on 2 cores. Run it alone.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/int8_align.py --out benchmarks/int8_align.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnx
import onnxruntime as ort
from _common import cpu_share, cpu_times, write_json
from int8_formats import CIFAR, RESNET32, cifar_case
from int8_width import environment
from onnx import numpy_helper

from minreal.export.int8 import QuantConfig, quantize_int8
from minreal.export.settings import VariantConfig
from minreal.export.variant import export_variant
from minreal.runtime_bench import BenchConfig, ModelEntry, run_benchmark
from minreal.runtime_bench.timing import ratio_summary

USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/int8_align.py --out benchmarks/int8_align.json"
BATCHES = (1, 32)
HELDOUT = 2000
_T0 = time.perf_counter()


def say(line: str) -> None:
    print(f"[int8_align {time.perf_counter() - _T0:6.1f} s] {line}", file=sys.stderr, flush=True)


def output_step(path: Path) -> float:
    """The quantisation step of the graph output: the scale of the DequantizeLinear that writes it."""
    model = onnx.load(str(path))
    values = {t.name: t for t in model.graph.initializer}
    out = model.graph.output[0].name
    node = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == out)
    return float(numpy_helper.to_array(values[node.input[1]]))


def predict(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def run_order(files: dict[str, Path], order: list[str], processes: int, x: np.ndarray) -> dict[str, Any]:
    """Both files timed in ``processes`` fresh processes, ``order`` first to last: per batch, the widened file's p50
    over the plain one's per process."""
    config = BenchConfig(providers=("cpu",), batch_sizes=BATCHES, repeats=processes)
    report = run_benchmark([ModelEntry(k, files[k]) for k in order], config, x, None, progress=say)
    procs = {(r.model, r.batch_size): list(r.process_p50_ms) for r in report.latency if r.provider == "cpu"}
    out: dict[str, Any] = {"order": order}
    for b in BATCHES:
        s = ratio_summary(procs[("aligned", b)], procs[("plain", b)])
        out[str(b)] = {"median": round(s.median, 4), "min": round(s.min, 4), "max": round(s.max, 4),
                       "lower_in": sum(r < 1 for r in s.per_process), "processes": len(s.per_process),
                       "per_process": [round(r, 4) for r in s.per_process],
                       "p50_ms": {k: [round(v, 4) for v in procs[(k, b)]] for k in ("aligned", "plain")}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/int8_align.json"))
    ap.add_argument("--processes", type=int, default=10)
    args = ap.parse_args()
    if not (RESNET32.is_file() and CIFAR.is_file()):
        print(f"int8_align: {RESNET32} or {CIFAR} is missing (../shared/data); nothing was measured", flush=True)
        sys.exit(2)
    case = cifar_case(HELDOUT)
    start = cpu_times()
    with tempfile.TemporaryDirectory(prefix="int8-align-") as tmp:
        work = Path(tmp)
        fp32 = work / "original.fp32.onnx"
        export_variant(case.model, case.calib, fp32, VariantConfig(), "original", method="none")
        files = {"plain": work / "plain.int8.onnx", "aligned": work / "aligned.int8.onnx"}
        targets = {}
        for name, path in files.items():
            result = quantize_int8(fp32, path, case.calib.numpy(), QuantConfig(align_channels=name == "aligned"))
            targets[name] = result.target
            say(f"{name}: quantised to {result.target}, {result.integer_kernels} integer kernels")
        x = case.x.numpy()
        outputs = {k: predict(p, x) for k, p in files.items()}
        step = output_step(files["aligned"])
        accuracy = {k: round(100 * float((o.argmax(1) == case.y).mean()), 2) for k, o in outputs.items()}
        orders = [run_order(files, ["aligned", "plain"], args.processes, x[:64]),
                  run_order(files, ["plain", "aligned"], args.processes, x[:64])]
    pooled = {str(b): sorted(r for o in orders for r in o[str(b)]["per_process"]) for b in BATCHES}
    summary = {b: {"median": round(float(np.median(v)), 4), "min": v[0], "max": v[-1],
                   "lower_in": sum(r < 1 for r in v), "processes": len(v)} for b, v in pooled.items()}
    verdict = "; ".join(f"batch {b}: {s['median']:.3f}x ({s['min']:.3f}-{s['max']:.3f}), lower in {s['lower_in']} of "
                        f"{s['processes']} processes" for b, s in summary.items())
    doc = {"usage": USAGE, "model": "pretrained CIFAR-10 ResNet-32 (../shared/data), 3-channel stem",
           "environment": environment(BenchConfig().threads()), "targets": targets, "heldout_samples": len(case.y),
           "heldout_top1": accuracy,
           "max_output_difference_steps": round(float(np.abs(outputs["aligned"] - outputs["plain"]).max() / step), 3),
           "orders": orders, "summary": summary, "cpu_share": cpu_share(start, cpu_times()),
           "verdict": f"widened stem's INT8 p50 over the plain file's, both orders pooled: {verdict}",
           "wall_s": round(time.perf_counter() - _T0, 1)}
    write_json(args.out, doc)
    print(doc["verdict"])


if __name__ == "__main__":
    main()
