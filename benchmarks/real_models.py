"""Benchmark of `minreal tune` on real models (issue 28): per model and budget, its choice against the original INT8.

Models (``--only``, default all, in this order):
- ``resnet32``, ``resnet44``: the pretrained CIFAR-10 ResNet-32 and ResNet-44 of ``../shared/data`` (akamaster,
  option-A shortcuts) on real CIFAR-10 test images (JPEG-decoded, ImageNet mean and std): the first 7,000 for
  calibration and recovery, the last 2,000 held out; recovery cap 3 epochs (``benchmarks/tune.py``'s
  ``pretrained_cifar_case``);
- ``bert``: the BERT-style encoder of ``examples/bert_encoder.py`` (``build``: 4 pre-LN layers, width 256, named inputs
  ``input_ids`` and ``attention_mask`` of 128 tokens) trained as ``benchmarks/transformer.py`` trains it, on its
  keyword task (1,024 training sequences, 512 held out: one sequence is 0.2 pp); recovery cap 1 epoch;
- ``ssm``: the ``ssm`` method's demo model (``minreal demo --only ssm``) on ``digits-seq``; recovery cap 1 epoch. The
  tune searches only methods with a whole-model MAC budget; ``ssm`` (balanced truncation) has none, so its candidates
  are the other methods' cuts of the model's linear layers;
- ``mlp``: ``minreal demo``'s digits MLP on ``digits-flat`` (``benchmarks/tune.py``'s ``mlp``); recovery cap 1 epoch.

Budgets (``--drops``, default 0.5, 1 and 2 pp of held-out accuracy against the original). Each cell (model, budget)
is one tune, run exactly as ``benchmarks/tune.py`` runs it (its ``run_one``: ``minreal tune --workers 1`` with the
inputs as specs, every method with a MAC budget over the default grid, successive halving of the recovered
candidates, the default screening and release protocols, CPU provider, batch 1 and 32; the tune chooses on batch 1
and the batch-32 choice follows the tune's own rule over the same confirmed measurements). A model's first budget
starts from an empty candidate cache (its wall time is the cold one); its other budgets reuse that cache.

``cells`` holds per cell and batch: the chosen file, its confirmed p50 against the original's INT8 (the speed-up per
fresh confirmation process, where both files are timed interleaved: median, min, max; against the fastest confirmed
baseline instead, named, where the original's INT8 missed the budget), its held-out accuracy drop in ONNX Runtime,
a verdict in plain words, and the tune's wall time. ``table`` holds those as the rows of the README's first benchmark
table (``table_markdown``: the same, rendered); ``runs`` the full record of every tune (as in
``benchmarks/tune.json``), ``summary`` ``benchmarks/tune.py``'s summary of them.

The JSON is rewritten atomically after every cell; a run keeps the cells of the models it does not tune (``--only``),
and ``--resume`` skips cells it holds (a failed cell runs again).
``--refresh`` re-derives the cells, table and runs from the tune folders' ``report.json`` without tuning again.
``--plan`` prints the cells and each one's `minreal tune` command line and stops (nothing is trained or written).
Tune folders and caches go to ``--work`` (ignored by git). ``--quick`` is a smoke test (``benchmarks/tune.py``'s: one
method, two ratios, short protocols) and needs its own ``--out``. Without ``../shared/data`` (a user's clone), when
a selected model needs it, the script prints one line and exits with status 2: nothing was measured (a failure inside
a cell is recorded in that cell, and the run goes on). Run it alone: the load average is recorded per cell. It takes
hours on 2 cores (ResNet-32 at 1 pp alone took 896 s cold in ``benchmarks/tune.json``).

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/real_models.py --out benchmarks/real_models.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import tune as tb  # benchmarks/tune.py (benchmarks/ is on sys.path: this file runs as a script)

USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/real_models.py --out benchmarks/real_models.json"
DROPS = (0.5, 1.0, 2.0)
CELLS = tuple(f"{tb.PROVIDER}/b{b}" for b in tb.BATCHES)
BASELINE = "original.int8"
BERT_FILES = ("bert.pt", "train.npz", "heldout.npz")
COLUMNS = ("model", "budget", "batch", "chosen", f"speed-up vs {BASELINE}", f"p50 ms (chosen / {BASELINE})",
           "held-out drop", "tune wall time", "verdict")
METHOD = ("one `minreal tune` per (model, budget) as benchmarks/tune.py runs it (run_one), at batch sizes 1 and 32 on "
          "the CPU provider; chosen per batch by the tune's own rule (the lowest confirmed p50, but a structural win "
          "that does not hold in every confirmation process against a baseline is a tie, which goes to the baseline). "
          "speedup = the reference's p50 / the chosen file's p50 in each fresh confirmation process (both timed "
          f"interleaved in the same processes): median, min, max; the reference is {BASELINE} unless it missed the "
          "budget (then the fastest confirmed baseline, named in `reference`). accuracy_drop_pp = held-out accuracy "
          "of the original fp32 file minus the chosen file's, both in ONNX Runtime. wall_s: the tune's wall time "
          "(cold: the model's first budget, empty cache; warm: its candidates cached by an earlier budget).")


# ------------------------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class Model:
    """A model of the benchmark: its title in the table, its :class:`tune.Case` (built by ``case(work, prepare)``:
    files trained or written once under ``work``; without ``prepare``, only named), the files it needs from
    ``../shared/data``, and what a reader of its cells must know."""

    title: str
    case: Callable[[Path, bool], tb.Case]
    needs: tuple[Path, ...] = ()
    note: str = ""


def bert_case(work: Path, prepare: bool = True) -> tb.Case:
    """The BERT-style encoder of examples/bert_encoder.py with its keyword-task data, trained as
    ``benchmarks/transformer.py`` trains it and written once under ``work/bert``."""
    import transformer  # benchmarks/transformer.py: the same model, task and training

    folder = work / "bert"
    weights, train, held = (folder / name for name in BERT_FILES)
    if prepare and not all(p.is_file() for p in (weights, train, held)):
        _write_bert(folder, transformer.prepare)
    return tb.Case("bert", f"{transformer.EXAMPLE}:build", str(weights), str(train),
                   "examples/bert_encoder.py:build (4 pre-LN layers, width 256, 4 heads, mean-pooled head; named "
                   f"inputs input_ids and attention_mask, padded to {transformer.SEQ_LEN} tokens) trained as "
                   f"benchmarks/transformer.py trains it ({transformer.TRAIN_EPOCHS} epochs on "
                   f"{transformer.TRAIN_SAMPLES} keyword-task sequences, seed 0, also the calibration and recovery "
                   f"data); {transformer.HELDOUT_SAMPLES} sequences of seed 1 held out", eval_data=str(held))


def _write_bert(folder: Path, train: Callable[[Path], dict[str, Any]]) -> None:
    """``train`` writes into a staging folder that replaces ``folder`` whole (no half-written files), with the
    training's account as ``training.json``."""
    staging = folder.with_name(f"{folder.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    info = train(staging)
    (staging / "training.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def ssm_case(work: Path, prepare: bool = True) -> tb.Case:
    """The ``ssm`` method's demo model, trained as ``minreal demo`` trains it, on ``digits-seq`` (the demo's split)."""
    return tb.Case("ssm", f"{tb.THIS}:ssm_digits", str(tb._demo_weights("ssm", work, prepare)), "digits-seq",
                   "the ssm method's demo model (minreal demo --only ssm): an SSMClassifier trained with the Hankel "
                   "nuclear-norm regulariser on sequential digits (64 steps of one pixel), 25 % held out")


MODELS: dict[str, Model] = {
    "resnet32": Model("ResNet-32, CIFAR-10", partial(tb.pretrained_cifar_case, "resnet32"),
                      (tb.PRETRAINED["resnet32"][0], tb.CIFAR)),
    "resnet44": Model("ResNet-44, CIFAR-10", partial(tb.pretrained_cifar_case, "resnet44"),
                      (tb.PRETRAINED["resnet44"][0], tb.CIFAR)),
    "bert": Model("BERT-style encoder, keyword task", bert_case,
                  note="held-out accuracy on 512 sequences: one sequence is 0.2 pp; latency at 128 tokens"),
    "ssm": Model("SSM demo, sequential digits", ssm_case,
                 note="the ssm method (balanced truncation of the recurrence) has no whole-model MAC budget, so the "
                      "tune does not search it: the candidates are the other methods' cuts of the linear layers"),
    "mlp": Model("digits MLP (demo)", tb.mlp_case)}


def model_case(name: str, work: Path, drops: tuple[float, ...], prepare: bool) -> tb.Case:
    return dataclasses.replace(MODELS[name].case(work, prepare), drops=drops)


def model_record(name: str, case: tb.Case) -> dict[str, Any]:
    """What ``models`` holds of one model: its case, and the training's account where one was written."""
    training = Path(case.weights).with_name("training.json")
    extra = {"training": json.loads(training.read_text())} if name == "bert" and training.is_file() else {}
    return {"title": MODELS[name].title, **dataclasses.asdict(case), "note": MODELS[name].note, **extra}


# -------------------------------------------------------------------------------------------------------- cells
def process_p50(latency: list[dict[str, Any]], cell: str) -> dict[str, list[float]]:
    """Each confirmed file's p50 per fresh confirmation process on ``cell`` (processes in the same order)."""
    return {row["model"]: list(row.get("process_p50_ms") or [row["stats"]["p50_ms"]]) for row in latency
            if f"{row['provider']}/b{row['batch_size']}" == cell}


def speedup(chosen: list[float] | None, reference: list[float] | None) -> dict[str, Any] | None:
    """``reference / chosen`` p50 per process (paired: both timed in the same processes): median, min, max."""
    from minreal.runtime_bench.timing import ratio_summary

    if not chosen or not reference or len(chosen) != len(reference):
        return None
    s = ratio_summary(reference, chosen)
    return {"median": round(s.median, 3), "min": round(s.min, 3), "max": round(s.max, 3), "processes": len(chosen)}


def reference_label(rows: dict[str, dict[str, Any]], cell: str) -> str | None:
    """:data:`BASELINE` where it was confirmed on ``cell``; else (it missed the budget) the fastest confirmed one."""
    if cell in rows.get(BASELINE, {}).get("confirm_p50_ms", {}):
        return BASELINE
    confirmed = [r for r in rows.values() if r["kind"] == "baseline" and cell in r["confirm_p50_ms"]]
    return min(confirmed, key=lambda r: r["confirm_p50_ms"][cell])["label"] if confirmed else None


def batch_record(run: dict[str, Any], cell: str, processes: dict[str, list[float]]) -> dict[str, Any]:
    """The chosen file on ``cell`` against the reference, its accuracy drop, and the verdict."""
    rows = {r["label"]: r for r in run["candidates"]}
    winner = run["winner"][cell]
    label, ref = winner["label"], reference_label(rows, cell)
    out: dict[str, Any] = {"chosen": label, "tune_verdict": winner["verdict"]}
    if label is not None:
        c = rows[label]
        out |= {k: c[k] for k in ("kind", "method", "mac_ratio", "precision", "recover_epochs")}
        out |= {"accuracy_pct": c["accuracy"], "accuracy_drop_pp": c["loss_pp"], "p50_ms": c["confirm_p50_ms"][cell],
                "process_p50_ms": processes.get(label), "reference": ref,
                "reference_p50_ms": None if ref is None else rows[ref]["confirm_p50_ms"][cell],
                "reference_process_p50_ms": processes.get(ref), "speedup": speedup(processes.get(label),
                                                                                   processes.get(ref))}
    int8 = rows.get(BASELINE)
    out[BASELINE] = None if int8 is None else {"accuracy_drop_pp": int8["loss_pp"], "feasible": int8["feasible"],
                                               "screen_p50_ms": int8["screen_p50_ms"].get(cell)}
    out["verdict"] = verdict(run, cell, out)
    return out


def _pp(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f} pp"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def times(s: dict[str, Any] | None, ref: str | None) -> str:
    """``1.42x faster than original.int8 (1.38-1.45x over 3 processes)``, or slower."""
    if s is None:
        return f"not timed against {ref or 'a baseline'}"
    n = s["processes"]
    if s["median"] >= 1:
        return f"{s['median']:.2f}x faster than {ref} ({s['min']:.2f}-{s['max']:.2f}x over {n} processes)"
    return f"{1 / s['median']:.2f}x slower than {ref} ({1 / s['max']:.2f}-{1 / s['min']:.2f}x over {n} processes)"


def verdict(run: dict[str, Any], cell: str, rec: dict[str, Any]) -> str:
    """The cell's outcome in plain words."""
    drop, label = run["max_accuracy_drop_pp"], rec["chosen"]
    if label is None:
        return f"nothing meets {drop:g} pp: {rec['tune_verdict']}"
    int8 = rec[BASELINE]
    missed = "" if int8 is None or int8["feasible"] else \
        f"; {BASELINE} itself loses {_pp(int8['accuracy_drop_pp'])}, over the budget"
    if rec["kind"] == "structural":
        return (f"{label} is {times(rec['speedup'], rec['reference'])} within {drop:g} pp (drop "
                f"{_pp(rec['accuracy_drop_pp'])}){missed}")
    same = "" if label == rec["reference"] else f"; {label} is {times(rec['speedup'], rec['reference'])}"
    return f"nothing structural beats {label}: {why_no_structural(run, cell, rec)}{same}{missed}"


def why_no_structural(run: dict[str, Any], cell: str, rec: dict[str, Any]) -> str:
    """Why the tune kept a baseline on ``cell``: the best structural file's p50, or where they all fell out."""
    drop, ref = run["max_accuracy_drop_pp"], rec["reference"]
    structural = [r for r in run["candidates"] if r["kind"] == "structural"]
    feasible = [r for r in structural if r["feasible"]]
    confirmed = [r for r in feasible if cell in r["confirm_p50_ms"]]
    if confirmed:
        best = min(confirmed, key=lambda r: r["confirm_p50_ms"][cell])
        ms = best["confirm_p50_ms"][cell]
        chosen = rec["chosen"]
        tie = f", below {chosen}'s p50 but not in every confirmation process (a tie, which goes to {chosen})" \
            if ms < rec["p50_ms"] else ""
        ratio = f"{ms / rec['reference_p50_ms']:.2f}x {ref}'s p50" if ref else f"{ms:.3g} ms p50"
        return (f"the fastest structural file within {drop:g} pp, {best['label']} (drop {_pp(best['loss_pp'])}), "
                f"takes {ratio}{tie}")
    if not structural:
        return f"no structural candidate kept {drop:g} pp in torch ({run['funnel']['torch_probes']} probes)"
    if not feasible:
        return f"the {len(structural)} structural files that kept {drop:g} pp in torch all lost more in ONNX Runtime"
    return f"the {len(feasible)} structural files within {drop:g} pp were all slower than the baselines at screening"


def cell_record(run: dict[str, Any], report: Any, commit: str | None) -> dict[str, Any]:
    """One cell of the benchmark from its tune's run record and :class:`~minreal.app.tune.TuneReport`; ``commit``:
    the library's commit the tune ran at."""
    latency = (report.confirm or {}).get("latency", [])
    original = run["baselines"].get("original", {})
    return {"model": run["model"], "max_accuracy_drop_pp": run["max_accuracy_drop_pp"], "wall_s": run["wall_s"],
            "cache": run["cache"].split()[0], "original_accuracy_pct": original.get("accuracy"),
            **{cell: batch_record(run, cell, process_p50(latency, cell)) for cell in CELLS},
            "folder": run["folder"], "commit": commit, "tune_created_utc": report.created_utc}


def cell_line(cell: dict[str, Any]) -> str:
    """One progress line for a finished cell."""
    if "error" in cell:
        return f"FAILED: {cell['error']}"
    parts = [f"b{b} {cell[c]['chosen']} ({_speedup_text(cell[c].get('speedup'))})" for b, c in zip(tb.BATCHES, CELLS)]
    return f"{cell['wall_s']:.0f} s ({cell['cache']}); {'; '.join(parts)}"


def _speedup_text(s: dict[str, Any] | None) -> str:
    return "-" if s is None else f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"


# -------------------------------------------------------------------------------------------------------- table
def table(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The README's first benchmark table: one row per model, budget and batch size, in :data:`MODELS` order."""
    order = {name: i for i, name in enumerate(MODELS)}
    keys = sorted(doc["cells"], key=lambda k: (order.get(doc["cells"][k]["model"], len(order)),
                                               doc["cells"][k]["max_accuracy_drop_pp"]))
    return [row for k in keys for row in cell_rows(doc["cells"][k], doc["models"])]


def cell_rows(cell: dict[str, Any], models: dict[str, Any]) -> list[dict[str, Any]]:
    title = models.get(cell["model"], {}).get("title", cell["model"])
    head = {"model": title, "budget": f"{cell['max_accuracy_drop_pp']:g} pp"}
    if "error" in cell:
        return [dict.fromkeys(COLUMNS, "-") | head | {"verdict": f"not measured: {cell['error']}"}]
    rows = []
    for batch, c in zip(tb.BATCHES, CELLS):
        b = cell[c]
        ref = "" if b.get("reference") in (None, BASELINE) else f" (vs {b['reference']})"
        chosen = b["chosen"] is not None
        rows.append(head | {"batch": batch, "chosen": b["chosen"] or "-",
                            f"speed-up vs {BASELINE}": _speedup_text(b.get("speedup")) + ref,
                            f"p50 ms (chosen / {BASELINE})":
                                f"{_ms(b['p50_ms'])} / {_ms(b['reference_p50_ms'])}" if chosen else "-",
                            "held-out drop": _pp(b["accuracy_drop_pp"]) if chosen else "-",
                            "tune wall time": f"{cell['wall_s'] / 60:.1f} min ({cell['cache']})",
                            "verdict": b["verdict"]})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """``rows`` as a Markdown table (:data:`COLUMNS`)."""
    def line(values: Any) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    return "\n".join([line(COLUMNS), line("---" for _ in COLUMNS), *(line(r[k] for k in COLUMNS) for r in rows)])


# --------------------------------------------------------------------------------------------------------- runs
def run_cell(case: tb.Case, drop: float, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tune's run record and the cell; a failure is recorded in both (the cell alone when deriving it failed:
    fix and ``--refresh``)."""
    try:
        run = tb.run_one(case, drop, args.work, args.quick)
    except Exception as exc:  # one failed cell must not cost the others
        failed = {"model": case.name, "max_accuracy_drop_pp": drop, "error": _error(exc)}
        return failed, failed
    try:
        return run, cell_record(run, tb.load_report(Path(run["folder"])), tb.git_state()["commit"])
    except Exception as exc:  # the tune's record is kept; --refresh derives the cell again
        return run, {"model": case.name, "max_accuracy_drop_pp": drop,
                     "error": f"deriving the cell failed ({_error(exc)}); --refresh derives it again"}


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def run_model(doc: dict[str, Any], name: str, args: argparse.Namespace, save: Callable[[], None],
              say: Callable[[str], None]) -> None:
    """Every budget of one model, each saved as soon as it finishes; the first budget starts from an empty cache."""
    keys, done = [f"{name}/drop{d:g}" for d in args.drops], finished(doc) if args.resume else set()
    todo = [k for k in keys if k not in done]
    say(f"{name}: {'preparing the model and data' if todo else 'every budget in the JSON already (--resume)'}")
    try:
        case = model_case(name, args.work, args.drops, prepare=bool(todo))
    except Exception as exc:  # a model that cannot be prepared fails its cells, not the benchmark
        for key, drop in zip(keys, args.drops):
            if key in todo:
                doc["runs"][key] = doc["cells"][key] = {"model": name, "max_accuracy_drop_pp": drop,
                                                        "error": f"preparing the model failed: {_error(exc)}"}
        save()
        return
    doc["models"][name] = model_record(name, case)
    for i, (key, drop) in enumerate(zip(keys, case.drops)):
        if key not in todo:
            say(f"{key}: in {args.out} already, skipped (--resume)")
            continue
        if i == 0:
            shutil.rmtree(args.work / "cache" / name, ignore_errors=True)
        say(f"{key}: tuning ({case.model}), load {os.getloadavg()[0]:.1f}")
        doc["runs"][key], doc["cells"][key] = run_cell(case, drop, args)
        say(f"{key}: {cell_line(doc['cells'][key])}")
        save()


def finished(doc: dict[str, Any]) -> set[str]:
    """The cells ``doc`` holds that did not fail."""
    return {k for k, c in doc["cells"].items() if "error" not in c}


def refresh(doc: dict[str, Any], quick: bool, say: Callable[[str], None]) -> None:
    """The runs (``tune.refresh``) and the cells derived again from the tune folders' ``report.json``."""
    tb.refresh(doc, quick)
    doc["method"] = METHOD
    for key, run in doc["runs"].items():
        if "error" not in run:
            commit = doc["cells"].get(key, {}).get("commit")
            doc["cells"][key] = cell_record(run, tb.load_report(Path(run["folder"])), commit)
            say(f"{key}: cell derived again from {run['folder']}/report.json")


# ---------------------------------------------------------------------------------------------------------- plan
def print_plan(args: argparse.Namespace, done: set[str]) -> None:
    """Every cell and its `minreal tune` command line (nothing is trained or written)."""
    print(f"real_models plan: {len(args.only)} model(s) x {len(args.drops)} budget(s), {tb.PROVIDER} at batch "
          f"{' and '.join(map(str, tb.BATCHES))}, work {args.work}{' (quick)' if args.quick else ''}")
    for name in args.only:
        case = model_case(name, args.work, args.drops, prepare=False)
        note = f"; {MODELS[name].note}" if MODELS[name].note else ""
        print(f"\n{name}: {case.describe}; recovery cap {case.recover_epochs} epoch(s){note}")
        for i, drop in enumerate(case.drops):
            key = f"{name}/drop{drop:g}"
            state = "done, skipped (--resume)" if key in done else "cold cache" if i == 0 else "reuses the cache"
            cfg = tb.tune_config(drop, args.quick, case.recover_epochs)
            print(f"  {key} [{state}]\n    {tb.cli_line(case, drop, args.work / 'cache' / name, cfg)}")


# ----------------------------------------------------------------------------------------------------------- main
def new_document(quick: bool, drops: tuple[float, ...]) -> dict[str, Any]:
    base = tb.new_document(quick)
    setting = {k: v for k, v in base["setting"].items() if k != "goal_s"} | {"drops_pp": list(drops)}
    return {"usage": USAGE, "issue": 28, "header": base["header"], "quick": quick, "setting": setting,
            "method": METHOD, "table": [], "table_markdown": "", "cells": {}, "models": {},
            "summary_legend": base["summary_legend"], "summary": {}, "runs": {}}


def load_document(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON at ``--out`` to go on with, else a new one: a run replaces the cells of the models it tunes (all of
    them, or with ``--resume`` the unfinished ones) and keeps every other model's."""
    if not args.out.is_file():
        return new_document(args.quick, args.drops)
    doc = json.loads(args.out.read_text())
    if doc.get("quick") != args.quick:
        raise SystemExit(f"{args.out} holds a {'quick' if doc.get('quick') else 'full'} run; use another --out")
    return doc


def announcer(t0: float) -> Callable[[str], None]:
    """Progress on stderr, one line per step, with the seconds since ``t0``."""
    def say(line: str) -> None:
        print(f"[real_models {time.perf_counter() - t0:6.0f}s] {line}", file=sys.stderr, flush=True)

    return say


def save_document(doc: dict[str, Any], out: Path) -> None:
    """The summary and the table from the cells so far, written atomically."""
    from _common import write_json  # benchmarks/ is on sys.path only when this file runs as a script

    doc["summary"] = tb.summarise(doc)
    doc["table"] = table(doc)
    doc["table_markdown"] = markdown(doc["table"])
    write_json(out, doc)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/real_models.json"))
    ap.add_argument("--only", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--drops", default=",".join(f"{d:g}" for d in DROPS),
                    help="comma-separated accuracy budgets in pp (default %(default)s)")
    ap.add_argument("--work", type=Path, default=tb.ROOT / "runs" / "bench-real-models",
                    help="tune folders, caches, trained weights and data files (default: runs/bench-real-models)")
    ap.add_argument("--resume", action="store_true", help="skip cells the JSON already holds (failed ones run again)")
    ap.add_argument("--refresh", action="store_true",
                    help="derive the runs and cells in --out again from their tune folders' report.json (no tuning)")
    ap.add_argument("--plan", action="store_true", help="print the cells and their `minreal tune` command lines; stop")
    ap.add_argument("--quick", action="store_true", help="smoke test: svd only, grid 0.8/0.5, short protocols")
    args = ap.parse_args()
    tb.check_only_and_quick(ap, args, MODELS, "real_models.json")
    try:
        args.drops = tuple(sorted({float(d) for d in args.drops.split(",") if d.strip()}))
    except ValueError:
        ap.error(f"--drops takes comma-separated numbers, got {args.drops!r}")
    if not args.drops or any(not 0 <= d < 100 for d in args.drops):
        ap.error(f"--drops takes budgets in [0, 100) pp, got {list(args.drops)}")
    if args.refresh and not args.out.is_file():
        ap.error(f"--refresh derives the cells of {args.out} again, which does not exist")
    return args


def main() -> None:
    from _common import stop_without_shared_data

    args = parse()
    stop_without_shared_data("real_models", MODELS, args.only, tb.SHARED)
    if args.plan:
        done = finished(json.loads(args.out.read_text())) if args.resume and args.out.is_file() else set()
        print_plan(args, done)
        return
    doc, say = load_document(args), announcer(time.perf_counter())
    save = partial(save_document, doc, args.out)
    if args.refresh:
        refresh(doc, args.quick, say)
    else:
        doc["setting"]["drops_pp"] = sorted({*doc["setting"].get("drops_pp", []), *args.drops})
        for name in args.only:
            run_model(doc, name, args, save, say)
        doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    save()
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
