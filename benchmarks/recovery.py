"""Recovery after compression (issue 13): how much accuracy a short distillation from the original buys back.

Models: the trained CIFAR ResNet-20 on ``digits32`` (``trained_models.resnet20_digits32``, the width benchmark's
setting) and the embedded demo's digits CNN (``minreal demo``'s ``digits-cnn``, trained as the demo trains it).
Each method (svd, factorize, magnitude, wanda and fde by their ``mac_ratio`` budget; cbalanced by its energy
tolerance, searched on a log scale for each ratio) compresses the original at MAC ratios 0.7/0.5/0.3, once per
(method, ratio, data setting); each recovery budget then starts from a copy of that model, so every budget has
its own cosine schedule. Data settings: ``labelled`` (the whole calibration split with labels: distillation +
cross-entropy) and ``unlabelled256`` (its first 256 inputs only, for the method and the recovery alike: pure
distillation). Accuracy, top-1 agreement and KL (T=1) to the original are measured on the held-out split that
neither the method nor the recovery ever saw; wall times of compression and recovery and the load average are
recorded per cell (other jobs share this machine's cores, so the times are inflated, not comparable across runs).

Sections: ``grid`` (above; on ResNet-20 the labelled 10-epoch cells at 0.7/0.3 run last, after ``compile`` and
``int8``), ``compile`` (eager vs ``torch.compile`` per recovery step and for a whole 3-epoch recovery, written
to ``--compile-out``) and ``int8`` (at 0.5 for the best method after 3 epochs: post-training INT8 of the
recovered model vs INT8 with the ranges of a quantisation-aware recovery, next to the original in fp32 and
INT8, every accuracy measured with ONNX Runtime on the CPU). The JSON is rewritten atomically after every cell;
``--resume`` skips the cells it already holds.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/recovery.py --out benchmarks/recovery.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import write_json
from torch import nn
from trained_models import resnet20_digits32

from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.recover import held_out_metrics, recover
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.train import distillation_loss, task_loss
from minreal.compress.registry import compress, get_method
from minreal.export.int8 import resolve_target

METHODS = ("svd", "factorize", "magnitude", "wanda", "fde", "cbalanced")
RATIOS = (0.7, 0.5, 0.3)
LABELLED_BUDGETS = (0, 1, 3, 10)
UNLABELLED_BUDGETS = (0, 1, 3, 10)
UNLABELLED_SAMPLES = 256
LATE_BUDGET = 10
"""On ResNet-20 the labelled cells of this budget at ratios other than :data:`GOAL_RATIO` run last."""
GOAL_RATIO, GOAL_EPOCHS, GOAL_PP = 0.5, 3, 1.0
WIDTH_MULTIPLE = 8  # the CPU provider's width multiple, as in width_resnet20.py
CB_SEARCH = dict(gramian_samples=1000, go_samples=300)
"""cbalanced's Gramian subsamples while its energy tolerance is searched (the final run uses its defaults)."""
CB_EPS_RANGE, CB_TOL, CB_EVALS = (1e-6, 0.5), 0.02, 6
CALIB_INT8 = 256


@dataclass
class Case:
    """A trained original, its calibration split (methods and recovery) and its held-out split (measurement)."""

    name: str
    model: nn.Module
    calib: Dataset
    test: Dataset
    note: str


@dataclass
class Grid:
    """The cells to run: models × settings × methods × ratios × budgets."""

    models: tuple[str, ...]
    methods: tuple[str, ...] = METHODS
    ratios: tuple[float, ...] = RATIOS
    budgets: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {"labelled": LABELLED_BUDGETS, "unlabelled256": UNLABELLED_BUDGETS})

    def cells(self, late: bool) -> Iterator[tuple[str, str, str, float, int]]:
        """(model, setting, method, ratio, budget), the late ones (see :data:`LATE_BUDGET`) or the others."""
        for model in self.models:
            for setting, budgets in self.budgets.items():
                for method in self.methods:
                    for ratio in self.ratios:
                        for budget in budgets:
                            is_late = (model == "resnet20" and setting == "labelled" and budget == LATE_BUDGET
                                       and ratio != GOAL_RATIO)
                            if is_late == late:
                                yield model, setting, method, ratio, budget


# ---------------------------------------------------------------------------------------------- models and data
def resnet20_case() -> Case:
    from minreal.compress.datasets import digits32

    trained = resnet20_digits32()
    r = trained.record
    calib, test = digits32(r.seed)  # the split the cached model was trained on (its calibration part)
    return Case("resnet20", trained.model.eval(), calib, test,
                f"resnet20_cifar (option A) trained {r.epochs} epochs on digits32's calibration split (seed {r.seed})")


def demo_cnn_case() -> Case:
    from minreal.app.demo import demo_factories

    demo = demo_factories()["digits-cnn"](True)
    return Case("demo_cnn", demo.model.eval(), demo.train, demo.test,
                "minreal demo's digits-cnn: small_cnn(1, (32, 64, 64), 10) on 8x8 digits, trained as the demo "
                "trains it (12 epochs)")


CASES: dict[str, Callable[[], Case]] = {"resnet20": resnet20_case, "demo_cnn": demo_cnn_case}


def setting_data(case: Case, setting: str) -> Dataset:
    """The data a method and the recovery get: the labelled calibration split, or its first inputs alone."""
    return case.calib if setting == "labelled" else Dataset(case.calib.x[:UNLABELLED_SAMPLES])


def original_record(case: Case) -> dict[str, Any]:
    from minreal.compress.core.costs import count_costs, count_macs_torch, whole_model_macs

    x = case.test.x[:2]
    metrics = held_out_metrics(case.model, case.model, case.test)
    return {"accuracy": metrics["accuracy"], "macs": whole_model_macs(count_macs_torch(case.model, x),
                                                                      count_costs(case.model, x)),
            "params": sum(p.numel() for p in case.model.parameters()), "calib_samples": len(case.calib),
            "test_samples": len(case.test), "note": case.note}


# ---------------------------------------------------------------------------------------------------- compression
@dataclass
class Compressed:
    """A method's result at one ratio (None when it refused) and what the cell records about it."""

    model: nn.Module | None
    info: dict[str, Any]


def _run_method(case: Case, data: Dataset, method: str, config: Any) -> tuple[nn.Module, dict[str, Any]]:
    t0 = time.perf_counter()
    new, report = compress(case.model, data, method, config)
    return new, {"mac_ratio_reached": report.mac_ratio, "macs_after": report.macs_after,
                 "params_after": report.params_after, "compress_s": time.perf_counter() - t0}


def _log_search(f: Callable[[float], float], target: float, memo: dict[float, float]) -> float:
    """Knob in :data:`CB_EPS_RANGE` whose (decreasing) ``f`` is nearest ``target``: regula falsi in log space over
    memoised evaluations, shared between targets."""
    lo, hi = CB_EPS_RANGE
    for k in (lo, hi):
        if k not in memo:
            memo[k] = f(k)
    for _ in range(CB_EVALS):
        best = min(memo, key=lambda k: abs(memo[k] - target))
        above = [k for k in memo if memo[k] >= target]
        below = [k for k in memo if memo[k] < target]
        if abs(memo[best] - target) <= CB_TOL or not above or not below:
            return best
        a, b = max(above), min(below)
        la, lb = math.log(a), math.log(b)
        t = (memo[a] - target) / max(memo[a] - memo[b], 1e-12)
        t = t if 0.1 < t < 0.9 else 0.5  # fall back to bisection near an end of the bracket
        k = math.exp(la + t * (lb - la))
        memo[k] = f(k)
    return min(memo, key=lambda k: abs(memo[k] - target))


def _cbalanced(case: Case, data: Dataset, ratio: float, memo: dict[float, float], known: float | None
               ) -> tuple[nn.Module, dict]:
    """cbalanced at the energy tolerance searched for ``ratio`` (or ``known``, the one earlier cells used)."""
    from minreal.compress.methods.cbalanced import CBalancedConfig

    def cfg(eps: float, **extra: Any) -> Any:
        return CBalancedConfig(energy_eps=eps, controls=False, width_multiple=WIDTH_MULTIPLE, **extra)

    if known is not None:
        new, info = _run_method(case, data, "cbalanced", cfg(known))
        return new, {**info, "knob": {"energy_eps": known},
                     "search_note": "energy_eps of the earlier cells at this ratio (resumed run, no search)"}
    t0 = time.perf_counter()
    n0 = len(memo)
    eps = _log_search(lambda e: _run_method(case, data, "cbalanced", cfg(e, **CB_SEARCH))[1]["mac_ratio_reached"],
                      ratio, memo)
    search_s = time.perf_counter() - t0
    new, info = _run_method(case, data, "cbalanced", cfg(eps))
    return new, {**info, "knob": {"energy_eps": eps}, "search_s": search_s, "search_evaluations": len(memo) - n0,
                 "search_note": f"energy_eps searched with {CB_SEARCH}; final run with the default Gramians"}


def compress_at(case: Case, setting: str, method: str, ratio: float, memo: dict[float, float],
                known: dict[str, float] | None = None) -> Compressed:
    """The method's model at ``ratio`` on the setting's data, or its one-line refusal; ``known``: the knob earlier
    cells used (a resumed run compresses them alike)."""
    data = setting_data(case, setting)
    try:
        if method == "cbalanced":
            new, info = _cbalanced(case, data, ratio, memo, (known or {}).get("energy_eps"))
        else:
            new, info = _run_method(case, data, method, get_method(method).config_cls(mac_ratio=ratio))
    except CompressionError as exc:
        return Compressed(None, {"refused": str(exc).splitlines()[0]})
    return Compressed(new.eval(), info)


# ---------------------------------------------------------------------------------------------------------- cells
def _recovery_record(res: Any) -> dict[str, Any]:
    keep = ("epochs", "steps", "best_epoch", "stopped_early", "samples_seen", "held_out_samples", "before", "after")
    return {k: getattr(res, k) for k in keep}


def run_cell(case: Case, setting: str, comp: Compressed, budget: int, seed: int) -> dict[str, Any]:
    """Recover a copy of the compressed model for ``budget`` epochs; held-out metrics and wall times."""
    student = copy.deepcopy(comp.model)
    res = recover(case.model, student, setting_data(case, setting), RecoveryConfig(epochs=budget, seed=seed))
    return {"test": held_out_metrics(case.model, student, case.test), "recover_s": res.wall_s,
            "recovery": _recovery_record(res)}


def _key(cell: dict[str, Any]) -> tuple:
    return cell["model"], cell["setting"], cell["method"], cell["mac_ratio_requested"], cell.get("budget_epochs")


def _progress(i: int, n: int, cell: dict[str, Any]) -> None:
    head = f"[{i}/{n}] {cell['model']} {cell['setting']} {cell['method']}@{cell['mac_ratio_requested']:g}"
    if "refused" in cell:
        print(f"{head}: refused: {cell['refused']}", file=sys.stderr, flush=True)
        return
    head += f" budget {cell['budget_epochs']}"
    t = cell["test"]
    print(f"{head} (reached {cell['mac_ratio_reached']:.3f}): acc {t['accuracy']:.4f} agree {t['agreement']:.4f} "
          f"kl {t['kl']:.4f}  compress {cell['compress_s']:.1f}s recover {cell['recover_s']:.1f}s "
          f"({cell['recovery']['epochs']} ep{', stopped early' if cell['recovery']['stopped_early'] else ''}) "
          f"load {cell['loadavg'][0]:.1f}", file=sys.stderr, flush=True)


class Runner:
    """Runs grid cells against one JSON document, compressing each (model, setting, method, ratio) once."""

    def __init__(self, doc: dict[str, Any], out: Path, seed: int) -> None:
        self.doc, self.out, self.seed = doc, out, seed
        self.cases: dict[str, Case] = {}
        self.compressed: dict[tuple, Compressed] = {}
        self.knob_memo: dict[tuple, dict[float, float]] = {}

    def case(self, name: str) -> Case:
        if name not in self.cases:
            self.cases[name] = CASES[name]()
            self.doc["models"].setdefault(name, original_record(self.cases[name]))
        return self.cases[name]

    def model_at(self, model: str, setting: str, method: str, ratio: float) -> Compressed:
        key = (model, setting, method, ratio)
        if key not in self.compressed:
            memo = self.knob_memo.setdefault((model, setting, method), {})
            known = next((c["knob"] for c in self.doc["cells"] if _key(c)[:4] == key and "knob" in c), None)
            self.compressed[key] = compress_at(self.case(model), setting, method, ratio, memo, known)
        return self.compressed[key]

    def save(self) -> None:
        self.doc["summary"] = summarise(self.doc)
        write_json(self.out, self.doc)

    def run(self, cells: list[tuple[str, str, str, float, int]]) -> None:
        done = {_key(c) for c in self.doc["cells"]}
        refused = {_key(c)[:4] for c in self.doc["refused"]}
        todo = [c for c in cells if c not in done and c[:4] not in refused]
        for i, (model, setting, method, ratio, budget) in enumerate(todo, 1):
            if (model, setting, method, ratio) in refused:
                continue
            comp = self.model_at(model, setting, method, ratio)
            cell = {"model": model, "setting": setting, "method": method, "mac_ratio_requested": ratio}
            if comp.model is None:
                cell.update(comp.info)
                self.doc["refused"].append(cell)
                refused.add((model, setting, method, ratio))
            else:
                cell.update(budget_epochs=budget, **comp.info, **run_cell(self.case(model), setting, comp, budget,
                                                                          self.seed), loadavg=os.getloadavg())
                self.doc["cells"].append(cell)
            _progress(i, len(todo), cell)
            self.save()


# -------------------------------------------------------------------------------------------------------- summary
def _pp(x: float) -> float:
    return round(100 * x, 2)


def _table(cells: list[dict], setting: str) -> dict[str, dict[str, dict[str, float]]]:
    """Held-out accuracy by method, requested ratio and budget."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for c in cells:
        if c["setting"] == setting:
            table.setdefault(c["method"], {}).setdefault(f"{c['mac_ratio_requested']:g}", {})[
                str(c["budget_epochs"])] = round(c["test"]["accuracy"], 4)
    return table


def _best(cells: list[dict], ratio: float, max_budget: int, original: float) -> dict[str, Any] | None:
    pool = [c for c in cells if c["setting"] == "labelled" and c["mac_ratio_requested"] == ratio
            and c["budget_epochs"] <= max_budget]
    if not pool:
        return None
    b = max(pool, key=lambda c: (c["test"]["accuracy"], -c["budget_epochs"]))
    gap = _pp(original - b["test"]["accuracy"])
    return {"method": b["method"], "budget_epochs": b["budget_epochs"], "mac_ratio_reached": b["mac_ratio_reached"],
            "accuracy": b["test"]["accuracy"], "agreement": b["test"]["agreement"], "kl": b["test"]["kl"],
            "pp_below_original": gap, "goal_met": gap <= GOAL_PP}


def _unlabelled_gains(cells: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Accuracy gained (pp) by each unlabelled budget over the same method's zero-shot model."""
    table = _table(cells, "unlabelled256")
    return {m: {r: {b: _pp(acc - row["0"]) for b, acc in row.items() if b != "0"} for r, row in by_r.items()
                if "0" in row} for m, by_r in table.items()}


def _unlabelled_vs_labelled(cells: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Accuracy (pp) of the unlabelled-256 recovery minus the labelled one, same method, ratio and budget."""
    lab, unl = _table(cells, "labelled"), _table(cells, "unlabelled256")
    return {m: {r: {b: _pp(acc - lab[m][r][b]) for b, acc in row.items() if b != "0" and b in lab[m].get(r, {})}
                for r, row in by_r.items()} for m, by_r in unl.items() if m in lab}


def _gap_within_goal(cells: list[dict], original: float) -> dict[str, dict[str, float]]:
    """Per method and ratio: pp below the original of its best labelled recovery within :data:`GOAL_EPOCHS`."""
    out: dict[str, dict[str, float]] = {}
    for m, by_r in _table(cells, "labelled").items():
        out[m] = {r: _pp(original - max(a for b, a in row.items() if int(b) <= GOAL_EPOCHS)) for r, row in by_r.items()}
    return out


def summarise(doc: dict[str, Any]) -> dict[str, Any]:
    """Per model: accuracy tables, the best method per ratio within the goal's budget and overall, the goal's
    verdict at :data:`GOAL_RATIO`, each method's gap within the goal's budget, and the unlabelled results
    (gains over zero-shot, difference to the labelled recovery)."""
    out: dict[str, Any] = {}
    for name, orig in doc["models"].items():
        cells = [c for c in doc["cells"] if c["model"] == name]
        acc = orig["accuracy"]
        best = {f"{r:g}": {"within_3_epochs": _best(cells, r, GOAL_EPOCHS, acc),
                           "any_budget": _best(cells, r, 10 ** 6, acc)} for r in RATIOS}
        goal = best[f"{GOAL_RATIO:g}"]["within_3_epochs"]
        out[name] = {"original_accuracy": acc, "best": best,
                     "goal": {"statement": f"at MAC {GOAL_RATIO} at most {GOAL_PP} pp below the original after "
                                           f"<= {GOAL_EPOCHS} epochs for the best method",
                              "met": None if goal is None else goal["goal_met"], "best": goal},
                     "accuracy_labelled": _table(cells, "labelled"),
                     "accuracy_unlabelled256": _table(cells, "unlabelled256"),
                     "pp_below_original_within_3_epochs": _gap_within_goal(cells, acc),
                     "unlabelled256_gain_pp": _unlabelled_gains(cells),
                     "unlabelled256_minus_labelled_pp": _unlabelled_vs_labelled(cells)}
    return out


# -------------------------------------------------------------------------------------------------------- compile
def _step_fn(teacher: nn.Module, student: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> Callable[[], None]:
    """One optimiser step of the recovery's objective (defaults of :class:`RecoveryConfig`) on a fixed batch."""
    cfg = RecoveryConfig()
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr)
    with torch.no_grad():
        ref = teacher(xb)
    student.train()

    def step() -> None:
        out = student(xb)
        loss = (1 - cfg.alpha) * distillation_loss(out, ref, cfg.temperature, True) + cfg.alpha * task_loss(out, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _per_step(case: Case, student: nn.Module, batch: int, runs: int) -> dict[str, Any]:
    from minreal.runtime_bench.timing import time_interleaved

    xb, yb = case.calib.x[:batch], case.calib.y[:batch]
    eager = _step_fn(case.model, copy.deepcopy(student), xb, yb)
    compiled = _step_fn(case.model, torch.compile(copy.deepcopy(student)), xb, yb)
    _, eager_first = _timed(eager)
    _, compiled_first = _timed(compiled)
    lat = time_interleaved([eager, compiled], warmup=3, min_runs=runs, min_seconds=0.0)
    med = [statistics.median(v) for v in lat]
    return {"batch": batch, "measured_steps": len(lat[0]), "eager_ms": med[0], "compiled_ms": med[1],
            "eager_first_step_s": eager_first, "compiled_first_step_s": compiled_first,
            "compile_s": compiled_first - med[1] / 1e3, "speedup": med[0] / med[1]}


def _whole_recovery(case: Case, student: nn.Module, epochs: int, seed: int, compiled: bool) -> dict[str, Any]:
    """A whole recovery with the student eager or compiled afresh (compilation and recompilations included: train
    and eval mode, the last short batch, the BatchNorm recalibration)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    net = copy.deepcopy(student)
    run = torch.compile(net) if compiled else net
    res, wall = _timed(lambda: recover(case.model, run, case.calib, RecoveryConfig(epochs=epochs, seed=seed)))
    return {"wall_s": wall, "steps": res.steps, "graphs_compiled": counters["stats"]["unique_graphs"] - graphs,
            "accuracy": held_out_metrics(case.model, net, case.test)["accuracy"], "loadavg": os.getloadavg()}


def compile_case(case: Case, seed: int, runs: int, epochs: int) -> dict[str, Any]:
    """Eager vs ``torch.compile`` on the magnitude student at 0.5: per step (cold caches), and for a whole recovery
    compiled with cold caches (a fresh inductor cache folder) and again warm (the caches that run filled)."""
    from torch._inductor.utils import fresh_cache

    from minreal.compress.methods.magnitude import MagnitudeConfig

    student, _ = compress(case.model, case.calib, "magnitude", MagnitudeConfig(mac_ratio=GOAL_RATIO))
    with fresh_cache():
        torch._dynamo.reset()
        step = _per_step(case, student, 64, runs)
    with fresh_cache():
        whole = {k: _whole_recovery(case, student, epochs, seed, True) for k in ("compiled_cold", "compiled_warm")}
    whole["eager"] = _whole_recovery(case, student, epochs, seed, False)
    saved = {k: whole["eager"]["wall_s"] - whole[f"compiled_{k}"]["wall_s"] for k in ("cold", "warm")}
    per_step_gain = (step["eager_ms"] - step["compiled_ms"]) / 1e3
    return {"student": f"magnitude at MAC {GOAL_RATIO}", "per_step": step, f"recovery_{epochs}_epochs": whole,
            "break_even_steps": step["compile_s"] / per_step_gain if per_step_gain > 0 else None,
            "saved_s": saved, "pays": {k: v > 0 for k, v in saved.items()}}


def compile_section(runner: Runner, models: tuple[str, ...], out: Path, runs: int, epochs: int) -> None:
    doc: dict[str, Any] = {"header": header(), "models": {}}
    for name in models:
        doc["models"][name] = compile_case(runner.case(name), runner.seed, runs, epochs)
        r = doc["models"][name]
        saved = {k: round(v, 1) for k, v in r["saved_s"].items()}
        print(f"compile {name}: eager {r['per_step']['eager_ms']:.1f} ms/step, compiled "
              f"{r['per_step']['compiled_ms']:.1f} ms/step, compile {r['per_step']['compile_s']:.1f} s (cold); "
              f"{epochs}-epoch recovery saves {saved} s -> pays: {r['pays']}", file=sys.stderr, flush=True)
        doc["verdict"] = {n: {k: "pays" if v else "does not pay" for k, v in m["pays"].items()}
                          for n, m in doc["models"].items()}
        write_json(out, doc)


# ----------------------------------------------------------------------------------------------------------- int8
def qat_missing() -> str | None:
    """Why quantisation-aware recovery cannot run yet, or None when its interface exists."""
    from minreal.export.int8 import quantize_int8

    if "int8" not in {f.name for f in dataclasses.fields(RecoveryConfig)}:
        return "RecoveryConfig has no int8 field (quantisation-aware recovery not available in this tree)"
    if "activation_ranges" not in inspect.signature(quantize_int8).parameters:
        return "minreal.export.int8.quantize_int8 takes no activation_ranges"
    return None


class _OrtModel(nn.Module):
    """An ONNX Runtime CPU session as a module, so the held-out metrics are computed as for torch models."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        from minreal.runtime_bench.sessions import create_session

        self.session = create_session(path, threads=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from minreal.export.verify import run_ort

        return torch.from_numpy(run_ort(self.session, x.numpy())[0])


def _onnx_pair(case: Case, module: nn.Module, folder: Path, stem: str, ranges: dict | None = None
               ) -> dict[str, Any]:
    """Export ``module`` (verified against torch), quantise it to INT8 (with trained ranges when given); held-out
    metrics of both files under ONNX Runtime against the original in torch."""
    from minreal.export.int8 import quantize_int8
    from minreal.export.settings import VariantConfig
    from minreal.export.variant import export_variant

    cfg = VariantConfig()
    fp32 = folder / f"{stem}.onnx"
    export_variant(module, case.calib.x[:32], fp32, cfg)
    kwargs: dict[str, Any] = {}
    if ranges:
        kwargs["activation_ranges"] = ranges
        if "weights" in inspect.signature(quantize_int8).parameters:
            from minreal.export.variant import layer_weights

            kwargs["weights"] = layer_weights(module, ranges)
    q, quant_s = _timed(lambda: quantize_int8(fp32, folder / f"{stem}.int8.onnx",
                                              case.calib.x[:CALIB_INT8].numpy(), cfg.quant_config(), **kwargs))
    quant = {k: getattr(q, k) for k in ("range_source", "trained_ranges", "untrained_modules", "integer_kernels",
                                        "float_kernels") if hasattr(q, k)}
    return {"fp32_onnx": held_out_metrics(case.model, _OrtModel(fp32), case.test),
            "int8_onnx": held_out_metrics(case.model, _OrtModel(Path(q.out_path)), case.test),
            "quantize_s": quant_s, "quantization": quant}


def _best_at_goal(doc: dict[str, Any], model: str) -> str:
    """The method with the best held-out accuracy at the goal's ratio after the goal's epochs (magnitude when the
    grid has not run there)."""
    pool = [c for c in doc["cells"] if c["model"] == model and c["setting"] == "labelled"
            and c["mac_ratio_requested"] == GOAL_RATIO and c["budget_epochs"] == GOAL_EPOCHS]
    return max(pool, key=lambda c: c["test"]["accuracy"])["method"] if pool else "magnitude"


def int8_case(runner: Runner, model: str, folder: Path) -> dict[str, Any]:
    case, method = runner.case(model), _best_at_goal(runner.doc, model)
    comp = runner.model_at(model, "labelled", method, GOAL_RATIO)
    res: dict[str, Any] = {"method": method, "mac_ratio_reached": comp.info.get("mac_ratio_reached"),
                           "recovery_epochs": GOAL_EPOCHS, "original": _onnx_pair(case, case.model, folder, f"{model}")}
    ptq = copy.deepcopy(comp.model)
    rec = recover(case.model, ptq, case.calib, RecoveryConfig(epochs=GOAL_EPOCHS, seed=runner.seed))
    res["post_training"] = {"recover_s": rec.wall_s, "torch": held_out_metrics(case.model, ptq, case.test),
                            **_onnx_pair(case, ptq, folder, f"{model}_{method}_ptq")}
    missing = qat_missing()
    if missing:
        res["quantisation_aware"] = {"skipped": missing}
        return res
    qat = copy.deepcopy(comp.model)
    rec = recover(case.model, qat, case.calib, RecoveryConfig(epochs=GOAL_EPOCHS, seed=runner.seed,
                                                             int8=resolve_target("cpu")))
    ranges = dataclasses.asdict(rec).get("activation_ranges")
    res["quantisation_aware"] = {"recover_s": rec.wall_s, "trained_ranges": len(ranges or {}),
                                 "torch": held_out_metrics(case.model, qat, case.test),
                                 **_onnx_pair(case, qat, folder, f"{model}_{method}_qat", ranges)}
    return res


def _int8_verdict(res: dict[str, Any], original: float) -> dict[str, Any]:
    qat = res.get("quantisation_aware", {})
    if "int8_onnx" not in qat:
        return {"met": None, "why": qat.get("skipped", "not run")}
    gap = _pp(original - qat["int8_onnx"]["accuracy"])
    return {"met": gap <= GOAL_PP, "pp_below_original": gap,
            "statement": f"quantisation-aware structural INT8 within {GOAL_PP} pp of the original (fp32, torch)"}


def int8_section(runner: Runner, models: tuple[str, ...]) -> None:
    runner.doc["int8"] = {}
    for model in models:
        with tempfile.TemporaryDirectory(prefix="recovery-int8-") as tmp:
            try:
                res = int8_case(runner, model, Path(tmp))
                res["goal"] = _int8_verdict(res, runner.doc["models"][model]["accuracy"])
            except Exception as exc:  # a half-written interface must not cost the rest of the run
                res = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        runner.doc["int8"][model] = res
        print(f"int8 {model}: {json.dumps(res.get('goal', res.get('error')))}", file=sys.stderr, flush=True)
        runner.save()


# ----------------------------------------------------------------------------------------------------------- main
def header() -> dict[str, Any]:
    import onnxruntime

    return {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def new_document(grid: Grid, seed: int) -> dict[str, Any]:
    return {"usage": "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/recovery.py --out benchmarks/recovery.json",
            "header": header(), "seed": seed,
            "grid": {"methods": list(grid.methods), "ratios": list(grid.ratios), "budgets_epochs": grid.budgets,
                     "unlabelled_samples": UNLABELLED_SAMPLES, "recovery": dataclasses.asdict(RecoveryConfig()),
                     "order": f"resnet20's labelled {LATE_BUDGET}-epoch cells at ratios other than {GOAL_RATIO} run "
                              "after the compile and int8 sections",
                     "budget_methods": "svd, factorize, magnitude, wanda, fde: mac_ratio; cbalanced: energy_eps "
                                       "searched (its own training off, epochs=0)",
                     "width_multiple": WIDTH_MULTIPLE},
            "metrics": "test: held-out split never seen by method or recovery; agreement = top-1 agreement with the "
                       "original, kl = KL(original || compressed) at T=1, batchmean; recovery.before/after: the "
                       "recovery's own held-out share (val_fraction) of the data it was given",
            "models": {}, "cells": [], "refused": []}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/recovery.json"))
    ap.add_argument("--compile-out", type=Path, default=None, help="default: OUT with _compile before .json")
    ap.add_argument("--section", choices=("all", "grid", "compile", "int8"), default="all")
    ap.add_argument("--models", default="resnet20,demo_cnn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="keep the cells OUT already holds and skip them")
    ap.add_argument("--quick", action="store_true", help="tiny smoke grid (0.5, svd+magnitude, budgets 0 and 1)")
    return ap.parse_args()


def main() -> None:
    args = parse()
    models = tuple(m for m in args.models.split(",") if m)
    grid = Grid(models)
    if args.quick:
        grid = Grid(models, ("svd", "magnitude"), (GOAL_RATIO,), {"labelled": (0, 1), "unlabelled256": (0, 1)})
    keep = args.resume or args.section in ("int8", "compile")
    doc = json.loads(args.out.read_text()) if keep and args.out.is_file() else new_document(grid, args.seed)
    runner = Runner(doc, args.out, args.seed)
    compile_out = args.compile_out or args.out.with_name(args.out.stem + "_compile.json")
    t0 = time.perf_counter()
    if args.section in ("all", "grid"):
        runner.run(list(grid.cells(late=False)))
    if args.section in ("all", "compile"):
        compile_section(runner, models, compile_out, 5 if args.quick else 20, 1 if args.quick else GOAL_EPOCHS)
    if args.section in ("all", "int8"):
        int8_section(runner, models)
    if args.section in ("all", "grid"):
        runner.run(list(grid.cells(late=True)))
    doc.setdefault("runs", []).append({"section": args.section, "resume": args.resume, "quick": args.quick,
                                       "wall_s": time.perf_counter() - t0, "ended": time.strftime("%Y-%m-%dT%H:%M:%S")})
    runner.save()
    print(f"wrote {args.out}" + (f" and {compile_out}" if args.section in ("all", "compile") else ""),
          file=sys.stderr)


if __name__ == "__main__":
    main()
