"""Release gate: compare a benchmark report with thresholds (and optionally a baseline report)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from .errors import CheckError
from .report import BenchReport, validate_report

__all__ = ["Criterion", "CheckResult", "check_report", "format_check"]

logger = logging.getLogger(__name__)

ReportLike = Mapping[str, Any] | BenchReport


@dataclass(frozen=True)
class Criterion:
    """One threshold applied to one model (and provider / batch size where latency is concerned)."""

    name: str
    model: str
    provider: str | None
    batch_size: int | None
    measured: float
    allowed: float
    passed: bool


@dataclass(frozen=True)
class CheckResult:
    """All criteria checked; ``passed`` is True when every criterion passed."""

    criteria: tuple[Criterion, ...]
    passed: bool


def check_report(
    report: ReportLike,
    max_latency_ratio: float | None = None,
    max_accuracy_drop: float | None = None,
    min_agreement: float | None = None,
    baseline: ReportLike | None = None,
    max_regression: float | None = None,
) -> CheckResult:
    """Apply release thresholds to a report (a :func:`load_report` dict or a :class:`BenchReport`).

    Args:
        report: The report to judge; its first model is the reference.
        max_latency_ratio: Highest allowed median latency ratio vs the first model, per cell.
        max_accuracy_drop: Highest allowed accuracy drop vs the first model, in percentage points.
        min_agreement: Lowest allowed top-1 agreement with the first model (fraction 0..1).
        baseline: An earlier report; cells are matched by (model, provider, batch size).
        max_regression: Highest allowed p50 latency increase vs ``baseline``, in percent.

    Raises:
        CheckError: a threshold was given but the report holds nothing it could apply to.
    """
    data = _as_dict(report, "report")
    criteria: list[Criterion] = []
    if max_latency_ratio is not None:
        criteria += _latency_ratio(data, max_latency_ratio)
    if max_accuracy_drop is not None:
        criteria += _accuracy_drop(data, max_accuracy_drop)
    if min_agreement is not None:
        criteria += _agreement(data, min_agreement)
    if (baseline is None) != (max_regression is None):
        raise CheckError("baseline and max_regression must be given together")
    if baseline is not None and max_regression is not None:
        criteria += _regression(data, _as_dict(baseline, "baseline"), max_regression)
    return CheckResult(criteria=tuple(criteria), passed=all(c.passed for c in criteria))


def format_check(result: CheckResult) -> str:
    """One line per criterion (PASS/FAIL, name, subject, measured vs allowed) and a verdict."""
    lines = []
    for c in result.criteria:
        where = " ".join([c.model, c.provider or "", f"batch {c.batch_size}" if c.batch_size else ""]).strip()
        lines.append(f"{'PASS' if c.passed else 'FAIL'}  {c.name}  {where}: {c.measured:.4g} (allowed {c.allowed:.4g})")
    lines.append("release gate " + ("passed" if result.passed else "FAILED"))
    return "\n".join(lines)


def _as_dict(report: ReportLike, label: str) -> dict[str, Any]:
    data = asdict(report) if isinstance(report, BenchReport) else dict(report)
    return validate_report(data, label)


def _latency_ratio(data: dict[str, Any], allowed: float) -> list[Criterion]:
    ratios = data["ratios"]
    if not ratios:
        raise CheckError("max_latency_ratio given but the report has no latency ratios (one model or no provider ran)")
    return [Criterion("latency_ratio", r["model"], r["provider"], r["batch_size"], r["median"], allowed,
                      r["median"] <= allowed) for r in ratios]


def _accuracy_drop(data: dict[str, Any], allowed: float) -> list[Criterion]:
    metrics = data["metrics"]
    if not metrics or metrics[0]["accuracy"] is None:
        raise CheckError("max_accuracy_drop given but the report has no accuracy (benchmark with integer labels y)")
    ref = metrics[0]["accuracy"]
    drops = [(m["model"], 100.0 * (ref - m["accuracy"])) for m in metrics[1:]]
    return [Criterion("accuracy_drop_pp", model, None, None, drop, allowed, drop <= allowed) for model, drop in drops]


def _agreement(data: dict[str, Any], allowed: float) -> list[Criterion]:
    rows = [m for m in data["metrics"][1:] if m["top1_agreement"] is not None]
    if not rows:
        raise CheckError("min_agreement given but the report has no top-1 agreement (needs 2+ models, class outputs)")
    return [Criterion("top1_agreement", m["model"], None, None, m["top1_agreement"], allowed,
                      m["top1_agreement"] >= allowed) for m in rows]


def _regression(data: dict[str, Any], baseline: dict[str, Any], allowed: float) -> list[Criterion]:
    cpus = (baseline["environment"]["cpu_model"], data["environment"]["cpu_model"])
    if cpus[0] != cpus[1]:
        logger.warning("baseline ran on %r, report on %r: latency regression compares different CPUs", *cpus)
    before = {(r["model"], r["provider"], r["batch_size"]): r["stats"]["p50_ms"] for r in baseline["latency"]}
    criteria = []
    for row in data["latency"]:
        key = (row["model"], row["provider"], row["batch_size"])
        if key in before:
            pct = 100.0 * (row["stats"]["p50_ms"] / before[key] - 1.0)
            criteria.append(Criterion("latency_regression_pct", *key, pct, allowed, pct <= allowed))
    if not criteria:
        raise CheckError("baseline shares no (model, provider, batch size) with the report")
    return criteria
