"""Hugging Face encoders at 0.7 of the MACs (issue 44): factorize and wanda against the original, each in fp32 and
INT8, on the CPU, with the spread over fresh processes.

The zoo (``benchmarks/zoo.json``) found that the encoders cut by wanda ran faster than the original in fp32 but slower
in INT8. The cause was the export's simplifier: the width trace fixes ``attention_mask=None``, and onnxsim 0.8 fused
each mask-free attention into ONNX Runtime's ``com.microsoft`` ``Attention`` kernel, which the INT8 quantiser leaves
in float (and TensorRT cannot run). This benchmark checks the fix where the finding was made, with more than the zoo's
one short sample: per model, whether each method's INT8 beats the original's INT8 in every process.

Models: ``hf:bert``, ``hf:distilbert`` and ``hf:roberta`` at their base sizes, built from their configs with seeded
random weights (nothing is downloaded; needs the ``[hf]`` extra, and ``../shared/data``, which the zoo reads), fed 128
synthetic token ids. Random weights give no
accuracy to report: the figures are latency, and ONNX Runtime parity as the export checks it. Every stage
(compress, export with parity, INT8) runs through ``benchmarks/zoo.py`` in its fresh processes (files kept in
``--work``, started afresh unless ``--resume``, which keeps the zoo rows and files already there; the JSON names each
row's commit); then one ``minreal bench`` per model times its six files (the original, factorize and wanda, each in fp32
and INT8) at batch 1 in ``--repeats`` fresh worker processes, files interleaved, each process's p50 kept. Ratios are
per process (median, min, max over processes) to the original in fp32 and in INT8; a method "beats" the original's INT8
only when it does in every process. For each INT8 file the JSON records the ops outside the standard ONNX domain and
the MatMul and Gemm nodes left in float (an input not fed by a DequantizeLinear). ``--note`` records what else ran
on the machine. The JSON is written atomically after each model.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/hf_encoders.py --out benchmarks/hf_encoders.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import zoo
from _common import process_ratios, write_json

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "benchmarks" / "zoo.py"
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/hf_encoders.py --out benchmarks/hf_encoders.json"
MODELS = ("hf:bert", "hf:distilbert", "hf:roberta")
METHODS = ("factorize", "wanda")
LABELS = ("original", "original.int8", *(f"{m}{s}" for m in METHODS for s in ("", ".int8")))


def say(line: str) -> None:
    print(f"[hf_encoders {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def run_zoo(work: Path, models: list[str], timeout: float, resume: bool) -> dict[str, Any]:
    """The zoo's stages for ``models`` × :data:`METHODS` (fresh processes, files kept); its JSON. Without ``resume``
    the work folder's zoo rows and model files go first."""
    out = work / "zoo.json"
    if not resume:
        out.unlink(missing_ok=True)
        for name in models:
            shutil.rmtree(work / name, ignore_errors=True)
    done = subprocess.run([sys.executable, str(ZOO), "--out", str(out), "--work", str(work), "--only",
                           ",".join(models), "--methods", ",".join(METHODS), "--keep-files", "--resume", "--timeout",
                           str(timeout), "--load", "run by benchmarks/hf_encoders.py (its JSON says what else ran)"],
                          cwd=ROOT)
    if done.returncode:
        sys.exit(f"hf_encoders.py: benchmarks/zoo.py stopped with exit status {done.returncode} (its message is "
                 "above); nothing written")
    return json.loads(out.read_text())


def int8_graph(path: Path) -> dict[str, Any]:
    """Ops outside the standard ONNX domain, and the MatMul and Gemm nodes with an input no DequantizeLinear feeds
    (left in float)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    products = [n for n in graph.node if n.op_type in ("MatMul", "Gemm")]
    foreign = sorted({f"{n.domain}:{n.op_type}" for n in graph.node if n.domain not in ("", "ai.onnx")})
    return {"ops_outside_standard_domain": foreign, "matmuls_and_gemms": len(products),
            "in_float": sum(not set(n.input) - {""} <= dequantized for n in products)}


def bench(folder: Path, calib: Path, repeats: int, min_runs: int) -> dict[str, Any]:
    """One ``minreal bench`` of the model's six files at batch 1 (a fresh process of its own) on the first
    :data:`zoo.BENCH_ROWS` calibration rows; its report."""
    files = {"original": folder / "original.onnx", "original.int8": folder / "original.int8.onnx"}
    for method in METHODS:
        files[method] = folder / method / "compressed.onnx"
        files[f"{method}.int8"] = folder / method / "compressed.int8.onnx"
    links = folder / "bench"
    links.mkdir(exist_ok=True)
    for label, path in files.items():  # the report labels a model by its file name
        link = links / f"{label}.onnx"
        link.unlink(missing_ok=True)
        link.symlink_to(path.resolve())
    x = zoo.first_rows(zoo.load_calib(calib), zoo.BENCH_ROWS)
    np.savez(folder / "bench-data.npz", **(x if isinstance(x, dict) else {"x": x}))
    report = folder / "bench.json"
    subprocess.run([sys.executable, "-m", "minreal", "bench", *(str(links / f"{label}.onnx") for label in LABELS),
                    "--data", str(folder / "bench-data.npz"), "--batch", "1", "--repeats", str(repeats),
                    "--warmup", "5", "--min-runs", str(min_runs), "--out", str(report), "--quiet"],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(report.read_text())


def model_rows(report: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Per label: p50, per-process p50s and ratios to the original fp32 and INT8; per method, the verdicts."""
    rows = {r["model"]: r for r in report["latency"] if r["batch_size"] == 1}
    out: dict[str, Any] = {}
    for label in LABELS:
        procs = list(rows[label]["process_p50_ms"])
        out[label] = {"p50_ms": round(rows[label]["stats"]["p50_ms"], 3),
                      "process_p50_ms": [round(p, 3) for p in procs],
                      "x_original": process_ratios(procs, rows["original"]["process_p50_ms"], 4),
                      "x_original.int8": process_ratios(procs, rows["original.int8"]["process_p50_ms"], 4)}
        if label.endswith(".int8"):
            path = folder / "original.int8.onnx" if label == "original.int8" else \
                folder / label.split(".")[0] / "compressed.int8.onnx"
            out[label]["graph"] = int8_graph(path)
    for method in METHODS:
        out[f"{method}.int8_beats_original.int8"] = out[f"{method}.int8"]["x_original.int8"]["max"] < 1.0
        out[f"{method}_beats_original"] = out[method]["x_original"]["max"] < 1.0
    return out


def stage_facts(zoo: dict[str, Any], name: str) -> dict[str, Any]:
    """Per method: each zoo stage's outcome (and reason), the MAC and parameter ratios reached, stage wall times."""
    facts = {}
    for row in zoo["rows"]:
        if row["model"] != name:
            continue
        st = row["stages"]
        facts[row["method"]] = {
            "outcomes": {k: v["outcome"] if "reason" not in v else f"{v['outcome']}: {v['reason']}"
                         for k, v in st.items()},
            "mac_ratio_reached": st["compress"].get("mac_ratio_reached"),
            "param_ratio_reached": st["compress"].get("param_ratio_reached"), "commit": row.get("commit"),
            "wall_s": {k: v.get("wall_s") for k, v in st.items() if k != "parity"}}
    return facts


def summary(doc: dict[str, Any]) -> list[str]:
    lines = []
    for name, m in doc["models"].items():
        if "latency" not in m:
            lines.append(f"{name}: {m.get('skipped')}")
            continue
        lat = m["latency"]
        parts = [f"original {lat['original']['p50_ms']:.1f} ms, INT8 {lat['original.int8']['p50_ms']:.1f} ms"]
        for method in METHODS:
            r, q = lat[method]["x_original"], lat[f"{method}.int8"]["x_original.int8"]
            parts.append(f"{method} fp32 {r['median']:.3f} [{r['min']:.3f}, {r['max']:.3f}] x original, INT8 "
                         f"{q['median']:.3f} [{q['min']:.3f}, {q['max']:.3f}] x original INT8 "
                         f"({'beats' if lat[f'{method}.int8_beats_original.int8'] else 'does not beat'} it in every "
                         "process)")
        lines.append(f"{name}: " + "; ".join(parts))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "hf_encoders.json")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "hf_encoders")
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    ap.add_argument("--repeats", type=int, default=5, help="fresh worker processes per model's bench")
    ap.add_argument("--min-runs", type=int, default=30, help="measured runs per file and process")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one zoo stage may run")
    ap.add_argument("--resume", action="store_true", help="keep the zoo rows and files already in --work")
    ap.add_argument("--note", default="", help="what else ran on the machine (recorded in the JSON)")
    args = ap.parse_args()
    models = [m for m in args.only.split(",") if m]
    if unknown := sorted(set(models) - set(MODELS)):
        ap.error(f"--only: unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    try:
        import transformers  # noqa: F401
    except ImportError:
        sys.exit("hf_encoders.py: transformers is not installed; pip install -e '.[hf]'")
    if not zoo.IMAGES.is_file():
        sys.exit(f"hf_encoders.py: {zoo.IMAGES} is missing (../shared/data is absent, as in a user's clone; the zoo "
                 "reads it); nothing measured")
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    doc: dict[str, Any] = {"usage": USAGE, "issue": 44, "note": args.note or "not stated", "models": {}}
    zoo_doc = run_zoo(args.work, models, args.timeout, args.resume)
    say(f"zoo stages done in {time.perf_counter() - started:.0f} s")
    doc.update(header=zoo_doc["header"], protocol={"batch": 1, "repeats": args.repeats, "min_runs": args.min_runs,
                                                   "warmup": 5, "mac_ratio": zoo_doc["mac_ratio"]})
    for name in models:
        folder, base = args.work / name, zoo_doc["models"][name]
        facts = stage_facts(zoo_doc, name)
        entry: dict[str, Any] = {"params": base.get("params"), "input": base.get("input"), "stages": facts}
        passed = base.get("outcome") == "ok" and len(facts) == len(METHODS) and \
            all(f["outcomes"].get("int8") == "ok" for f in facts.values())
        if not passed:
            doc["models"][name] = {**entry, "skipped": "a stage did not pass: nothing to time"}
            continue
        t0, load = time.perf_counter(), [round(v, 2) for v in os.getloadavg()]
        model = zoo.Model(name, "hf", tuple(base["input"]), inputs="tokens")
        try:
            report = bench(folder, zoo._calib_file(args.work, model), args.repeats, args.min_runs)
        except subprocess.CalledProcessError as exc:
            doc["models"][name] = {**entry, "skipped": f"minreal bench stopped with exit status {exc.returncode}"}
        else:
            doc["models"][name] = {**entry, "load_at_bench": load, "latency": model_rows(report, folder),
                                   "bench_s": round(time.perf_counter() - t0, 1)}
            say(summary({"models": {name: doc["models"][name]}})[0])
        doc["summary"] = summary(doc)
        doc["wall_s"] = round(time.perf_counter() - started, 1)
        write_json(args.out, doc)
    print("\n".join(doc.get("summary", [])))


if __name__ == "__main__":
    main()
