"""Files for an edge device (issue 30): per model, the fp32 file and its INT8 files in the x86 format
(``--quant-target cpu``, resolved for this CPU) and the ARM64 format (``arm64``), each as ``.onnx`` and as ONNX
Runtime's ORT format (``.ort``, what its minimal build loads), with their bytes, parity, accuracy and CPU latency, and
what a size-constrained `minreal tune` chooses at 1 pp.

Models (``--only``, default all, in this order):
- ``cnn``: ``minreal demo``'s digits CNN (``small_cnn(1, (32, 64, 64), 10)`` on 8x8 digits, trained as the demo
  trains it; ``benchmarks/tune.py``'s ``cnn_case``);
- ``ssm``: the ``ssm`` method's demo model (an SSMClassifier on sequential digits; ``benchmarks/real_models.py``'s
  ``ssm_case``);
- ``resnet32``: the pretrained CIFAR-10 ResNet-32 of ``../shared/data`` on real CIFAR-10 test images (the first 7,000
  for calibration, the last 2,000 held out; ``benchmarks/tune.py``'s ``pretrained_cifar_case``).

Files, per model (``minreal.export``, as ``minreal export`` writes them): ``fp32.onnx`` (``export_variant``: dynamic
batch, simplified, checked against torch); ``int8_cpu.onnx`` and ``int8_arm64.onnx`` (``quantize_variant``: static
QDQ calibrated on the calibration data, in the resolved ``cpu`` format and in ``arm64``'s); each converted to
``.ort`` with its ``.required_operators.config`` (``ort_variant``: the default converter settings, each file for the
platform of its INT8 target: ``arm`` for arm64, no platform (``any``) for fp32 and ``cpu``); and ``fp32_amd64.ort``, the
fp32 file converted for ``--ort-platform amd64`` (x86's NCHWc layouts, opt-in: they tie the file to this CPU's block).
Per file: bytes on disk and gzip-compressed bytes (``minreal.runtime_bench.model_info``); parity (``fp32.onnx`` and
``fp32.ort`` against torch, ``fp32_amd64.ort`` against ``fp32.onnx``, each INT8 ``.ort`` against its ``.onnx``, at the
export's parity batch sizes; the arm64 ``.ort`` file against its ``.onnx`` run in ONNX Runtime's ARM graph); held-out
accuracy and top-1 agreement with ``fp32.onnx`` in ONNX Runtime (the INT8 files' accuracy next to fp32's).

Latency: ``minreal.runtime_bench.run_benchmark`` on the CPU provider at batch 1: all seven files interleaved in each of
``--processes`` fresh processes (default 5; the project's default intra-op threads), pooled p50 per file and, per
``.onnx``/``.ort`` pair (``fp32_amd64.ort`` against ``fp32.onnx``), the ``.ort`` file's p50 over the ``.onnx`` file's
in each process (median, min, max). The arm64 files run here on x86 in the graph ONNX Runtime builds for ARM (int8
fusions; minreal's sessions do that for every file whose metadata names the arm64 target): their accuracy is ARM's,
their latency here says nothing about an ARM device's.

Tune: ``minreal tune MODEL --max-accuracy-drop 1 --max-size KB --format onnx,ort --batch 1`` run as a command (a fresh
process, its candidate cache under ``--work``), KB half the fp32 ``.onnx`` file; the chosen file, its bytes and
``chosen.ort``, and the verdict. ``--quick``: svd only at 0.8 and 0.5, short protocols.

Without ``../shared/data`` (a user's clone), when a selected model needs it, the script prints one line and exits with
status 2: nothing was measured. The JSON is rewritten atomically after every model. Files and tunes go to ``--work``
(ignored by git). ``--quick`` is a smoke test (3 processes, 0.1 s timing windows, 300 held-out rows for the
benchmark's own measurements, the short tune) and needs its own ``--out``. Run it alone: the load average is recorded
per model.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/edge.py --out benchmarks/edge.json
    [--only cnn,ssm,resnet32] [--processes 5] [--min-seconds 2] [--work DIR] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models as rm  # benchmarks/ is on sys.path (above): sibling scripts
import tune as tb

USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/edge.py --out benchmarks/edge.json"
DEFAULT_OUT = tb.ROOT / "benchmarks" / "edge.json"
TARGETS = ("cpu", "arm64")
"""INT8 formats: ``--quant-target cpu`` (resolved for this CPU) and ``arm64``."""
FORMATS = ("onnx", "ort")
AMD64_STEM = "fp32_amd64"
"""``fp32_amd64.ort``: the fp32 file converted for ``--ort-platform amd64`` (x86's NCHWc layouts, with this CPU's block
baked in), against ``fp32.ort`` converted for no platform (the default on x86)."""
DROP_PP = 1.0
SIZE_SHARE = 0.5
"""The tune's ``--max-size``: this share of the fp32 ``.onnx`` file."""
QUICK_HELDOUT = 300
_T0 = time.perf_counter()


@dataclasses.dataclass(frozen=True)
class Model:
    """A model of the benchmark: its title, its :class:`tune.Case` (files written once under the work folder) and
    the files it needs from ``../shared/data``."""

    title: str
    case: Callable[[Path], tb.Case]
    needs: tuple[Path, ...] = ()


MODELS: dict[str, Model] = {
    "cnn": Model("digits CNN (demo)", tb.cnn_case),
    "ssm": Model(rm.MODELS["ssm"].title, rm.ssm_case),
    "resnet32": Model(rm.MODELS["resnet32"].title, partial(tb.pretrained_cifar_case, "resnet32"),
                      rm.MODELS["resnet32"].needs)}


def say(line: str) -> None:
    """A progress line on stderr, with the seconds since the script started."""
    print(f"[edge {time.perf_counter() - _T0:7.1f} s] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------- files
def size_record(path: Path) -> dict[str, int]:
    """Bytes on disk and gzip-compressed bytes of a model file with its external data."""
    from minreal.runtime_bench.model_info import gzip_bytes, model_files

    files = model_files(path)
    return {"bytes": sum(f.stat().st_size for f in files), "gzip_bytes": gzip_bytes(files)}


def parity_record(parity: Mapping[str, Any], against: str) -> dict[str, Any]:
    """What the JSON keeps of a parity check (``reference_graph``: arm where the source ran in ONNX Runtime's ARM
    graph, for an ``.ort`` file converted for the arm platform)."""
    graph = {"reference_graph": parity["reference_graph"]} if parity.get("reference_graph") else {}
    return {"against": against, "passed": parity["passed"], "max_abs_err": parity["max_abs_err"],
            "batch_sizes": parity["batch_sizes"], **graph}


def write_fp32(net: Any, held: Any, folder: Path) -> tuple[Any, dict[str, dict[str, Any]]]:
    """``fp32.onnx`` and ``fp32.ort``, both checked against torch: the export's record and the files' records."""
    from minreal.export.ort_format import convert_to_ort, ort_variant
    from minreal.export.settings import OrtConfig, VariantConfig
    from minreal.export.variant import export_variant, parity_inputs
    from minreal.export.verify import feeds_of, verify_files

    record = export_variant(net, held.x, folder / "fp32.onnx", VariantConfig(), "fp32")
    ort = ort_variant(record, folder, held.x, VariantConfig(), OrtConfig(), net)
    amd64 = convert_to_ort(folder / "fp32.onnx", folder / f"{AMD64_STEM}.ort", OrtConfig(target_platform="amd64"))
    parity = verify_files(folder / "fp32.onnx", amd64.path, [feeds_of(x) for x in parity_inputs(held.x, None)])
    return record, {"fp32.onnx": {"parity": parity_record(record.parity, "torch")},
                    "fp32.ort": {"parity": parity_record(ort["parity"], "torch"), "operators": len(ort["operators"]),
                                 "target_platform": ort["target_platform"]},
                    f"{AMD64_STEM}.ort": {"parity": parity_record(dataclasses.asdict(parity), "fp32.onnx"),
                                          "operators": len(amd64.operators), "target_platform": "amd64"}}


def write_int8(record: Any, calib: Any, held: Any, folder: Path, target: str) -> dict[str, dict[str, Any]]:
    """``int8_TARGET.onnx`` (static QDQ in ``target``'s format) and its ``.ort`` file, checked against it."""
    from minreal.export.int8 import resolve_target
    from minreal.export.ort_format import ort_variant
    from minreal.export.settings import OrtConfig, VariantConfig
    from minreal.export.variant import quantize_variant

    cfg = VariantConfig(quant_target=resolve_target(target))
    q = quantize_variant(record, folder, calib.x, cfg)
    name = f"int8_{target}"
    (folder / q.onnx).replace(folder / f"{name}.onnx")
    q = dataclasses.replace(q, label=name, onnx=f"{name}.onnx")
    ort = ort_variant(q, folder, held.x, cfg, OrtConfig())
    fmt = {k: q.quantization.get(k) for k in ("target", "activation_type", "activation_symmetric", "weight_type")}
    return {f"{name}.onnx": {"format": fmt},
            f"{name}.ort": {"parity": parity_record(ort["parity"], f"{name}.onnx"), "operators": len(ort["operators"]),
                            "target_platform": ort["target_platform"]}}


def write_files(net: Any, calib: Any, held: Any, folder: Path) -> dict[str, dict[str, Any]]:
    """Every file of one model with its size and parity records, by file name."""
    say(f"{folder.parent.name}: exporting fp32, INT8 ({', '.join(TARGETS)}) and their .ort copies")
    record, files = write_fp32(net, held, folder)
    for target in TARGETS:
        files.update(write_int8(record, calib, held, folder, target))
    return {name: {**size_record(folder / name), **rec} for name, rec in files.items()}


# -------------------------------------------------------------------------------------------------------- latency
def bench_config(args: argparse.Namespace) -> Any:
    """runtime_bench's protocol at batch 1 with ``--processes`` and ``--min-seconds``; shorter with ``--quick``."""
    from minreal.runtime_bench import BenchConfig

    config = BenchConfig(providers=("cpu",), batch_sizes=(1,), repeats=args.processes, min_seconds=args.min_seconds)
    return dataclasses.replace(config, warmup=2, min_runs=10) if args.quick else config


def time_files(folder: Path, names: Sequence[str], held: Any, config: Any) -> dict[str, dict[str, Any]]:
    """Every file timed at batch 1 in fresh processes (``fp32.onnx`` first: the agreement reference), with its
    held-out accuracy and agreement with ``fp32.onnx``."""
    from minreal.export.verify import feeds_of
    from minreal.runtime_bench import ModelEntry, run_benchmark

    y = None if held.y is None else held.y.numpy()
    report = run_benchmark([ModelEntry(n, folder / n) for n in names], config, feeds_of(held.x), y,
                           progress=lambda line: say(f"{folder.parent.name}: {line}"))
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    for m in report.metrics:
        acc = None if m.accuracy is None else round(100 * m.accuracy, 2)
        out[m.model] |= {"accuracy_pct": acc, "agreement_with_fp32": m.top1_agreement}
    for r in report.latency:
        out[r.model]["latency_b1"] = {"p50_ms": round(r.stats.p50_ms, 4),
                                      "process_p50_ms": [round(v, 4) for v in r.process_p50_ms]}
    return out


def ort_vs_onnx(files: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per file stem, the ``.ort`` file's p50 over the ``.onnx`` file's in each process: median, min, max."""
    from minreal.runtime_bench.timing import ratio_summary

    out = {}
    for stem in sorted({n.rsplit(".", 1)[0] for n in files}):
        source = "fp32" if stem == AMD64_STEM else stem
        onnx, ort = (files[f"{s}.{ext}"]["latency_b1"]["process_p50_ms"] for s, ext in zip((source, stem), FORMATS))
        s = ratio_summary(ort, onnx)
        out[stem] = {"median": round(s.median, 3), "min": round(s.min, 3), "max": round(s.max, 3),
                     "processes": len(onnx)}
    return out


# ------------------------------------------------------------------------------------------------------------ tune
def tune_command(case: tb.Case, max_kb: float, folder: Path, cache: Path, quick: bool) -> list[str]:
    """`minreal tune` with the accuracy and size budgets and ``--format onnx,ort``, as a user types it."""
    cmd = ["minreal", "tune", case.model, "--weights", case.weights, "--data", case.data,
           *(["--eval-data", case.eval_data] if case.eval_data else []), "--max-accuracy-drop", f"{DROP_PP:g}",
           "--max-size", f"{max_kb:.1f}", "--format", "onnx,ort", "--batch", "1", "--out", str(folder), "--overwrite",
           "--cache-dir", str(cache)]
    if quick:
        cmd += ["-m", "svd", "--grid", "0.8,0.5", "--screen-seconds", "0.05", "--min-seconds", "0.1", "--repeats", "1"]
    return cmd


def run_tune(case: tb.Case, max_kb: float, work: Path, quick: bool) -> dict[str, Any]:
    """The size-constrained tune in a fresh process; its choice from the tune folder's report.json."""
    folder, cache = work / case.name / "tune", work / "cache" / case.name
    cmd = tune_command(case, max_kb, folder, cache, quick)
    say(f"{case.name}: {' '.join(cmd)}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(folder.parent / "tune.log", "w") as log:
        done = subprocess.run([sys.executable, "-m", "minreal", *cmd[1:]], stdout=log, stderr=subprocess.STDOUT,
                              cwd=tb.ROOT)
    record: dict[str, Any] = {"cli": " ".join(cmd), "max_size_kb": round(max_kb, 1), "exit_code": done.returncode,
                              "wall_s": round(time.perf_counter() - started, 1), "log": str(folder.parent / "tune.log")}
    # exit 1 with a report: no file met the limits, not even the original's (tune_choice records that verdict)
    if done.returncode != 0 and not (done.returncode == 1 and (folder / "report.json").is_file()):
        lines = (folder.parent / "tune.log").read_text().strip().splitlines()
        return record | {"error": lines[-1] if lines else "no output"}
    return record | tune_choice(json.loads((folder / "report.json").read_text()))


def tune_choice(report: Mapping[str, Any]) -> dict[str, Any]:
    """The chosen file (label, precision, method, bytes, accuracy drop) and its ``.ort`` copy, and the verdict."""
    rows = {c["label"]: c for c in report["candidates"]}
    chosen = rows.get(report["chosen"])
    out: dict[str, Any] = {"chosen": report["chosen"], "verdict": report["verdict"],
                           "files_over_size": [n for n in report["notes"] if "exceed --max-size" in n]}
    if chosen is not None:
        out["chosen_file"] = {k: chosen[k] for k in ("precision", "method", "mac_ratio", "onnx_bytes", "gzip_bytes",
                                                     "loss")}
    ort = report.get("chosen_ort")
    if ort:
        out["chosen_ort"] = {"bytes": ort["bytes"], "gzip_bytes": ort["gzip_bytes"], "operators": len(ort["operators"]),
                             "target_platform": ort["target_platform"],
                             "parity": parity_record(ort["parity"], ort["parity"]["against"])}
    return out


# ------------------------------------------------------------------------------------------------------------ main
def held_subset(held: Any, quick: bool) -> Any:
    """The held-out data the benchmark's own measurements use: all of it, or its first rows with ``--quick``."""
    return held.take(QUICK_HELDOUT) if quick else held


def run_model(name: str, args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """One model: its files, their latency and accuracy, the pairs, and the tune's choice."""
    from minreal.app.commands._shared import load_inputs

    case = MODELS[name].case(args.work)
    say(f"{name}: loading {case.model} ({case.data})")
    net, calib, held = load_inputs(case.model, case.weights, False, case.data, case.eval_data)
    held = held_subset(held, args.quick)
    folder = args.work / name / "files"
    folder.mkdir(parents=True, exist_ok=True)
    load_start = list(os.getloadavg())
    files = write_files(net, calib, held, folder)
    names = [f"{stem}.{ext}" for stem in ("fp32", *(f"int8_{t}" for t in TARGETS)) for ext in FORMATS]
    names.insert(2, f"{AMD64_STEM}.ort")
    say(f"{name}: timing {len(names)} files at batch 1 in {config.repeats} fresh processes")
    for file, measured in time_files(folder, names, held, config).items():
        files[file] |= measured
    tune = run_tune(case, SIZE_SHARE * files["fp32.onnx"]["bytes"] / 1024, args.work, args.quick)
    say(f"{name}: tune chose {tune.get('chosen')} ({tune.get('error') or tune.get('verdict')})")
    return {"title": MODELS[name].title, "case": dataclasses.asdict(case), "heldout_samples": len(held),
            "files": {n: files[n] for n in names}, "ort_over_onnx_p50_b1": ort_vs_onnx(files), "tune": tune,
            "loadavg_start": load_start, "loadavg_end": list(os.getloadavg())}


def settings(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """The document's settings block."""
    from minreal.export.int8 import resolve_target
    from minreal.export.settings import OrtConfig

    return {"int8_targets": {t: resolve_target(t) for t in TARGETS}, "ort": dataclasses.asdict(OrtConfig()),
            "ort_platform": "the default: the platform of each file's INT8 target (arm64: arm; others: any); "
                            f"{AMD64_STEM}.ort: fp32 with --ort-platform amd64",
            "timing": {"provider": "cpu", "batch": 1, "processes": config.repeats, "warmup": config.warmup,
                       "min_runs": config.min_runs, "min_seconds": config.min_seconds,
                       "intra_op_threads": config.threads(),
                       "statistic": "pooled p50; .ort over .onnx p50 per process, then median, min, max"},
            "tune": {"max_accuracy_drop_pp": DROP_PP, "max_size": f"{SIZE_SHARE:g} x the fp32 .onnx file",
                     "quick": args.quick}}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--processes", type=int, help="fresh timing processes (default 5; --quick 3)")
    ap.add_argument("--min-seconds", type=float, help="timing window per file and process (default 2; --quick 0.1)")
    ap.add_argument("--work", type=Path, default=tb.ROOT / "runs" / "bench-edge",
                    help="files, tunes, caches and trained weights (default: runs/bench-edge, ignored by git)")
    ap.add_argument("--quick", action="store_true", help="smoke test: short timing, 300 held-out rows, short tune")
    args = ap.parse_args()
    tb.check_only_and_quick(ap, args, MODELS, "edge.json")
    args.processes = args.processes or (3 if args.quick else 5)
    if args.processes < 3:
        ap.error("--processes must be at least 3 (the spread over fresh processes is part of the result)")
    args.min_seconds = args.min_seconds if args.min_seconds is not None else (0.1 if args.quick else 2.0)
    return args


def main() -> None:
    from _common import cpu_share, cpu_times, stop_without_shared_data, write_json

    args = parse()
    stop_without_shared_data("edge", MODELS, args.only, tb.SHARED)
    config = bench_config(args)
    doc: dict[str, Any] = {"usage": USAGE, "issue": "30: shipping to edge devices (ORT format, INT8 for ARM, size)",
                           "quick": args.quick, "header": tb.header(), "settings": settings(args, config),
                           "models": {}}
    start = cpu_times()
    for name in args.only:
        try:
            doc["models"][name] = run_model(name, args, config)
        except Exception as exc:  # one failed model must not cost the others
            doc["models"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            say(f"{name}: failed: {doc['models'][name]['error']}")
        write_json(args.out, doc)
    doc["cpu_share_run"] = cpu_share(start, cpu_times())
    doc["wall_s"] = round(time.perf_counter() - _T0, 1)
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json(args.out, doc)
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
