"""Release gate: compare a benchmark report with thresholds (and optionally a baseline report)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from minreal.facts import INT8_SUFFIX, int8_source

from .check_paired import Cell, decide_cell, model_path, remeasure_problem
from .config import shape_grid, shape_label
from .cpu import isa_difference
from .decision import PASS, UNDECIDED, DecisionPlan, LatencyDecision, decision_evidence, describe_decision, least_cap
from .errors import CheckError
from .inputs import ORT_SUFFIX
from .load import compare_load, cpu_counters, describe_load, machine_load
from .placement import describe_fallback, placement_from_dict
from .report import BenchReport, validate_report

__all__ = ["Criterion", "CheckResult", "PreparedCheck", "check_report", "prepare_check", "gate_plan", "format_check",
           "describe_criterion", "brief_criterion"]

logger = logging.getLogger(__name__)

ReportLike = Mapping[str, Any] | BenchReport
REGRESSION = "latency_regression_pct"
LATENCY_RATIO = "latency_ratio"
HEURISTIC_NOTE = ("latency judged on medians (a latency ratio on its median alone; a regression beyond the threshold "
                  "fails only when the per-process p50 ranges do not overlap): a heuristic with no stated error rate; "
                  "pass a decision plan (--paired) to decide on paired fresh processes at a stated error rate")
HEURISTIC_ONLY = "only the medians heuristic is possible"
ON_PROVIDER = "on_provider_share"
SAME_HARDWARE = "same_hardware"


@dataclass(frozen=True)
class Criterion:
    """One threshold applied to one model (and provider / batch size / shape where latency is concerned).

    ``measured`` is NaN when the report has no value for the subject (a missing latency); ``note``
    says what decided the verdict when the value alone does not (missing cells, measurement noise). ``undecided``
    marks a paired latency decision that could not be made within its cap (``passed`` is then False: never a silent
    pass). ``evidence`` holds a paired decision's evidence as plain fields
    (:func:`~minreal.runtime_bench.decision.decision_evidence`); None for a criterion not decided on paired processes.
    """

    name: str
    model: str
    provider: str | None
    batch_size: int | None
    measured: float
    allowed: float
    passed: bool
    note: str = ""
    shape: str = ""
    undecided: bool = False
    evidence: dict[str, Any] | None = None


@dataclass(frozen=True)
class CheckResult:
    """All criteria checked; ``passed`` is True when every criterion passed. ``notes`` are lines that judge nothing
    but qualify the verdict (how the latency was judged, the machine load of baseline and report, the error rates).
    ``error_rates`` states the paired latency decisions' error rates over the whole gate (:func:`gate_plan`): alpha,
    the paired cells it is split over, each cell's share, and the bounds on a false alarm and on a miss; None where no
    latency was decided on paired processes (medians judge no error rate)."""

    criteria: tuple[Criterion, ...]
    passed: bool
    notes: tuple[str, ...] = ()
    error_rates: dict[str, Any] | None = None

    @property
    def undecided(self) -> bool:
        """Not passed, and every criterion that did not pass is an undecided latency decision."""
        failing = [c for c in self.criteria if not c.passed]
        return bool(failing) and all(c.undecided for c in failing)


def check_report(
    report: ReportLike,
    max_latency_ratio: float | None = None,
    max_accuracy_drop: float | None = None,
    min_agreement: float | None = None,
    baseline: ReportLike | None = None,
    max_regression: float | None = None,
    allow_new_models: bool = False,
    min_on_provider: float | None = None,
    allow_hardware_mismatch: bool = False,
    max_int8_drop: float | None = None,
    max_size_kb: float | None = None,
    max_size_ratio: float | None = None,
    plan: DecisionPlan | None = None,
    progress: Callable[[str], None] | None = None,
    allow_heuristic: bool = True,
) -> CheckResult:
    """Apply release thresholds to a report (a :func:`load_report` dict or a :class:`BenchReport`).

    Parameters
    ----------
    report
        The report to judge; its first model is the reference.
    max_latency_ratio
        Highest allowed median latency ratio vs the first model, per cell.
    max_accuracy_drop
        Highest allowed accuracy drop vs the first model, in percentage points.
    min_agreement
        Lowest allowed top-1 agreement with the first model (fraction 0..1).
    baseline
        An earlier report; cells are matched by (model, provider, batch size, shape).
    max_regression
        Highest allowed p50 latency increase vs ``baseline``, in percent. A cell fails
        only when its increase exceeds this and the per-process p50 ranges of the two runs do not
        overlap (an increase inside the measured noise passes, with a note saying so).
    allow_new_models
        Cells of ``report`` absent from ``baseline`` pass (they fail otherwise).
    min_on_provider
        Lowest allowed share (0..1) of each model's kernels that ran on its requested provider
        (the report's placement); a failing criterion names the kernels that fell back.
    allow_hardware_mismatch
        A ``baseline`` from another CPU model or other GPU model(s) only warns (it
        fails otherwise: its latencies are not comparable).
    max_int8_drop
        Highest allowed accuracy drop of each INT8 file (``X.int8``) against its fp32 source
        (``X``, or ``X.ptq`` for ``X.ptq.int8``) in the same report, in percentage points.
    max_size_kb
        Largest allowed file size in KiB (the graph with its external data, on disk) of every model
        but the first (the reference); of the one model of a one-model report. A model with an ORT-format file
        (``ort_size_bytes``: a run's or tune's ``--format onnx,ort``) is judged on it too, as ``NAME.ort``.
    max_size_ratio
        Largest allowed file size of every model but the first relative to the first's; an
        ORT-format file (``NAME.ort``) relative to the first's ``.onnx`` file too (what ships against what was
        exported, so the ratio shows the ORT format's own cost as well).
    plan
        Decide the latency criteria statistically (:mod:`minreal.runtime_bench.decision`): each candidate
        against the report's first model, and each model against the baseline's file of it, re-measured now
        in paired fresh processes (ABAB...) until decided, the cap or the time budget, ``plan.alpha`` split over
        the re-measured cells (:func:`gate_plan`: it bounds the whole check's false alarms and misses). A
        baseline whose model file is gone, or changed, is judged by the medians heuristic, with a note saying so
        (and only then does the baseline's hardware matter: re-measured cells compare two files on this machine),
        or left undecided (``allow_heuristic`` False). A pair that could not be measured leaves its cell undecided.
        Without ``plan`` the latency criteria compare medians (no stated error rate; a note says so).
    progress
        Called with one-line progress messages while the paired processes run.
    allow_heuristic
        With ``plan``: a baseline cell that cannot be re-measured (its model file gone or changed) is judged by the
        medians heuristic, with a note; when False it is undecided, its note saying why and that the baseline's
        model file would decide it (``minreal check --paired`` passes False unless ``--allow-heuristic``).

    Every latency criterion also fails, with a note, for each requested (model, provider, batch size, shape)
    the report has no latency for (a provider recorded as unavailable, a cell that did not run).

    Raises
    ------
    CheckError
        a threshold was given but the report holds nothing it could apply to.
    """
    prepared = prepare_check(report, max_latency_ratio, max_accuracy_drop, min_agreement, baseline, max_regression,
                             allow_new_models, min_on_provider, allow_hardware_mismatch, max_int8_drop, max_size_kb,
                             max_size_ratio, plan is not None, allow_heuristic)
    return prepared.run(gate_plan(plan, prepared.paired_cells) if plan is not None else None, progress)


@dataclass(frozen=True)
class _Paired:
    """A latency cell to be decided on paired fresh processes: ``candidate`` against ``reference`` at the allowed
    ``ratio``; the criterion reports ``allowed`` (a ratio, or a percentage where ``percent``)."""

    name: str
    cell: Cell
    reference: Path
    candidate: Path
    ratio: float
    allowed: float
    percent: bool = False

    def decide(self, data: Mapping[str, Any], plan: DecisionPlan,
               progress: Callable[[str], None] | None) -> Criterion:
        d = decide_cell(self.reference, self.candidate, data, self.cell, self.ratio, plan, progress)
        measured = 100.0 * (d.median_ratio - 1.0) if self.percent else d.median_ratio
        return _decided(self.name, self.cell, d, measured, self.allowed)


@dataclass
class PreparedCheck:
    """A report's criteria before its paired latency cells are measured (:func:`prepare_check`): what the report
    decides by itself, in order, with the paired cells in their places; :meth:`run` measures and decides those."""

    data: dict[str, Any]
    items: list[Criterion | _Paired]
    notes: list[str] = field(default_factory=list)

    @property
    def paired_cells(self) -> int:
        """Latency cells to be decided on paired fresh processes (what :func:`gate_plan` splits alpha over)."""
        return sum(isinstance(i, _Paired) for i in self.items)

    def run(self, plan: DecisionPlan | None, progress: Callable[[str], None] | None = None) -> CheckResult:
        """Decide the paired cells with ``plan`` (from :func:`gate_plan`: its ``cells`` counts the whole gate's)."""
        if self.paired_cells and plan is None:
            raise ValueError("a check with paired latency cells needs a decision plan")
        started = cpu_counters()
        criteria = [i.decide(self.data, plan, progress) if isinstance(i, _Paired) else i for i in self.items]
        notes, rates = list(self.notes), None
        heuristic = sum(HEURISTIC_ONLY in c.note for c in criteria)
        if plan is not None and self.paired_cells:
            rates = {"alpha": plan.alpha, "paired_cells": plan.cells, "per_cell_alpha": plan.alpha / plan.cells,
                     "false_alarm_at_most": plan.alpha, "miss_at_most": plan.alpha, "heuristic_cells": heuristic}
            split = (f"split over the gate's {plan.cells} re-measured cells (each at {plan.alpha / plan.cells:.3g}) "
                     "and each cell's looks" if plan.cells > 1 else "split over the looks")
            notes.append(f"paired latency at alpha {plan.alpha:g}, {split} (Bonferroni): over those cells a false "
                         f"alarm (any cell failing although within its threshold) has probability at most "
                         f"{plan.alpha:g}, and so has passing a real regression")
            if any(c.evidence and c.evidence["pairs"] for c in criteria):
                notes.append(f"machine load over the paired processes: {describe_load(asdict(machine_load(started)))}")
        if heuristic:
            notes.append(f"{heuristic} latency cell(s) not re-measured were judged on medians "
                         f"({HEURISTIC_ONLY}): no stated error rate for them")
        return CheckResult(criteria=tuple(criteria), passed=all(c.passed for c in criteria), notes=tuple(notes),
                           error_rates=rates)


def gate_plan(plan: DecisionPlan, cells: int) -> DecisionPlan:
    """``plan`` for a gate of ``cells`` paired latency cells: alpha split over them (each cell at ``alpha /
    cells``), so that ``plan.alpha`` bounds the whole gate's false alarms and misses.

    Raises
    ------
    CheckError
        ``plan.max_pairs`` is too few for the sign test to decide anything at each cell's share of alpha.
    """
    if cells < 1:  # nothing to re-measure: the plan judges nothing
        return plan
    gated = replace(plan, cells=cells)
    if gated.least_pairs() > gated.max_pairs:
        cap = least_cap(plan.alpha, cells, plan.looks, max(plan.min_pairs, 12))
        raise CheckError(f"{plan.max_pairs} pairs at most (`DecisionPlan.max_pairs`) cannot decide {cells} paired "
                         f"latency cells at alpha {plan.alpha:g} (`DecisionPlan.alpha`), each at "
                         f"{plan.alpha / cells:.3g}: allow {cap} pairs at least, or gate fewer cells",
                         fields=("max_pairs", "alpha"))
    return gated


def prepare_check(
    report: ReportLike,
    max_latency_ratio: float | None = None,
    max_accuracy_drop: float | None = None,
    min_agreement: float | None = None,
    baseline: ReportLike | None = None,
    max_regression: float | None = None,
    allow_new_models: bool = False,
    min_on_provider: float | None = None,
    allow_hardware_mismatch: bool = False,
    max_int8_drop: float | None = None,
    max_size_kb: float | None = None,
    max_size_ratio: float | None = None,
    paired: bool = False,
    allow_heuristic: bool = True,
) -> PreparedCheck:
    """:func:`check_report` up to the paired measurements (``paired`` stands for its ``plan``): every criterion the
    reports decide, and the latency cells to be decided on paired processes, so that a gate over several reports
    (a run's cases) can split alpha over all of their paired cells before measuring any (:func:`gate_plan`)."""
    data = _as_dict(report, "report")
    items: list[Criterion | _Paired] = []
    notes: list[str] = []
    if max_latency_ratio is not None:
        items += (_paired_ratio(data, max_latency_ratio) if paired else _latency_ratio(data, max_latency_ratio))
    if max_accuracy_drop is not None:
        items += _accuracy_drop(data, max_accuracy_drop)
    if min_agreement is not None:
        items += _agreement(data, min_agreement)
    if min_on_provider is not None:
        items += _on_provider(data, min_on_provider)
    if max_int8_drop is not None:
        items += _int8_drop(data, max_int8_drop)
    if max_size_kb is not None:
        items += _size(data, max_size_kb)
    if max_size_ratio is not None:
        items += _size_ratio(data, max_size_ratio)
    if (baseline is None) != (max_regression is None):
        raise CheckError("`baseline` and `max_regression` must be given together",
                         fields=("baseline", "max_regression"))
    if baseline is not None and max_regression is not None:
        base = _as_dict(baseline, "baseline")
        regression = (_paired_regression(data, base, max_regression, allow_new_models, allow_heuristic) if paired
                      else _regression(data, base, max_regression, allow_new_models))
        # re-measured cells compare two files on this machine: the baseline's hardware matters only to the others
        if not paired or any(isinstance(c, Criterion) and HEURISTIC_ONLY in c.note for c in regression):
            items += _hardware(data, base, allow_hardware_mismatch)
        items += regression
        notes += filter(None, [compare_load(_load_of(base), _load_of(data))])
    if not paired and (max_latency_ratio is not None or max_regression is not None):
        notes.append(HEURISTIC_NOTE)
    return PreparedCheck(data, items, notes)


def format_check(result: CheckResult) -> str:
    """One line per criterion (PASS/FAIL, name, subject, measured vs allowed) and a verdict."""
    lines = [f"{_mark(c)}  {c.name}  {_verdict(c)}" for c in result.criteria]
    lines += [f"NOTE  {n}" for n in result.notes]
    lines.append("release gate " + ("passed" if result.passed else "UNDECIDED" if result.undecided else "FAILED"))
    return "\n".join(lines)


def brief_criterion(c: Criterion) -> str:
    """:func:`describe_criterion` with one clause of the note, cut to 120 characters (for an undecided criterion what
    would decide it, else the note's first clause): one short clause per criterion, for the one-line FAILED/UNDECIDED
    summary."""
    head, _, rest = c.note.partition("; ")
    clause = f"undecided: {rest}" if c.undecided and rest else head.strip()
    if len(clause) > 120:
        clause = clause[:117] + "..."
    return describe_criterion(replace(c, note=clause))


def _mark(c: Criterion) -> str:
    return "PASS" if c.passed else "UNDECIDED" if c.undecided else "FAIL"


def describe_criterion(c: Criterion) -> str:
    """``name model provider batch N [shape]: measured (allowed x) - note`` on one line."""
    return f"{c.name} {_verdict(c)}"


def _verdict(c: Criterion) -> str:
    parts = [c.model, c.provider or "", f"batch {c.batch_size}" if c.batch_size else "", c.shape]
    where = " ".join(p for p in parts if p)
    if math.isnan(c.allowed):  # no threshold (hardware, a tune without a choice): the note is the verdict
        return f"{where}: {c.note}" if where else c.note
    value = "missing" if math.isnan(c.measured) else f"{c.measured:.4g}"
    return f"{where}: {value} (allowed {c.allowed:.4g})" + (f" - {c.note}" if c.note else "")


def _as_dict(report: ReportLike, label: str) -> dict[str, Any]:
    data = asdict(report) if isinstance(report, BenchReport) else dict(report)
    return validate_report(data, label)


def _latency_ratio(data: dict[str, Any], allowed: float) -> list[Criterion]:
    ratios = data["ratios"]
    reference = _model_names(data)[:1]
    expected = [c for c in _expected_cells(data) if [c[0]] != reference]
    if not expected or not (ratios or data.get("unavailable")):
        raise CheckError("`max_latency_ratio` given but the report has no latency ratios (one model or no provider "
                         "ran)", fields=("max_latency_ratio",))
    criteria = [_criterion(LATENCY_RATIO, _cell(r), r["median"], allowed, r["median"] <= allowed) for r in ratios]
    have = {_cell(r) for r in ratios}
    return criteria + _missing(LATENCY_RATIO, data, [c for c in expected if c not in have], allowed)


def _cell(row: Mapping[str, Any]) -> Cell:
    """The (model, provider, batch size, shape) of a latency or ratio row (older rows have no shape)."""
    return row["model"], row["provider"], row["batch_size"], row.get("shape") or ""


def _criterion(name: str, cell: Cell, measured: float, allowed: float, passed: bool, note: str = "") -> Criterion:
    """A latency criterion about ``cell``."""
    model, provider, batch, shape = cell
    return Criterion(name, model, provider, batch, measured, allowed, passed, note, shape)


def _model_names(data: dict[str, Any]) -> list[str]:
    names = [m["name"] for m in data.get("models", [])]
    return names or list(dict.fromkeys(r["model"] for r in data["latency"]))


def _expected_cells(data: dict[str, Any]) -> list[Cell]:
    """Every (model, provider, batch size, shape) the report was asked to time (its config, else what it holds)."""
    config, rows = data.get("config") or {}, data["latency"]
    providers = list(config.get("providers") or dict.fromkeys(r["provider"] for r in rows))
    providers += [u["provider"] for u in data.get("unavailable", []) if u["provider"] not in providers]
    batches = list(config.get("batch_sizes") or dict.fromkeys(r["batch_size"] for r in rows))
    if "axis_values" in config:
        shapes = [shape_label(s) for s in shape_grid(config["axis_values"] or {})]
    else:
        shapes = list(dict.fromkeys(_cell(r)[3] for r in rows)) or [""]
    return [(m, p, b, s) for m in _model_names(data) for p in providers for b in batches for s in shapes]


def _missing(name: str, data: dict[str, Any], cells: Sequence[Cell], allowed: float) -> list[Criterion]:
    """A failing criterion per gated cell without a latency, saying why it is missing."""
    reasons = {u["provider"]: u["reason"] for u in data.get("unavailable", [])}

    def why(provider: str) -> str:
        if provider in reasons:
            return f"no latency: provider {provider} was unavailable ({reasons[provider]})"
        return "no latency recorded for this cell"

    return [_criterion(name, cell, math.nan, allowed, False, why(cell[1])) for cell in cells]


def _accuracy_drop(data: dict[str, Any], allowed: float) -> list[Criterion]:
    metrics = data["metrics"]
    if not metrics or metrics[0]["accuracy"] is None:
        raise CheckError("`max_accuracy_drop` given but the report has no accuracy (benchmark with integer labels y)",
                         fields=("max_accuracy_drop",))
    if len(metrics) < 2:
        raise CheckError("`max_accuracy_drop` given but the report has one model (the drop is against the first)",
                         fields=("max_accuracy_drop",))
    ref = metrics[0]["accuracy"]
    drops = [(m["model"], 100.0 * (ref - m["accuracy"])) for m in metrics[1:]]
    return [Criterion("accuracy_drop_pp", model, None, None, drop, allowed, drop <= allowed) for model, drop in drops]


def _int8_drop(data: dict[str, Any], allowed: float) -> list[Criterion]:
    """Each INT8 file against its fp32 source: the accuracy lost by quantisation alone."""
    metrics = {m["model"]: m for m in data["metrics"]}
    pairs = [(q, int8_source(q)) for q in metrics]
    pairs = [(q, s) for q, s in pairs if s in metrics and metrics[s].get("accuracy") is not None
             and metrics[q].get("accuracy") is not None]
    if not pairs:
        raise CheckError(f"`max_int8_drop` (--max-int8-drop) given but the report has no INT8 file "
                         f"(NAME{INT8_SUFFIX}) with an accuracy beside its fp32 source", fields=("max_int8_drop",))
    drops = [(q, 100.0 * (metrics[s]["accuracy"] - metrics[q]["accuracy"])) for q, s in pairs]
    return [Criterion("int8_accuracy_drop_pp", q, None, None, drop, allowed, drop <= allowed) for q, drop in drops]


def _sized_models(data: dict[str, Any], field: str, mention: str) -> list[dict[str, Any]]:
    """The report's models with a file size; CheckError naming ``field`` (by ``mention``: the field in backticks, its
    flag beside it) when none has one."""
    models = [m for m in data.get("models", []) if m.get("file_size_bytes") is not None]
    if not models:
        raise CheckError(f"{mention} given but the report lists no model file with its size", fields=(field,))
    return models


def _files(models: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """``(name, bytes)`` of each model's file and, after it, of its ORT-format file where it has one
    (``ort_size_bytes``), named ``NAME.ort``."""
    out = []
    for m in models:
        out.append((m["name"], m["file_size_bytes"]))
        if m.get("ort_size_bytes") is not None:
            out.append((m["name"] + ORT_SUFFIX, m["ort_size_bytes"]))
    return out


def _size(data: dict[str, Any], allowed_kb: float) -> list[Criterion]:
    """Every model but the reference (the one model of a one-model report), and its ``.ort`` file, against a size in
    KiB."""
    models = _sized_models(data, "max_size_kb", "`check_report.max_size_kb` (--max-size)")
    return [Criterion("size_kb", name, None, None, size / 1024, allowed_kb, size <= allowed_kb * 1024)
            for name, size in _files(models[1:] or models)]


def _size_ratio(data: dict[str, Any], allowed: float) -> list[Criterion]:
    """Every model but the reference, and its ``.ort`` file, against the reference's (``.onnx``) size."""
    models = _sized_models(data, "max_size_ratio", "`max_size_ratio` (--max-size-ratio)")
    if len(models) < 2:
        raise CheckError("`max_size_ratio` (--max-size-ratio) given but the report has one model (the ratio is to the "
                         "first)", fields=("max_size_ratio",))
    ref = max(models[0]["file_size_bytes"], 1)
    return [Criterion("size_ratio", name, None, None, size / ref, allowed, size / ref <= allowed)
            for name, size in _files(models[1:])]


def _agreement(data: dict[str, Any], allowed: float) -> list[Criterion]:
    rows = [m for m in data["metrics"][1:] if m["top1_agreement"] is not None]
    if not rows:
        raise CheckError("`min_agreement` given but the report has no top-1 agreement (needs 2+ models, class "
                         "outputs)", fields=("min_agreement",))
    return [Criterion("top1_agreement", m["model"], None, None, m["top1_agreement"], allowed,
                      m["top1_agreement"] >= allowed) for m in rows]


def _on_provider(data: dict[str, Any], allowed: float) -> list[Criterion]:
    """Per (model, provider): the share of kernels on the requested provider; a pair without placement fails."""
    if not 0.0 <= allowed <= 1.0:
        raise CheckError(f"min_on_provider (--min-on-provider) is a share within 0..1, got {allowed:g}")
    rows = data.get("placement") or []
    if not rows and not data.get("unavailable"):
        raise CheckError("min_on_provider (--min-on-provider) given but the report records no placement "
                         "(benchmark again with this minreal)")
    criteria = [_placement_criterion(r, allowed) for r in rows]
    have = {(r["model"], r["provider"]) for r in rows}
    reasons = {u["provider"]: u["reason"] for u in data.get("unavailable", [])}
    for model, provider in dict.fromkeys((m, p) for m, p, _, _ in _expected_cells(data)):
        if (model, provider) not in have:
            why = (f"provider {provider} was unavailable ({reasons[provider]})" if provider in reasons
                   else "not recorded for this model and provider")
            criteria.append(Criterion(ON_PROVIDER, model, provider, None, math.nan, allowed, False,
                                      f"no placement: {why}"))
    return criteria


def _placement_criterion(row: Mapping[str, Any], allowed: float) -> Criterion:
    placement = placement_from_dict(row["placement"])
    share, fell = placement.node_share, len(placement.fallback)
    note = (f"{fell} of {placement.nodes} nodes not on {placement.requested}: {describe_fallback(placement)}"
            if fell else "")
    return Criterion(ON_PROVIDER, row["model"], row["provider"], None, share, allowed, share >= allowed, note)


def _hardware_of(data: dict[str, Any]) -> tuple[str, str]:
    """The CPU model and the GPU model names (comma-separated) a report ran on; ``""`` for what it lacks."""
    env = data.get("environment") or {}
    return str(env.get("cpu_model") or ""), ", ".join(str(g.get("name")) for g in env.get("gpus") or ())


def _isa_of(data: dict[str, Any]) -> tuple[str, ...] | None:
    """The int8 instruction sets a report recorded (:func:`minreal.runtime_bench.cpu.cpu_isa`); None for a report that
    predates them or could not read them."""
    env = data.get("environment") or {}
    if env.get("cpu_flags_source", "unknown") == "unknown":
        return None
    return tuple(env.get("cpu_flags") or ())


def _hardware(data: dict[str, Any], baseline: dict[str, Any], allow: bool) -> list[Criterion]:
    """Nothing when report and baseline ran on the same CPU and GPU models with the same int8 instruction sets;
    else a criterion saying what differs, failing unless ``allow`` (then passing, with a warning logged)."""
    now, then = _hardware_of(data), _hardware_of(baseline)
    differs = [f"{kind} {_quoted(b)} in the baseline, {_quoted(n)} in the report"
               for kind, b, n in zip(("CPU", "GPUs"), then, now) if b != n]
    isa_now, isa_then = _isa_of(data), _isa_of(baseline)
    if isa_now is not None and isa_then is not None and (isa := isa_difference(isa_then, isa_now)):
        differs.append(f"int8 instruction sets differ: {isa}")
    if not differs:
        return []
    what = "; ".join(differs)
    if allow:
        logger.warning("baseline and report ran on different hardware (%s): the latency regression compares "
                       "different machines", what)
        return [Criterion(SAME_HARDWARE, "", None, None, math.nan, math.nan, True,
                          f"different hardware ({what}), allowed by allow_hardware_mismatch")]
    return [Criterion(SAME_HARDWARE, "", None, None, math.nan, math.nan, False,
                      f"baseline ran on different hardware ({what}), so its latencies are not comparable; rerun "
                      "the baseline on this machine or pass allow_hardware_mismatch (--allow-hardware-mismatch)")]


def _quoted(value: str) -> str:
    return repr(value) if value else "none"


def _regression(data: dict[str, Any], baseline: dict[str, Any], allowed: float,
                allow_new: bool) -> list[Criterion]:
    before, now = _rows_by_cell(baseline), _rows_by_cell(data)
    # Even with new models allowed, a baseline that shares no cell compares nothing (a new case, whose
    # baseline is empty, is the exception).
    if not set(before) & set(now) and (before or not allow_new):
        raise CheckError("baseline shares no (model, provider, batch size, shape) with the report; "
                         "nothing to compare")
    criteria = [_regression_criterion(key, row, before[key], allowed) for key, row in now.items() if key in before]
    note = "not in the baseline" + (" (new models allowed)" if allow_new
                                    else "; pass allow_new_models (--allow-new-models) to accept it")
    criteria += [_criterion(REGRESSION, key, math.nan, allowed, allow_new, note) for key in now if key not in before]
    expected = _expected_cells(data)
    criteria += [_criterion(REGRESSION, key, math.nan, allowed, False, "in the baseline but not in the report; "
                            "update the baseline if it was dropped on purpose") for key in before if key not in now
                 and key not in expected]
    return criteria + _missing(REGRESSION, data, [c for c in expected if c not in now], allowed)


def _rows_by_cell(data: dict[str, Any]) -> dict[Cell, dict[str, Any]]:
    return {_cell(r): r for r in data["latency"]}


def _regression_criterion(key: Cell, row: dict[str, Any], base: dict[str, Any], allowed: float) -> Criterion:
    """Fail only when the p50 increase exceeds ``allowed`` percent AND the runs' per-process p50 ranges are
    disjoint; the note names the criterion that decided."""
    pct = 100.0 * (row["stats"]["p50_ms"] / base["stats"]["p50_ms"] - 1.0)
    over = f"regression {pct:.3g}% > {allowed:.3g}%"
    if not math.isfinite(pct):
        return _criterion(REGRESSION, key, pct, allowed, False, "latency is not a finite number")
    if pct <= allowed:
        return _criterion(REGRESSION, key, pct, allowed, True, f"{pct:.3g}% within the threshold")
    now, then = row.get("process_p50_ms") or (), base.get("process_p50_ms") or ()
    if not now or not then:
        return _criterion(REGRESSION, key, pct, allowed, False, f"{over}; no per-process spread recorded")
    spread = f"(report {min(now):.4g}-{max(now):.4g} ms, baseline {min(then):.4g}-{max(then):.4g} ms)"
    if min(now) <= max(then) and min(then) <= max(now):
        return _criterion(REGRESSION, key, pct, allowed, True,
                          f"{over} but within noise: per-process p50 ranges overlap {spread}")
    return _criterion(REGRESSION, key, pct, allowed, False,
                      f"{over} and beyond noise: per-process p50 ranges do not overlap {spread}")


def _load_of(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The machine load a report recorded (``environment.machine_load``); None for older reports."""
    return (data.get("environment") or {}).get("machine_load")


def _decided(name: str, cell: Cell, d: LatencyDecision, measured: float, allowed: float) -> Criterion:
    """A criterion from a paired decision: passed only on a ``pass`` verdict; undecided marked as such."""
    model, provider, batch, shape = cell
    return Criterion(name, model, provider, batch, measured, allowed, d.verdict == PASS, describe_decision(d), shape,
                     undecided=d.verdict == UNDECIDED, evidence=decision_evidence(d))


def _paired_ratio(data: dict[str, Any], allowed: float) -> list[Criterion | _Paired]:
    """Every candidate cell against the report's first model, to be decided on paired fresh processes."""
    names = _model_names(data)
    if len(names) < 2:
        raise CheckError("`max_latency_ratio` given but the report has one model (the ratio is to the first)",
                         fields=("max_latency_ratio",))
    reference = model_path(data, names[0])
    unavailable = {u["provider"] for u in data.get("unavailable", [])}
    cells = [c for c in _expected_cells(data) if c[0] != names[0]]
    if not cells:
        raise CheckError("`max_latency_ratio` given but the report has no latency cells to re-measure (no "
                         "provider, batch size or latency recorded)", fields=("max_latency_ratio",))
    items: list[Criterion | _Paired] = list(_missing(LATENCY_RATIO, data, [c for c in cells if c[1] in unavailable],
                                                     allowed))
    for cell in (c for c in cells if c[1] not in unavailable):
        candidate = model_path(data, cell[0])
        missing = [str(p) if p else "a file the report does not record" for p in (reference, candidate)
                   if p is None or not p.is_file()]
        if missing:
            raise CheckError(f"the paired gate re-measures the report's model files, but {', '.join(missing)} is not "
                             "readable here (nor beside the report); run check where the files are, or without "
                             "the paired decision (`check_report.plan`)", fields=("plan",))
        items.append(_Paired(LATENCY_RATIO, cell, reference, candidate, allowed, allowed))
    return items


def _paired_regression(data: dict[str, Any], baseline: dict[str, Any], allowed: float, allow_new: bool,
                       allow_heuristic: bool = True) -> list[Criterion | _Paired]:
    """Each cell of the report against the baseline's file of its model, to be re-measured now in paired fresh
    processes (allowed ratio ``1 + allowed / 100``); where that file is gone or changed, the medians heuristic with a
    note (``allow_heuristic``) or an undecided criterion saying what would decide it."""
    heuristic = _regression(data, baseline, allowed, allow_new)
    out: list[Criterion | _Paired] = []
    for c in heuristic:
        cell = (c.model, c.provider or "", c.batch_size or 0, c.shape)
        candidate = model_path(data, c.model)
        problem = remeasure_problem(baseline, data, c.model) if math.isfinite(c.measured) else "not compared"
        if problem or candidate is None or not candidate.is_file():
            why = problem or f"the report's model file {candidate} is not readable here"
            if not math.isfinite(c.measured):
                out.append(c)
            elif allow_heuristic:
                out.append(replace(c, note=f"{c.note}; {HEURISTIC_ONLY}: {why}"))
            else:
                out.append(replace(c, passed=False, undecided=True, note=(
                    f"undecided: not re-measured, {why}; the baseline's model file, where the baseline names it, "
                    "would decide it (or --allow-heuristic to judge on medians, no stated error rate)")))
            continue
        reference = model_path(baseline, c.model)
        assert reference is not None  # remeasure_problem found it
        out.append(_Paired(REGRESSION, cell, reference, candidate, 1.0 + allowed / 100.0, allowed, percent=True))
    return out
