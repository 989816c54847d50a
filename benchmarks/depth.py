"""Depth as structure (issue 42): residual blocks removed from the pretrained CIFAR-10 ResNet-32 and ResNet-44, by each
criterion, zero-shot and after the shared recovery, and the INT8 files of the cuts timed against the original's.

Models (``--only``, default both): the pretrained ResNet-32 and ResNet-44 of ``../shared/data`` (akamaster, option-A
shortcuts) on CIFAR-10 test images decoded from JPEG, loaded as ``benchmarks/recovery_real.py`` loads them: the first
7,000 images are the calibration data of the method (its 512 scoring samples are a seeded subset of them) and the
training data of every recovery, the last 2,000 are held out and seen by neither. Without ``../shared/data`` the
script prints one line and exits with status 2.

Phases (``--phases``, default all, in this order; each cell is saved as it finishes and ``--resume`` skips the cells
the JSON holds):

- ``zero_shot``: per model and criterion (:data:`minreal.compress.methods.depth.CRITERIA`), ``prepare`` once (timed)
  and ``realise`` at each MAC ratio of ``--ratios`` (0.8, 0.7, 0.6): held-out top-1, agreement and KL with the
  original, the MAC ratio reached and the blocks removed;
- ``recovered``: the cuts of ``--recover`` (``criterion@ratio`` per model; default: every criterion at 0.7 on
  ResNet-32, so that the default criterion is the one that wins after recovery, and the default criterion at every
  ratio on both models) recovered exactly as ``benchmarks/recovery_real.py`` recovers (``recover`` with
  ``RecoveryConfig(epochs=10, seed=0)``, every other field at its default), held-out metrics after it. The baseline
  rows (the original given the same recovery on the labels, factorize and magnitude at MAC 0.7 and 0.5) are read from
  ``benchmarks/recovery_real.json``, where the same recovery ran on the same splits with the same seed (``baselines``
  names the file and its commit): ratios 0.8 and 0.6 have no factorize/magnitude row;
- ``latency``: the original and the recovered cuts of the default criterion, each exported (``export_variant``) and
  quantised to INT8 (``quantize_int8``, default config, this CPU's format, 256 calibration images), timed with
  runtime_bench in ``--processes`` fresh processes (interleaved, order rotated), batch 1 and 32, the project's default
  threads: per file the pooled p50 and per process the ratio to the original's INT8 and fp32 in that same process
  (median, min, max); the INT8 files' held-out top-1 in ONNX Runtime.

``summary``: per model and ratio, the default criterion's recovered cut against the original given the same recovery
(pp), its INT8 speed-up over the original's INT8 at batch 1 and 32 (median and range over processes), whether the
issue's goal (within 1 pp, >= 1.35x) and the INT8 bound (latency ratio <= MAC ratio + 0.05) hold, and which criterion
wins zero-shot and after recovery, in plain words.

Run it alone on a quiet machine (``OMP_WAIT_POLICY=PASSIVE``): the load average is recorded per cell.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/depth.py --out benchmarks/depth.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
from _common import write_json
from recovery_real import Case, load_case, missing_data

from minreal.app.tune.candidate import CHAIN_FIRST_SHARE
from minreal.compress.core.recover import held_out_metrics, recover
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.methods.depth import CRITERIA, DEFAULT_CRITERION, DepthConfig
from minreal.compress.registry import prepare, realise

USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/depth.py --out benchmarks/depth.json"
MODELS = ("resnet32", "resnet44")
RATIOS = (0.8, 0.7, 0.6)
EPOCHS, SEED = 10, 0
PHASES = ("zero_shot", "recovered", "latency", "bert")
BERT_EPOCHS = 1
GOAL_PP, GOAL_SPEEDUP, INT8_SLACK = 1.0, 1.35, 0.05
CHAIN = "depth+magnitude"
"""A recovered cell's "criterion" for tune's chain candidate (depth, then magnitude)."""
BASELINES = Path(__file__).with_name("recovery_real.json")
ROOT = Path(__file__).resolve().parent.parent


def default_recoveries(models: tuple[str, ...], ratios: tuple[float, ...]) -> list[tuple[str, str, float]]:
    """Every criterion at 0.7 on the first model, then the default criterion at every ratio on each model."""
    cells = [(models[0], c, 0.7) for c in CRITERIA if 0.7 in ratios]
    cells += [(m, DEFAULT_CRITERION, r) for m in models for r in ratios]
    return list(dict.fromkeys(cells))


def say_to(t0: float) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"[{time.time() - t0:7.0f} s] {line}", file=sys.stderr, flush=True)
    return say


class Runner:
    """The document, the loaded cases and the prepared states (one ``prepare`` per model and criterion)."""

    def __init__(self, doc: dict[str, Any], args: argparse.Namespace, say: Callable[[str], None]) -> None:
        self.doc, self.args, self.say = doc, args, say
        self.cases: dict[str, Case] = {}
        self.prepared: dict[tuple[str, str], Any] = {}

    def case(self, name: str) -> Case:
        if name not in self.cases:
            self.cases[name] = load_case(name, self.args.work, self.args.quick)
            self.doc["models"][name] = {"note": self.cases[name].note, "accuracy": held_out_metrics(
                self.cases[name].model, self.cases[name].model, self.cases[name].test,
                teacher_outputs=self.cases[name].test_refs)["accuracy"]}
        return self.cases[name]

    def prep(self, model: str, criterion: str) -> Any:
        key = (model, criterion)
        if key not in self.prepared:
            case = self.case(model)
            t0 = time.perf_counter()
            self.prepared[key] = prepare(case.model, case.calib, "depth", DepthConfig(criterion=criterion))
            self.doc["prepare_s"].setdefault(model, {})[criterion] = round(time.perf_counter() - t0, 2)
            self.say(f"{model}: prepared {criterion} in {time.perf_counter() - t0:.1f} s")
        return self.prepared[key]

    def cut(self, model: str, criterion: str, ratio: float) -> tuple[torch.nn.Module, Any]:
        if criterion == CHAIN:
            return self.chain(model, ratio)
        return realise(self.prep(model, criterion), DepthConfig(criterion=criterion, mac_ratio=ratio), measure=False)

    def chain(self, model: str, ratio: float) -> tuple[torch.nn.Module, Any]:
        """``tune``'s chain candidate: depth (default criterion) takes half of the MAC cut, magnitude the rest on
        depth's model (``minreal.app.tune.candidate._chained``)."""
        from minreal.compress.core.costs import count_macs_torch
        from minreal.compress.methods.magnitude import MagnitudeConfig

        case = self.case(model)
        mid, head = self.cut(model, DEFAULT_CRITERION, 1 - CHAIN_FIRST_SHARE * (1 - ratio))
        new, report = realise(prepare(mid, case.calib, "magnitude", MagnitudeConfig(mac_ratio=ratio / head.mac_ratio)),
                              MagnitudeConfig(mac_ratio=ratio / head.mac_ratio), measure=False)
        example = case.calib.x[:1]
        report.predicted.removed = head.predicted.removed
        report.macs_after = count_macs_torch(new, example).macs
        report.macs_before = count_macs_torch(case.model, example).macs
        return new, report

    def save(self) -> None:
        self.doc["summary"] = summarise(self.doc)
        self.doc["table_markdown"] = table_markdown(self.doc)
        write_json(self.args.out, self.doc)


def _cell_key(cell: dict[str, Any]) -> tuple[Any, ...]:
    return cell["model"], cell["criterion"], cell["ratio"]


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def zero_shot(run: Runner) -> None:
    done = {_cell_key(c) for c in run.doc["zero_shot"]}
    for model in run.args.only:
        for criterion in CRITERIA:
            for ratio in run.args.ratios:
                if (model, criterion, ratio) in done:
                    continue
                case = run.case(model)
                new, report = run.cut(model, criterion, ratio)
                test = held_out_metrics(case.model, new, case.test, teacher_outputs=case.test_refs)
                run.doc["zero_shot"].append({
                    "model": model, "criterion": criterion, "ratio": ratio,
                    "mac_ratio_reached": round(report.mac_ratio, 4), "removed": report.predicted["removed"],
                    "test": test, "loadavg": _load()})
                run.say(f"{model} {criterion}@{ratio}: MAC {report.mac_ratio:.3f}, held-out top-1 "
                        f"{100 * test['accuracy']:.2f} %, agreement {100 * test['agreement']:.2f} %")
                run.save()


def _weights_path(run: Runner, model: str, criterion: str, ratio: float) -> Path:
    return run.args.work / "depth" / f"{model}-{criterion}-{ratio:g}.pt"


def recovered(run: Runner) -> None:
    done = {_cell_key(c) for c in run.doc["recovered"]}
    for model, criterion, ratio in run.args.recover:
        if model not in run.args.only or (model, criterion, ratio) in done:
            continue
        case = run.case(model)
        new, report = run.cut(model, criterion, ratio)
        t0 = time.perf_counter()
        res = recover(case.model, new, case.calib, RecoveryConfig(epochs=run.args.epochs, seed=SEED))
        test = held_out_metrics(case.model, new, case.test, teacher_outputs=case.test_refs)
        path = _weights_path(run, model, criterion, ratio)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(new.state_dict(), path)
        run.doc["recovered"].append({
            "model": model, "criterion": criterion, "ratio": ratio, "mac_ratio_reached": round(report.mac_ratio, 4),
            "removed": report.predicted["removed"], "epochs": run.args.epochs, "test": test,
            "recover_s": round(time.perf_counter() - t0, 1),
            "recovery": {"epochs": res.epochs, "best_epoch": res.best_epoch, "stopped_early": res.stopped_early},
            "loadavg": _load()})
        run.say(f"{model} {criterion}@{ratio} recovered {run.args.epochs} epochs in {time.perf_counter() - t0:.0f} s: "
                f"held-out top-1 {100 * test['accuracy']:.2f} %")
        run.save()


def bert(run: Runner) -> None:
    """The BERT-style encoder of ``benchmarks/real_models.py`` (4 pre-LN layers: 8 sub-blocks): every criterion
    zero-shot and the default one recovered for :data:`BERT_EPOCHS` epoch, at each ratio; which sub-blocks went,
    and which layers went whole."""
    from real_models import bert_case

    from minreal.app.data import load_data
    from minreal.app.models import load_model

    done = {(c["criterion"], c["ratio"], c["epochs"]) for c in run.doc["bert"].get("cells", [])}
    case = bert_case(run.args.work)
    model = load_model(case.model, weights=case.weights).eval()
    loaded = load_data(case.data, eval_spec=case.eval_data)
    calib, test = loaded.calib, loaded.evaluation
    refs = held_out_metrics(model, model, test)
    run.doc["bert"].update(note=case.describe, accuracy=refs["accuracy"])
    for criterion in CRITERIA:
        prep = prepare(model, calib, "depth", DepthConfig(criterion=criterion))
        for ratio in run.args.ratios:
            for epochs in (0, BERT_EPOCHS) if criterion == DEFAULT_CRITERION else (0,):
                if (criterion, ratio, epochs) in done:
                    continue
                new, report = realise(prep, DepthConfig(criterion=criterion, mac_ratio=ratio), measure=False)
                if epochs:
                    recover(model, new, calib, RecoveryConfig(epochs=epochs, seed=SEED))
                test_m = held_out_metrics(model, new, test)
                removed = report.predicted["removed"]
                layers = sorted({n.split("/")[0] for n in removed if sum(m.startswith(n.split("/")[0] + "/")
                                                                         for m in removed) == 2})
                run.doc["bert"].setdefault("cells", []).append({
                    "criterion": criterion, "ratio": ratio, "epochs": epochs,
                    "mac_ratio_reached": round(report.mac_ratio, 4), "removed": removed, "whole_layers": layers,
                    "test": test_m, "prepare_s": round(prep.seconds, 2), "loadavg": _load()})
                run.say(f"bert {criterion}@{ratio} +{epochs} epoch(s): MAC {report.mac_ratio:.3f}, held-out "
                        f"{100 * test_m['accuracy']:.2f} % (original {100 * refs['accuracy']:.2f} %), removed "
                        f"{', '.join(removed)}")
                run.save()


def latency(run: Runner) -> None:
    import int8_width as iw

    from minreal.runtime_bench import BenchConfig

    for model in run.args.only:
        if model in run.doc["latency"]:
            continue
        case = run.case(model)
        cuts = [c for c in run.doc["recovered"] if c["model"] == model and c["criterion"] in (DEFAULT_CRITERION, CHAIN)]
        if not cuts:
            continue
        folder = run.args.work / "depth" / f"{model}-files"
        folder.mkdir(parents=True, exist_ok=True)
        pick = np.sort(np.random.default_rng(0).choice(len(case.calib), 256, replace=False))
        calib = case.calib.x[torch.from_numpy(pick)]
        files = {iw.ORIGINAL: iw.write_variant(iw.ORIGINAL, case.model, calib, folder)}
        for c in cuts:
            new, _ = run.cut(model, c["criterion"], c["ratio"])
            new.load_state_dict(torch.load(_weights_path(run, model, c["criterion"], c["ratio"]), weights_only=True))
            name = f"{'depth' if c['criterion'] == DEFAULT_CRITERION else 'chain'}@{c['ratio']:g}"
            files[name] = iw.write_variant(name, new.eval(), calib, folder)
        config = BenchConfig(providers=("cpu",), batch_sizes=iw.BATCHES, repeats=run.args.processes,
                             min_seconds=run.args.min_seconds)
        procs, pooled, top1 = iw.time_files(files, case.test.x, case.test.y.numpy(), config)
        rows = iw.latency_rows(list(files), procs, pooled, iw.BATCHES)
        run.doc["latency"][model] = {
            "files": {k: {"macs": f["macs"], "params": f["params"], "quantization": f["quantization"]}
                      for k, f in files.items()},
            "rows": rows, "onnx_top1": top1, "loadavg": _load()}
        run.say(f"{model}: timed {len(files)} models in {run.args.processes} processes")
        run.save()


# ---------------------------------------------------------------------------------------------------- summary
def baselines() -> dict[str, Any]:
    """The rows of ``recovery_real.json`` this benchmark compares with (same splits, seed and recovery)."""
    if not BASELINES.is_file():
        return {}
    doc = json.loads(BASELINES.read_text())
    rows: dict[str, Any] = {"source": BASELINES.name, "commit": doc.get("header", {}).get("git", {}).get("commit")}
    for c in doc.get("cells", []):
        if c.get("budget_epochs") in (0, EPOCHS) and c["method"] in ("original", "factorize", "magnitude"):
            key = f"{c['method']}@{c['mac_ratio_requested']:g}/{c['budget_epochs']}"
            rows.setdefault(c["model"], {})[key] = c["test"]
    return rows


def _pp(a: float, b: float) -> float:
    return round(100 * (a - b), 2)


def _best(cells: list[dict[str, Any]], model: str, ratio: float) -> str | None:
    pool = [c for c in cells if c["model"] == model and c["ratio"] == ratio]
    return max(pool, key=lambda c: c["test"]["accuracy"])["criterion"] if pool else None


def _speedup(doc: dict[str, Any], model: str, ratio: float, batch: int) -> dict[str, Any] | None:
    row = doc["latency"].get(model, {}).get("rows", {}).get(f"depth@{ratio:g}", {}).get("int8", {}).get(str(batch))
    if row is None:
        return None
    r = row["vs_original_int8"]
    return {"int8_latency_ratio": r["median"], "range": [r["min"], r["max"]],
            "speedup": round(1 / r["median"], 3), "speedup_range": [round(1 / r["max"], 3), round(1 / r["min"], 3)]}


def summarise(doc: dict[str, Any]) -> dict[str, Any]:
    base = doc.get("baselines", {})
    out: dict[str, Any] = {}
    for model in doc["models"]:
        original = base.get(model, {}).get(f"original@1/{EPOCHS}")
        for ratio in sorted({c["ratio"] for c in doc["zero_shot"] if c["model"] == model}, reverse=True):
            entry: dict[str, Any] = {"best_zero_shot": _best(doc["zero_shot"], model, ratio),
                                     "best_recovered": _best(doc["recovered"], model, ratio)}
            cell = next((c for c in doc["recovered"] if c["model"] == model and c["ratio"] == ratio
                         and c["criterion"] == DEFAULT_CRITERION), None)
            if cell is not None and original is not None:
                entry["default_recovered_accuracy"] = cell["test"]["accuracy"]
                entry["pp_vs_original_recovered"] = _pp(cell["test"]["accuracy"], original["accuracy"])
                entry["mac_ratio_reached"] = cell["mac_ratio_reached"]
            for batch in (1, 32):
                s = _speedup(doc, model, ratio, batch)
                if s is not None:
                    entry[f"batch{batch}"] = {**s, "int8_bound_holds": s["int8_latency_ratio"] <= (
                        entry.get("mac_ratio_reached", ratio) + INT8_SLACK)}
            if "pp_vs_original_recovered" in entry and "batch1" in entry and "batch32" in entry:
                entry["goal_met"] = (entry["pp_vs_original_recovered"] >= -GOAL_PP and min(
                    entry["batch1"]["speedup"], entry["batch32"]["speedup"]) >= GOAL_SPEEDUP)
            out.setdefault(model, {})[f"{ratio:g}"] = entry
    return out


def _acc(cells: list[dict[str, Any]], model: str, criterion: str, ratio: float) -> str:
    cell = next((c for c in cells if (c["model"], c["criterion"], c["ratio"]) == (model, criterion, ratio)), None)
    return "-" if cell is None else f"{100 * cell['test']['accuracy']:.2f}"


def _times(s: dict[str, Any] | None) -> str:
    return "-" if s is None else f"{s['speedup']:.2f}x ({s['speedup_range'][0]:.2f}-{s['speedup_range'][1]:.2f})"


def table_markdown(doc: dict[str, Any]) -> str:
    """The README's depth table: per model and ratio, the MAC ratio reached, held-out top-1 zero-shot by criterion
    and after recovery, the baselines after the same recovery, and the INT8 speed-ups over the original's INT8."""
    base = doc.get("baselines", {})
    head = ("| model | MAC asked (reached) | zero-shot top-1 %: energy / observability / removal / greedy | recovered "
            f"top-1 %: {DEFAULT_CRITERION} (original, factorize, magnitude at 0.7) | INT8 speed-up vs original.int8, "
            "b1 / b32 |")
    rows = [head, "| --- | --- | --- | --- | --- |"]
    for model in doc["models"]:
        b = base.get(model, {})
        for ratio in doc["settings"]["ratios"]:
            reached = next((c["mac_ratio_reached"] for c in doc["zero_shot"]
                            if c["model"] == model and c["ratio"] == ratio), None)
            if reached is None:
                continue
            zs = " / ".join(_acc(doc["zero_shot"], model, c, ratio) for c in ("energy", "observability", "removal",
                                                                                "greedy"))
            refs = [b.get(k) for k in (f"original@1/{EPOCHS}", f"factorize@0.7/{EPOCHS}", f"magnitude@0.7/{EPOCHS}")]
            ref = ", ".join("-" if r is None else f"{100 * r['accuracy']:.2f}" for r in refs)
            rec = f"{_acc(doc['recovered'], model, DEFAULT_CRITERION, ratio)} ({ref})"
            speed = " / ".join(_times(_speedup(doc, model, ratio, batch)) for batch in (1, 32))
            rows.append(f"| {model} | {ratio:g} ({reached:.3f}) | {zs} | {rec} | {speed} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------------------- main
def _recover_cells(text: str | None, models: tuple[str, ...], ratios: tuple[float, ...]
                   ) -> list[tuple[str, str, float]]:
    if not text:
        return default_recoveries(models, ratios)
    cells = []
    for item in text.split(","):
        model, _, rest = item.partition(":")
        criterion, _, ratio = rest.partition("@")
        if model not in MODELS or criterion not in (*CRITERIA, CHAIN):
            raise SystemExit(f"depth benchmark: --recover {item!r}: give model:criterion@ratio, e.g. "
                             "resnet32:greedy@0.7")
        cells.append((model, criterion, float(ratio)))
    return cells


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-depth")
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--ratios", default=",".join(map(str, RATIOS)))
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--recover", default=None, help="model:criterion@ratio,... (default: see the docstring)")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--quick", action="store_true", help="smoke test: 256 calibration and 500 held-out images")
    args = ap.parse_args()
    args.only = tuple(m for m in args.only.split(",") if m)
    args.ratios = tuple(float(r) for r in args.ratios.split(","))
    args.phases = tuple(p for p in args.phases.split(",") if p)
    bad = [m for m in args.only if m not in MODELS] + [p for p in args.phases if p not in PHASES]
    if bad:
        raise SystemExit(f"depth benchmark: unknown model or phase {bad[0]!r}")
    args.recover = _recover_cells(args.recover, args.only, args.ratios)
    return args


def header() -> dict[str, Any]:
    import subprocess

    import onnxruntime

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
            "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def main() -> None:
    args = parse()
    missing = missing_data(args.only)
    if missing is not None:
        print(f"depth benchmark: {missing} is missing (../shared/data); nothing was measured", file=sys.stderr)
        raise SystemExit(2)
    doc: dict[str, Any] = {"usage": USAGE, "issue": 42, "header": header(), "models": {}, "prepare_s": {},
                           "zero_shot": [], "recovered": [], "latency": {}, "bert": {}}
    if args.resume and args.out.is_file():
        doc = {**doc, **json.loads(args.out.read_text()), "header": doc["header"]}
    doc["settings"] = {"ratios": list(args.ratios), "criteria": list(CRITERIA), "default": DEFAULT_CRITERION,
                       "recovery": {"epochs": args.epochs, "seed": SEED, "data": "the 7,000 calibration images"},
                       "recover_cells": [list(c) for c in args.recover], "processes": args.processes,
                       "goal": {"within_pp": GOAL_PP, "int8_speedup": GOAL_SPEEDUP, "int8_slack": INT8_SLACK}}
    doc["baselines"] = baselines()
    run = Runner(doc, args, say_to(time.time()))
    for phase in args.phases:
        {"zero_shot": zero_shot, "recovered": recovered, "latency": latency, "bert": bert}[phase](run)
    run.save()


if __name__ == "__main__":
    main()
