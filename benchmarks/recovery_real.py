"""Recovery at the scale of real data (issue 28, item 3): each method at MAC 0.7 and 0.5 on the pretrained CIFAR-10
ResNet-32 and ResNet-44, zero-shot and after the project's recovery of up to 10 epochs on 7,000 real images.

Models (``--only``, default both): the pretrained ResNet-32 and ResNet-44 of ``../shared/data`` (akamaster, option-A
shortcuts) on CIFAR-10 test images decoded from JPEG (ImageNet mean and std), loaded as ``benchmarks/tune.py``'s
``pretrained_cifar_case`` writes them (weights and ``.npz`` splits once under ``--work``): the first 7,000 images
are the calibration data of every method and the training data of every recovery, the last 2,000 are held out and
seen by neither. Without ``../shared/data`` (a user's clone) the script prints one line and exits with status 2.

Methods (``--methods``): svd, factorize, magnitude, wanda and fde by their ``mac_ratio`` budget, each prepared once
per model (``minreal.compress.registry.prepare``: statistics, bases, importances) and realised once per ratio
(``realise``, the budget-dependent phase); cbalanced, which has no MAC budget, by its energy tolerance searched on
a log scale for each ratio exactly as ``benchmarks/recovery.py`` searches it (its ``_cbalanced``: subsampled
Gramians during the search, the defaults for the final run; width multiple 8). A method that refuses a ratio is
recorded with its one-line reason.

Recovery: ``minreal.compress.core.recover.recover`` with ``RecoveryConfig(epochs=E, seed=SEED)`` and every other field
at its default (AdamW, linear warm-up then cosine decay over the whole budget, distillation from the original mixed
with the labels' cross-entropy, 20 % of the 7,000 held out for early stopping with patience 3 and the best weights
kept), the same for every row. The recovery has no per-epoch callback and its cosine schedule spans the budget it
is given, so a model recovered for 10 epochs is not a model recovered for 3 with more steps: each budget of
``--epochs`` (default 0, 1, 3, 5, 10; 0 is the zero-shot model) is a SEPARATE run from a copy of the compressed
model, with its own complete schedule (19 epochs of training per compressed model for the default budgets).

Baseline row ``original``: a label-only reference, the uncompressed network recovered with the same schedule,
epochs and optimiser on the labels alone (``alpha=1``: distilling the original from itself is the identity — its
distillation loss is 0 before any step, so the early stopping on the mixed validation loss kept the untrained
weights of epoch 0). Recovery on JPEG-decoded images also adapts a network to JPEG artefacts; the label-only
reference may adapt more freely than the compressed models, which distil, so read it as an upper bound of that
adaptation, next to the original as published (its budget-0 row).

Per cell: held-out top-1 accuracy, top-1 agreement and KL (T=1) with the original (``held_out_metrics``), the MAC
ratio reached, wall times (prepare, realise or search and compress, recovery, the cell), the recovery's own record
(epochs run, best epoch, early stop) and the load average. ``summary``: per model and ratio, the best method after
each budget against the original after the same recovery (pp), and tables of accuracy and agreement.

The JSON is rewritten atomically after every cell; ``--resume`` skips cells it holds (a compressed model whose
cells are partly done is compressed again alike, cbalanced at the tolerance recorded). ``--plan`` lists the cells
and stops (nothing is read or written). ``--quick`` is a smoke test (ResNet-32, magnitude at 0.5, budgets 0 and 1,
256 images for the method and the recovery, 500 held out) and needs its own ``--out``. Progress: one line per step
on stderr with the seconds elapsed. Run it alone: it takes hours on 2 cores (``estimate``: the seconds per recovery
epoch so far).

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/recovery_real.py --out benchmarks/recovery_real.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import tune as tb
from recovery import Compressed
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.evaluate import predict
from minreal.compress.core.recover import held_out_metrics, recover
from minreal.compress.core.recover_options import RecoveryConfig

USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/recovery_real.py --out benchmarks/recovery_real.json"
MODELS = ("resnet32", "resnet44")
METHODS = ("svd", "factorize", "magnitude", "wanda", "fde", "cbalanced")
RATIOS = (0.7, 0.5)
EPOCHS = (0, 1, 3, 5, 10)
ORIGINAL = "original"
"""The baseline row's method name: the uncompressed network recovered on the labels alone (a label-only reference)."""
ORIGINAL_ALPHA = 1.0
"""The baseline row's label-loss weight: distilling the original from itself is the identity."""
QUICK = dict(only=("resnet32",), methods=("magnitude",), ratios=(0.5,), epochs=(0, 1))
QUICK_SAMPLES, QUICK_HELD_OUT = 256, 500


@dataclass
class Case:
    """A pretrained original, its calibration/recovery data and its held-out data (with its outputs on it)."""

    name: str
    model: nn.Module
    calib: Dataset
    test: Dataset
    test_refs: torch.Tensor
    note: str


Key = tuple[str, str, float, int]
"""A cell: (model, method, requested MAC ratio, recovery epochs); the original's ratio is 1."""


# ---------------------------------------------------------------------------------------------- models and data
def missing_data(only: tuple[str, ...]) -> Path | None:
    """The first file of ``../shared/data`` a selected model needs that is absent (None: all there)."""
    needed = [tb.CIFAR, *(tb.PRETRAINED[name][0] for name in only)]
    return next((p for p in needed if not p.is_file()), None)


def _npz(path: Path, rows: int | None) -> Dataset:
    import numpy as np

    with np.load(path) as data:
        return Dataset(torch.from_numpy(data["x"][:rows]).contiguous(), torch.from_numpy(data["y"][:rows]))


def load_case(name: str, work: Path, quick: bool) -> Case:
    """The pretrained ``name`` and its splits, as ``tune.pretrained_cifar_case`` writes them under ``work``."""
    spec = tb.pretrained_cifar_case(name, work)
    model = tb.PRETRAINED[name][1]()
    model.load_state_dict(torch.load(spec.weights, map_location="cpu", weights_only=True))
    model.eval()
    calib = _npz(Path(spec.data), QUICK_SAMPLES if quick else None)
    test = _npz(Path(spec.eval_data), QUICK_HELD_OUT if quick else None)
    note = spec.describe + (f" (--quick: the first {len(calib)} and {len(test)} of them)" if quick else "")
    return Case(name, model, calib, test, predict(model, test), note)


def original_record(case: Case) -> dict[str, Any]:
    from minreal.compress.core.costs import count_costs, count_macs_torch, whole_model_macs

    x = case.test.x[:2]
    return {"accuracy": held_out_metrics(case.model, case.model, case.test, teacher_outputs=case.test_refs)["accuracy"],
            "macs": whole_model_macs(count_macs_torch(case.model, x), count_costs(case.model, x)),
            "params": sum(p.numel() for p in case.model.parameters()), "calib_samples": len(case.calib),
            "test_samples": len(case.test), "note": case.note}


# ---------------------------------------------------------------------------------------------------- compression
def _report_info(report: Any) -> dict[str, Any]:
    return {"mac_ratio_reached": report.mac_ratio, "macs_after": report.macs_after,
            "params_after": report.params_after}


def _refused(exc: CompressionError) -> Compressed:
    return Compressed(None, {"refused": str(exc).splitlines()[0]})


class Compressor:
    """Each method prepared once per model (the last one kept) and realised per ratio; cbalanced searched per ratio
    with memoised evaluations shared between ratios (``benchmarks/recovery.py``'s ``_cbalanced``)."""

    def __init__(self) -> None:
        self.prepared: tuple[tuple[str, str], Any] | None = None
        self.memo: dict[tuple[str, str], dict[float, float]] = {}

    def _prepare(self, case: Case, method: str, ratio: float) -> Any:
        from minreal.compress.registry import get_method, prepare

        if self.prepared is None or self.prepared[0] != (case.name, method):
            self.prepared = None  # free the previous method's state first
            self.prepared = ((case.name, method),
                             prepare(case.model, case.calib, method, get_method(method).config_cls(mac_ratio=ratio)))
        return self.prepared[1]

    def _budgeted(self, case: Case, method: str, ratio: float) -> Compressed:
        from minreal.compress.registry import get_method, realise

        prepared = self._prepare(case, method, ratio)
        t0 = time.perf_counter()
        new, report = realise(prepared, get_method(method).config_cls(mac_ratio=ratio), measure=False)
        realise_s = time.perf_counter() - t0
        return Compressed(new.eval(), {**_report_info(report), "prepare_s": prepared.seconds,
                                       "prepare_shared_by_ratios": True, "realise_s": realise_s,
                                       "compress_s": prepared.seconds + realise_s})

    def _cbalanced(self, case: Case, ratio: float, known: float | None) -> Compressed:
        import recovery as rb  # benchmarks/recovery.py: its energy-tolerance search, reused as it is

        memo = self.memo.setdefault((case.name, "cbalanced"), {})
        new, info = rb._cbalanced(case, case.calib, ratio, memo, known)
        return Compressed(new.eval(), info)

    def at(self, case: Case, method: str, ratio: float, known: dict[str, float] | None) -> Compressed:
        """``method``'s model of ``case`` at ``ratio`` (``known``: the cbalanced knob earlier cells used)."""
        try:
            if method == "cbalanced":
                return self._cbalanced(case, ratio, (known or {}).get("energy_eps"))
            return self._budgeted(case, method, ratio)
        except CompressionError as exc:
            return _refused(exc)


# ---------------------------------------------------------------------------------------------------------- cells
def _recovery_record(res: Any) -> dict[str, Any]:
    keep = ("epochs", "steps", "best_epoch", "stopped_early", "samples_seen", "held_out_samples", "before", "after")
    return {k: getattr(res, k) for k in keep}


def recovered(case: Case, start: nn.Module, epochs: int, seed: int, alpha: float | None = None) -> dict[str, Any]:
    """A copy of ``start`` recovered for ``epochs`` (0: as it is) on the calibration data; held-out metrics.
    ``alpha``: the label loss's weight (None: the recovery's default)."""
    student = copy.deepcopy(start)
    rec: dict[str, Any] = {"recover_s": 0.0}
    if epochs:
        weights = {} if alpha is None else {"alpha": alpha}
        res = recover(case.model, student, case.calib, RecoveryConfig(epochs=epochs, seed=seed, **weights))
        rec = {"recover_s": res.wall_s, "recovery": _recovery_record(res)}
    test = held_out_metrics(case.model, student, case.test, teacher_outputs=case.test_refs)
    return {"test": test, **rec}


def cell_keys(only: tuple[str, ...], methods: tuple[str, ...], ratios: tuple[float, ...],
              epochs: tuple[int, ...]) -> Iterator[Key]:
    """Per model: the original's budgets, then each method's ratios and budgets."""
    for model in only:
        for e in epochs:
            yield model, ORIGINAL, 1.0, e
        for method in methods:
            for ratio in ratios:
                for e in epochs:
                    yield model, method, ratio, e


def _key(cell: dict[str, Any]) -> Key:
    return cell["model"], cell["method"], cell["mac_ratio_requested"], cell["budget_epochs"]


def _line(cell: dict[str, Any]) -> str:
    head = f"{cell['model']} {cell['method']}@{cell['mac_ratio_requested']:g}"
    if "refused" in cell:
        return f"{head}: refused: {cell['refused']}"
    t, rec = cell["test"], cell.get("recovery", {})
    early = ", stopped early" if rec.get("stopped_early") else ""
    ran = f" ({rec['epochs']} ep run, best {rec['best_epoch']}{early})" if rec else ""
    search = f" search {cell['search_s']:.1f}s" if "search_s" in cell else ""
    return (f"{head} {cell['budget_epochs']} ep (MAC {cell['mac_ratio_reached']:.3f}): acc {t['accuracy']:.4f} "
            f"agree {t['agreement']:.4f} kl {t['kl']:.4f} {search} compress {cell.get('compress_s', 0):.1f}s recover "
            f"{cell['recover_s']:.1f}s{ran} load {cell['loadavg'][0]:.1f}")


class Runner:
    """Runs cells against one JSON document: each model loaded once, each (model, method, ratio) compressed once."""

    def __init__(self, doc: dict[str, Any], args: argparse.Namespace, say: Callable[[str], None]) -> None:
        self.doc, self.args, self.say = doc, args, say
        self.case: Case | None = None
        self.compressor = Compressor()
        self.compressed: tuple[tuple[str, str, float], Compressed] | None = None

    def model(self, name: str) -> Case:
        if self.case is None or self.case.name != name:
            self.case = None
            self.say(f"{name}: loading the pretrained model and the CIFAR-10 splits")
            self.case = load_case(name, self.args.work, self.args.quick)
            self.doc["models"].setdefault(name, original_record(self.case))
            self.say(f"{name}: original held-out accuracy {self.doc['models'][name]['accuracy']:.4f}")
        return self.case

    def start(self, case: Case, method: str, ratio: float) -> Compressed:
        """The model the cells of (model, method, ratio) recover from (the original for the baseline row)."""
        key = (case.name, method, ratio)
        if method == ORIGINAL:
            orig = self.doc["models"][case.name]
            return Compressed(case.model, {"mac_ratio_reached": 1.0, "macs_after": orig["macs"],
                                           "params_after": orig["params"]})
        if self.compressed is None or self.compressed[0] != key:
            self.compressed = None
            known = next((c["knob"] for c in self.doc["cells"] if _key(c)[:3] == key and "knob" in c), None)
            self.say(f"{case.name} {method}@{ratio:g}: compressing")
            self.compressed = (key, self.compressor.at(case, method, ratio, known))
        return self.compressed[1]

    def cell(self, key: Key) -> dict[str, Any]:
        name, method, ratio, epochs = key
        case = self.model(name)
        comp = self.start(case, method, ratio)
        cell: dict[str, Any] = {"model": name, "method": method, "mac_ratio_requested": ratio}
        if comp.model is None:
            return {**cell, **comp.info}
        self.say(f"{name} {method}@{ratio:g}: {'zero-shot' if epochs == 0 else f'recovering {epochs} epoch(s)'}")
        t0 = time.perf_counter()
        # the original distils from itself, which is the identity (its distillation loss is 0 at epoch 0 and the
        # early stopping keeps epoch 0): its row trains on the labels alone, which is what adapts it to the JPEGs
        alpha = ORIGINAL_ALPHA if method == ORIGINAL else None
        result = recovered(case, comp.model, epochs, self.args.seed, alpha)
        return {**cell, "budget_epochs": epochs, **comp.info, **result, "cell_s": time.perf_counter() - t0,
                "loadavg": list(os.getloadavg())}

    def save(self) -> None:
        from _common import write_json  # benchmarks/ is on sys.path only when this file runs as a script

        self.doc["summary"] = summarise(self.doc)
        self.doc["estimate"] = estimate(self.doc)
        write_json(self.args.out, self.doc)

    def run(self, keys: list[Key]) -> None:
        done = {_key(c) for c in self.doc["cells"]}
        todo = [k for k in keys if k not in done]
        for i, key in enumerate(todo, 1):
            refused = {(c["model"], c["method"], c["mac_ratio_requested"]) for c in self.doc["refused"]}
            if key[:3] in refused:
                continue
            cell = self.cell(key)
            self.doc["refused" if "refused" in cell else "cells"].append(cell)
            self.say(f"[{i}/{len(todo)}] {_line(cell)}")
            self.save()


# -------------------------------------------------------------------------------------------------------- summary
def _pp(x: float) -> float:
    return round(100 * x, 2)


def _table(cells: list[dict[str, Any]], metric: str) -> dict[str, dict[str, dict[str, float]]]:
    """``metric`` on the held-out split by method, requested ratio and budget."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for c in cells:
        table.setdefault(c["method"], {}).setdefault(f"{c['mac_ratio_requested']:g}", {})[
            str(c["budget_epochs"])] = round(c["test"][metric], 4)
    return table


def _versus(pool: list[dict[str, Any]], original: dict[str, Any] | None, zero_shot: float) -> dict[str, Any]:
    """The best of ``pool`` (one ratio, one budget) against the original after the same recovery."""
    best = max(pool, key=lambda c: c["test"]["accuracy"])
    acc = best["test"]["accuracy"]
    row = {"best_method": best["method"], "mac_ratio_reached": round(best["mac_ratio_reached"], 4),
           "accuracy": round(acc, 4), "agreement": round(best["test"]["agreement"], 4),
           "pp_vs_original_zero_shot": _pp(acc - zero_shot)}
    if original is not None:
        row.update(original_recovered_accuracy=round(original["test"]["accuracy"], 4),
                   pp_vs_original_recovered=_pp(acc - original["test"]["accuracy"]))
    return row


def _plain(model: str, ratio: str, epochs: str, row: dict[str, Any]) -> str:
    when = "zero-shot" if epochs == "0" else f"after {epochs} epoch(s)"
    head = f"{model} at MAC {ratio}, {when}: best {row['best_method']} {100 * row['accuracy']:.2f} %"
    published = f"{row['pp_vs_original_zero_shot']:+.2f} pp vs the original as published"
    if epochs == "0":
        return f"{head}, {published}"
    vs = (f"{row['pp_vs_original_recovered']:+.2f} pp vs the original after the same recovery "
          f"({100 * row['original_recovered_accuracy']:.2f} %)" if "pp_vs_original_recovered" in row
          else "the original's recovery for this budget not run yet")
    return f"{head}, {vs}; {published}"


def estimate(doc: dict[str, Any]) -> dict[str, Any]:
    """Per model: the median recovery seconds per epoch run so far, and the epochs the setting asks for."""
    import statistics

    s = doc["setting"]
    per_row = sum(s["budgets_epochs"])
    out: dict[str, Any] = {}
    for name in doc["models"]:
        runs = [c["recover_s"] / c["recovery"]["epochs"] for c in doc["cells"]
                if c["model"] == name and c.get("recovery", {}).get("epochs")]
        rows = 1 + len(s["methods"]) * len(s["ratios"])
        out[name] = {"recover_s_per_epoch_median": round(statistics.median(runs), 1) if runs else None,
                     "recovery_epochs_planned": rows * per_row,
                     "note": "early stopping and smaller compressed models shorten it; compression not included"}
    return out


def summarise(doc: dict[str, Any]) -> dict[str, Any]:
    """Per model and ratio, the best method after each budget against the original after the same recovery (pp);
    the accuracy and agreement tables."""
    out: dict[str, Any] = {}
    for name, orig in doc["models"].items():
        cells = [c for c in doc["cells"] if c["model"] == name]
        base = {c["budget_epochs"]: c for c in cells if c["method"] == ORIGINAL}
        ratios: dict[str, Any] = {}
        for c in cells:
            if c["method"] != ORIGINAL:
                ratios.setdefault(f"{c['mac_ratio_requested']:g}", {}).setdefault(str(c["budget_epochs"]), []).append(c)
        best = {r: {e: _versus(pool, base.get(int(e)), orig["accuracy"]) for e, pool in sorted(
            by_e.items(), key=lambda kv: int(kv[0]))} for r, by_e in ratios.items()}
        out[name] = {"original_accuracy": round(orig["accuracy"], 4),
                     "original_recovered_accuracy": {str(e): round(c["test"]["accuracy"], 4)
                                                     for e, c in sorted(base.items())},
                     "best_vs_original_recovered": best,
                     "plain": [_plain(name, r, e, row) for r, by_e in best.items() for e, row in by_e.items()],
                     "accuracy": _table(cells, "accuracy"), "agreement": _table(cells, "agreement")}
    return out


# ----------------------------------------------------------------------------------------------------------- main
def header() -> dict[str, Any]:
    from minreal.runtime_bench.environment import cpu_model

    return {**tb.header(), "cpu_model": cpu_model()}


def new_document(args: argparse.Namespace) -> dict[str, Any]:
    return {"usage": USAGE, "issue": "28, item 3", "header": header(), "quick": args.quick, "seed": args.seed,
            "setting": {"models": list(args.only), "methods": list(args.methods), "ratios": list(args.ratios),
                        "budgets_epochs": list(args.epochs), "recovery": dataclasses.asdict(RecoveryConfig()),
                        "budgets_are_separate_runs": "each budget recovers a fresh copy of the compressed model "
                                                     "with its own warm-up and cosine schedule (the recovery has no "
                                                     "per-epoch callback)",
                        "budget_methods": "svd, factorize, magnitude, wanda, fde: mac_ratio, prepared once per "
                                          "model, realised per ratio; cbalanced: energy_eps searched per ratio "
                                          "(benchmarks/recovery.py's search; its own training off, epochs=0)",
                        "baseline": f"method '{ORIGINAL}': a label-only reference, the uncompressed network "
                                    "recovered with the same schedule on the labels alone (alpha "
                                    f"{ORIGINAL_ALPHA}: distilling the original from itself is the identity, and its "
                                    "early stopping would keep epoch 0); an upper bound of the JPEG adaptation"},
            "metrics": "test: the last 2,000 images, never seen by a method or a recovery; agreement = top-1 "
                       "agreement with the original, kl = KL(original || model) at T=1, batchmean; "
                       "recovery.before/after: the recovery's own held-out share (val_fraction) of the 7,000; "
                       "times in seconds, wall clock, with other jobs' load in loadavg",
            "models": {}, "cells": [], "refused": [], "runs": []}


def _tuple(ap: argparse.ArgumentParser, text: str | None, cast: Callable[[str], Any], default: tuple,
           flag: str) -> tuple:
    if text is None:
        return default
    try:
        return tuple(dict.fromkeys(cast(t.strip()) for t in text.split(",") if t.strip()))
    except ValueError:
        ap.error(f"{flag} takes comma-separated values, got {text!r}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/recovery_real.json"))
    ap.add_argument("--only", default=None, help=f"comma-separated models, from {', '.join(MODELS)} (default all)")
    ap.add_argument("--methods", default=None, help=f"comma-separated, from {', '.join(METHODS)} (default all)")
    ap.add_argument("--ratios", default=None, help="comma-separated MAC ratios (default 0.7,0.5)")
    ap.add_argument("--epochs", default=None, help="comma-separated recovery budgets (default 0,1,3,5,10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=tb.ROOT / "runs" / "bench-recovery-real",
                    help="pretrained weights and data splits (default: runs/bench-recovery-real, ignored by git)")
    ap.add_argument("--resume", action="store_true", help="keep the cells OUT already holds and skip them")
    ap.add_argument("--plan", action="store_true", help="list the cells and stop (nothing is read or written)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: resnet32, magnitude at 0.5, budgets 0 and 1, 256 images (needs its own --out)")
    args = ap.parse_args(argv)
    quick = QUICK if args.quick else dict(only=MODELS, methods=METHODS, ratios=RATIOS, epochs=EPOCHS)
    args.only = ",".join(quick["only"]) if args.only is None else args.only
    tb.check_only_and_quick(ap, args, MODELS, "recovery_real.json")
    args.only = tuple(args.only)
    args.methods = _tuple(ap, args.methods, str, quick["methods"], "--methods")
    args.ratios = _tuple(ap, args.ratios, float, quick["ratios"], "--ratios")
    args.epochs = tuple(sorted(_tuple(ap, args.epochs, int, quick["epochs"], "--epochs")))
    if set(args.methods) - set(METHODS):
        ap.error(f"unknown method {', '.join(sorted(set(args.methods) - set(METHODS)))}; choose from "
                 f"{', '.join(METHODS)}")
    if not all(0 < r < 1 for r in args.ratios) or any(e < 0 for e in args.epochs):
        ap.error(f"--ratios take values in (0, 1) and --epochs values >= 0, got {args.ratios} and {args.epochs}")
    return args


def print_plan(args: argparse.Namespace, keys: list[Key], done: set[Key]) -> None:
    print(f"recovery_real plan: {len(keys)} cells ({len(done & set(keys))} done), models {', '.join(args.only)}, "
          f"methods {', '.join(args.methods)} + {ORIGINAL}, ratios {args.ratios}, budgets {args.epochs} epochs, "
          f"{sum(k[3] for k in keys)} recovery epochs in all, work {args.work}{' (quick)' if args.quick else ''}")
    for key in keys:
        print(f"  {key[0]} {key[1]}@{key[2]:g} {key[3]} ep{' [done]' if key in done else ''}")


def load_document(args: argparse.Namespace) -> dict[str, Any]:
    if not (args.resume and args.out.is_file()):
        return new_document(args)
    doc = json.loads(args.out.read_text())
    if doc.get("quick") != args.quick:
        raise SystemExit(f"{args.out} holds a {'quick' if doc.get('quick') else 'full'} run; use another --out")
    return doc


def main() -> None:
    args = parse()
    keys = list(cell_keys(args.only, args.methods, args.ratios, args.epochs))
    if args.plan:
        doc = json.loads(args.out.read_text()) if args.resume and args.out.is_file() else {"cells": []}
        print_plan(args, keys, {_key(c) for c in doc["cells"]})
        return
    missing = missing_data(args.only)
    if missing is not None:
        print(f"recovery_real: {missing} is missing (../shared/data is absent or incomplete, as in a user's clone); "
              "nothing measured", file=sys.stderr)
        sys.exit(2)
    t0 = time.perf_counter()

    def say(line: str) -> None:
        print(f"[recovery_real {time.perf_counter() - t0:7.0f}s] {line}", file=sys.stderr, flush=True)

    doc = load_document(args)
    runner = Runner(doc, args, say)
    runner.run(keys)
    doc["runs"].append({"argv": sys.argv[1:], "wall_s": round(time.perf_counter() - t0, 1),
                        "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    runner.save()
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
