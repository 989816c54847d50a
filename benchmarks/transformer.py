"""A BERT-style encoder (issue 15): factorize at half the MACs against the original, each in fp32 and INT8, on the CPU.

Model: ``examples/bert_encoder.py:build`` (4 pre-LN layers of nn.MultiheadAttention, width 256, 4 heads, 4x GELU MLP,
mean-pooled classification head), trained briefly (a few epochs, seeded) on the example's synthetic keyword task
(sequences of 10-128 tokens padded to 128, 4 classes). The trained weights and both data files are written to
``--work``; the rest is exactly what a user runs:

    minreal run examples/bert_encoder.py:build --weights W --data train.npz --eval-data heldout.npz -m factorize \\
        --mac-ratio 0.5 --dynamic-axes input_ids:batch,seq --dynamic-axes attention_mask:batch,seq \\
        --axis-values seq=32,128 --batch 1,8 [--recover-epochs N]

(one ONNX file per model with a dynamic batch and sequence, ORT parity at two batch sizes and two lengths,
post-training static INT8 of both, and timing with runtime_bench's protocol: every (batch, seq) cell in 3 fresh
worker processes, models interleaved, each process's p50 kept). This script post-processes the run's
``report.json``: per cell, each model's p50 and its per-process ratio to the original fp32 and to the original INT8
(median, min, max over processes, :func:`minreal.runtime_bench.timing.ratio_summary`), and whether factorize beats the
original INT8 there (in every process); per model, held-out accuracy and agreement with the original in ONNX Runtime.
Any recovery budget (``--recover-epochs``) applies to every compressed variant alike (there is one here).

The run's INT8 files are checked for quantisation scales that are not finite (there must be none): the attention's
0/-inf padding mask calibrates to an infinite scale, so ``quantize_int8`` leaves the nodes around it (the mask's
Reshape, the masked scores' Add and the Softmax of every layer) in float; the JSON lists them per model
(``int8_nonfinite_nodes``). The JSON is written atomically.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/transformer.py --out benchmarks/transformer.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from _common import process_ratios, write_json

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "bert_encoder.py"
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/transformer.py --out benchmarks/transformer.json"
SEQ_LEN, SEQS, BATCHES = 128, (32, 128), (1, 8)
TRAIN_SAMPLES, HELDOUT_SAMPLES, TRAIN_EPOCHS = 1024, 512, 2
MAC_RATIO = 0.5
LABELS = ("original", "factorize", "original.int8", "factorize.int8")
INPUTS = ("input_ids", "attention_mask")


def say(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


def example() -> ModuleType:
    """``examples/bert_encoder.py`` imported by path (a script, not a package)."""
    spec = importlib.util.spec_from_file_location("bert_encoder_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------- model and data
def prepare(work: Path) -> dict[str, Any]:
    """Train ``build()`` on the keyword task; write its weights and both data files to ``work``."""
    bert = example()
    fit = bert.keyword_task(TRAIN_SAMPLES, SEQ_LEN, seed=0)
    held_out = bert.keyword_task(HELDOUT_SAMPLES, SEQ_LEN, seed=1)
    t0 = time.perf_counter()
    model = bert.train(bert.build(), fit, epochs=TRAIN_EPOCHS)
    train_s = time.perf_counter() - t0
    work.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), work / "bert.pt")
    bert.save_npz(work / "train.npz", fit)
    bert.save_npz(work / "heldout.npz", held_out)
    return {"model": "examples/bert_encoder.py:build() — 4 pre-LN layers, d=256, 4 heads, MLP 4x GELU, mean pool, "
                     f"vocab {bert.VOCAB}, {bert.CLASSES} classes, max_len {bert.MAX_LEN}",
            "params": sum(p.numel() for p in model.parameters()),
            "task": f"keyword_task: label = the most frequent of {bert.CLASSES} keyword tokens (never a tie), "
                    f"sequences of 10..{SEQ_LEN} tokens ([CLS] first) right-padded to {SEQ_LEN}; chance "
                    f"{100 / bert.CLASSES:.0f} %",
            "training": f"trained briefly: bert_encoder.train, {TRAIN_EPOCHS} epochs on {TRAIN_SAMPLES} sequences "
                        "(seed 0), AdamW lr 1e-3 one-cycle, batch 16",
            "train_s": round(train_s, 1), "train_samples": TRAIN_SAMPLES, "heldout_samples": HELDOUT_SAMPLES,
            "heldout_accuracy_torch": round(100 * bert.accuracy(model, held_out), 2),
            "train_accuracy_torch": round(100 * bert.accuracy(model, fit), 2)}


# --------------------------------------------------------------------------------------------------------- run
def cli_args(work: Path, recover_epochs: int, min_seconds: float, repeats: int) -> list[str]:
    """The `minreal run` arguments (run from the repository root; the files it reads lie in ``work``)."""
    args = ["run", f"{EXAMPLE.relative_to(ROOT)}:build", "--weights", str(work / "bert.pt"),
            "--data", str(work / "train.npz"), "--eval-data", str(work / "heldout.npz"),
            "-m", "factorize", "--mac-ratio", str(MAC_RATIO),
            "--dynamic-axes", "input_ids:batch,seq", "--dynamic-axes", "attention_mask:batch,seq",
            "--axis-values", f"seq={','.join(map(str, SEQS))}", "--batch", ",".join(map(str, BATCHES)),
            "--min-seconds", f"{min_seconds:g}", "--repeats", str(repeats),
            "--out", str(work / "run"), "--overwrite"]
    return args + (["--recover-epochs", str(recover_epochs)] if recover_epochs else [])


def run_minreal(args: list[str]) -> float:
    """Run the CLI in a fresh process (its progress on stderr); return the wall time."""
    t0 = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("minreal")), *args], cwd=ROOT, check=True,
                   env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------------ tables
def nonfinite_scales(path: Path) -> list[str]:
    """Names of the quantisation scales in an ONNX file that are not finite (inf or NaN)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    return [i.name for i in model.graph.initializer
            if i.name.endswith("scale") and not np.isfinite(numpy_helper.to_array(i)).all()]


def variant_rows(case: dict[str, Any], case_dir: Path) -> dict[str, dict[str, Any]]:
    """Per model: size, cost, held-out accuracy and agreement with the original (ORT), parity, INT8 facts."""
    metrics = {m["model"]: m for m in case["bench"]["metrics"]}
    base_macs = case["variants"][0]["macs"]
    rows = {}
    for v in case["variants"]:
        m = metrics[v["label"]]
        row = {"params": v["params"], "macs": v["macs"], "mac_ratio": round(v["macs"] / base_macs, 4),
               "onnx_kb": round(v["onnx_bytes"] / 1024, 1), "heldout_accuracy": round(100 * m["accuracy"], 2),
               "top1_agreement_with_original": round(m["top1_agreement"], 4),
               "max_abs_logit_diff_vs_original": round(m["max_abs_diff"], 4)}
        if v["parity"]:
            row["parity"] = {k: v["parity"][k] for k in ("batch_sizes", "max_abs_err", "passed")}
        if v["quantization"]:
            row["int8_nonfinite_scales"] = nonfinite_scales(case_dir / v["onnx"])
            row["int8_nonfinite_nodes"] = v["quantization"].get("nonfinite_nodes", [])
            row["int8_integer_kernels"] = v["quantization"]["integer_kernels"]
        rows[v["label"]] = row
    return rows


def compression_summary(case: dict[str, Any]) -> dict[str, Any]:
    """What factorize did: the budget reached and each candidate layer's rank (None: kept) of its full rank."""
    comp = next(v["compression"] for v in case["variants"] if v["label"] == "factorize")
    return {"whole_model_mac_ratio": round(comp["macs_after"] / comp["macs_before"], 4),
            "params_ratio": round(comp["params_after"] / comp["params_before"], 4),
            "layers": {layer["name"]: [layer["rank"], layer["full_rank"]] for layer in comp["layers"]},
            "recovery": comp.get("recovery"), "notes": comp["notes"]}


def latency_cells(bench: dict[str, Any], labels: tuple[str, ...], int8_ref: str) -> dict[str, dict[str, Any]]:
    """Per (batch, seq) cell of a benchmark report: each model's p50 and per-process ratios to the original fp32 and
    to ``int8_ref`` (the original in INT8), and whether each compressed model beats ``int8_ref`` in every process."""
    by_cell: dict[str, dict[str, dict[str, Any]]] = {}
    for r in bench["latency"]:
        by_cell.setdefault(f"b{r['batch_size']}/{r['shape']}", {})[r["model"]] = r
    cells = {}
    for cell, rows in by_cell.items():
        out: dict[str, Any] = {}
        for label in labels:
            procs = list(rows[label]["process_p50_ms"])
            out[label] = {"p50_ms": round(rows[label]["stats"]["p50_ms"], 4),
                          "process_p50_ms": [round(p, 4) for p in procs],
                          "x_original": process_ratios(procs, list(rows["original"]["process_p50_ms"])),
                          f"x_{int8_ref}": process_ratios(procs, list(rows[int8_ref]["process_p50_ms"]))}
        for label in labels:
            if label.startswith("factorize"):
                out[f"{label}_beats_{int8_ref}"] = out[label][f"x_{int8_ref}"]["max"] < 1.0
        cells[cell] = out
    return dict(sorted(cells.items(), key=lambda kv: (int(kv[0].split("/")[0][1:]), int(kv[0].split("=")[1]))))


# -------------------------------------------------------------------------------------------------------- summary
def summary(doc: dict[str, Any]) -> list[str]:
    """One line per cell and one for accuracy."""
    lines = []
    for cell, c in doc["cells"].items():
        ms = ", ".join(f"{label} {c[label]['p50_ms']:.3f}" for label in LABELS)
        verdicts = "; ".join(
            f"{label}/original.int8 {c[label]['x_original.int8']['median']} [{c[label]['x_original.int8']['min']}, "
            f"{c[label]['x_original.int8']['max']}] "
            f"({'beats' if c[f'{label}_beats_original.int8'] else 'does not beat'}"
            " it in every process)" for label in ("factorize", "factorize.int8"))
        lines.append(f"{cell}: p50 ms {ms}; {verdicts}")
    accuracy = {k: v["heldout_accuracy"] for k, v in doc["variants"].items()}
    lines.append("held-out accuracy (ORT, %): " + ", ".join(f"{k} {v}" for k, v in accuracy.items()))
    return lines


# -------------------------------------------------------------------------------------------------------- main
def header() -> dict[str, Any]:
    import onnxruntime

    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"commit": git, "uncommitted_library_files": "the run imports the working tree", "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "cpus": os.cpu_count(),
            "machine": platform.processor() or platform.machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "loadavg_start": list(os.getloadavg())}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/transformer.json"))
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-transformer",
                    help="weights, data files and the run directory (default: runs/bench-transformer, ignored by git)")
    ap.add_argument("--recover-epochs", type=int, default=0, help="recovery budget of every compressed variant")
    ap.add_argument("--min-seconds", type=float, default=2.0, help="timing protocol: seconds per model and process")
    ap.add_argument("--repeats", type=int, default=3, help="timing protocol: fresh processes per cell")
    return ap.parse_args()


def main() -> None:
    args = parse()
    work = args.work.resolve()
    doc: dict[str, Any] = {"usage": USAGE, "issue": 15, "header": header()}
    say("training the encoder")
    doc["setting"] = prepare(work)
    say(f"trained in {doc['setting']['train_s']} s, held-out accuracy {doc['setting']['heldout_accuracy_torch']} %")
    cli = cli_args(work, args.recover_epochs, args.min_seconds, args.repeats)
    doc["setting"].update(cli="minreal " + " ".join(cli), provider="cpu", batch_sizes=list(BATCHES),
                          seq_lengths=list(SEQS), mac_ratio=MAC_RATIO, recover_epochs=args.recover_epochs,
                          timing={"min_seconds": args.min_seconds, "repeats": args.repeats,
                                  "statistic": "p50 per process; ratios per process, then median/min/max"})
    wall = run_minreal(cli)
    case = json.loads((work / "run" / "report.json").read_text())["cases"][0]
    doc["run"] = {"wall_s": round(wall, 1), "stage_seconds": {k: round(v, 1) for k, v in case["stage_seconds"].items()},
                  "run_dir": str(work / "run"), "warnings": case["warnings"], "loadavg_end": list(os.getloadavg())}
    doc["variants"] = variant_rows(case, work / "run" / case["name"])
    doc["factorize"] = compression_summary(case)
    doc["cells"] = latency_cells(case["bench"], LABELS, "original.int8")
    doc["verdict_rule"] = ("X beats original.int8 on a cell when X's p50 is below original.int8's in every timing "
                           "process (max of the per-process ratios < 1)")
    doc["summary"] = summary(doc)
    write_json(args.out, doc)
    print("\n".join(doc["summary"]))
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
