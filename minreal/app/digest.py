"""What a person reads at the end of a run on the console: one line per case saying what won and why, and each
case's warnings grouped by kind with a count, one line per group; every warning in full is in ``report.md`` (and
``report.json``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from minreal.app.case_warnings import split_level
from minreal.app.report import VERDICT_MAX_DROP_PP, CaseVerdict, case_verdict, warning_kind
from minreal.app.run_report import ReportLike, run_report
from minreal.app.screen import cell_header, first_fitting

__all__ = ["CaseProgress", "SCREEN_LINES", "VERDICT_LEGEND", "WarningDigest", "fitted_verdict", "verdict_models",
           "verdict_text", "winner_lines"]

SCREEN_LINES = 50
"""What a brief console (the demo's) aims to fit its end-of-run output in: one screen."""

#: The timed cell a slowdown warning names: "(cpu, batch 1)", "(cpu, batch 1 seq=32)".
_CELL = re.compile(r"\([^(),]+, batch (\d+)((?: [^()]+)?)\)")


@dataclass
class WarningDigest:
    """Warnings collected per (case, kind): how many, and at which timed cells (``batch 1``, ``batch 32 seq=64``)
    the slowdown warnings were measured."""

    where: str = "report.md"
    groups: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    levels: dict[tuple[str, str], str] = field(default_factory=dict)
    """A group's level where it is not WARNING: a log record collected at ERROR (``ERROR: text``,
    :func:`~minreal.app.case_warnings.split_level`) is grouped by its text's kind and shown as an ERROR."""

    def add(self, case: str, warnings: Iterable[str]) -> None:
        """Collect ``case``'s warnings."""
        for w in warnings:
            level, text = split_level(w)
            key = (case, warning_kind(text))
            self.groups.setdefault(key, []).append(w)
            if level != "WARNING":
                self.levels[key] = level

    def count(self, case: str, kind: str) -> int:
        """How many warnings of ``kind`` ``case`` had."""
        return len(self.groups.get((case, kind), ()))

    def lines(self, columns: int | None = None) -> list[str]:
        """``WARNING case: kind (N×, at batch 1 and 32; details in report.md)``, one line per group, in the order
        the groups were first met. Within ``columns`` (a screen whose last line says where the details are), without
        the details' place, and shorter where that does not fit (``(N×: b1, b32 s64)``, then ``(N×)``, then
        clipped)."""
        out = []
        for (case, kind), items in self.groups.items():
            head = f"{self.levels.get((case, kind), 'WARNING')} {case}: {kind} ({len(items)}×"
            out.append(first_fitting((*[f"{head}{_cells_text(items)}; details in {self.where})"] * (columns is None),
                                      f"{head}{_cells_text(items)})", f"{head}{_cells_text(items, short=True)})",
                                      f"{head})"), columns))
        return out


def _cells_text(warnings: list[str], short: bool = False) -> str:
    """``, at batch 1 and 32`` for the timed cells the warnings name, batch sizes in increasing order (``short``:
    ``: b1, b32``, as the screen table's columns are named); ``""`` without any."""
    found = {(int(batch), shape) for w in warnings for batch, shape in _CELL.findall(w)}
    cells = [f"{batch}{shape}" for batch, shape in sorted(found)]
    if not cells:
        return ""
    if short:
        return f": {', '.join(map(cell_header, cells))}"
    listed = cells[0] if len(cells) == 1 else f"{', '.join(cells[:-1])} and {cells[-1]}"
    return f", at batch {listed}"


def _per_cell(speedups: Iterable[float]) -> str:
    """``0.87×/1.53×``: one speed-up per timed cell."""
    return "/".join(f"{s:.2f}×" for s in speedups)


def verdict_text(v: CaseVerdict) -> str:
    """One console line: which model won the case (fastest within :data:`VERDICT_MAX_DROP_PP` of the original's
    quality) and why: its p50 speed-up at each timed cell, or what kept each compressed model out."""
    budget = f"{VERDICT_MAX_DROP_PP:g} pp"
    if v.best is None:
        return f"{v.case}: no model is within {budget} of the original's held-out quality"
    if not v.best.startswith("original"):
        cells = "/".join(c for c, _, _ in v.speedups)
        versus = f"{_per_cell(s for _, s, _ in v.speedups)} the original fp32's speed"
        lows = [s for _, _, s in v.speedups if s is not None]
        if lows and len(lows) == len(v.speedups):
            versus += f", {_per_cell(lows)} {v.low}'s"
        return f"{v.case}: {v.best} won ({v.cost}): {versus} (batch {cells}, p50, {v.provider})"
    head = f"{v.case}: {v.best} won"
    if v.rival is None:
        return f"{head}; no compressed model was timed"
    if v.rival_within:
        return (f"{head}; the fastest compressed model within {budget}, {v.rival} ({v.rival_cost}), is not faster: "
                f"on average {v.rival_vs_best:.2f}× the p50 latency of {v.best}")
    return (f"{head}; the fastest compressed model, {v.rival} (on average {v.rival_ratio:.2f}× the original's p50 "
            f"latency), costs {v.rival_cost}, past {budget}")


def _speed(s: float) -> str:
    """A speed-up to two significant digits: ``0.86``, ``1.0``, ``3.1``, ``12``."""
    return f"{s:.2f}" if s < 1 else f"{s:.1f}" if s < 10 else f"{s:.0f}"


def _speeds(speedups: Iterable[float]) -> str:
    """``3.1/0.86×``: one speed-up per timed cell."""
    return "/".join(map(_speed, speedups)) + "×"


def _short(cost: str) -> str:
    """A quality cost as a screen line says it: ``acc -0.67 pp``."""
    return cost.replace("accuracy ", "acc ")


def _brief(v: CaseVerdict) -> list[str]:
    """Shorter wordings of :func:`verdict_text` for a screen (:data:`VERDICT_LEGEND` above them), longest first:
    speed-ups per cell over the original fp32 and its low-precision file (cells as the screen table names them), the
    same without the cells, then their means; none where :func:`verdict_text` is short already."""
    if v.best is None or v.rival is None:
        return []
    if v.best.startswith("original"):
        if v.rival_within:  # a rival faster at some cell is said to be slower on average, as the table shows it
            mean = "mean " if v.rival_faster_somewhere else ""
            head = (f"{v.case}: {v.best} won; {v.rival} ({_short(v.rival_cost)}) is not faster: "
                    f"{mean}{v.rival_vs_best:.2f}×")
            return [f"{head} the p50 latency of {v.best}", f"{head} {v.best}'s p50"]
        return [f"{v.case}: {v.best} won; {v.rival} is {v.rival_ratio:.2f}× the original's p50 latency but costs "
                f"{_short(v.rival_cost)}"]
    head = f"{v.case}: {v.best} won ({_short(v.cost)})"
    low = (v.low or "").rpartition(".")[2].upper()
    fp32, lows = [s for _, s, _ in v.speedups], [s for _, _, s in v.speedups if s is not None]
    lows = lows if len(lows) == len(fp32) else []
    cells = "/".join(cell_header(c) for c, _, _ in v.speedups)
    versus = [f"{_speeds(fp32)} fp32", *([f"{_speeds(lows)} {low}"] if lows else [])]
    means = [f"{_speed(sum(x) / len(x))}× {name}" for x, name in ((fp32, "fp32"), (lows, low)) if x]
    return [f"{head}: {', '.join(versus)} ({cells})", f"{head}: {', '.join(versus)}",
            f"{head}: {', '.join(means)} (mean of {len(fp32)} cells)"]


VERDICT_LEGEND = (f"winner: fastest within {VERDICT_MAX_DROP_PP:g} pp of the original; N× fp32/INT8: p50 speed-up over "
                  "the original/its INT8")
"""The line above the verdicts on a screen (:func:`fitted_verdict` with ``columns``)."""


def fitted_verdict(v: CaseVerdict, columns: int | None) -> str:
    """:func:`verdict_text`; within ``columns`` (a screen), the longest of its shorter wordings that fits (clipped at
    last)."""
    return first_fitting((_brief(v) if columns is not None else []) or [verdict_text(v)], columns)


def _verdicts(report: ReportLike) -> list[CaseVerdict]:
    """The verdict of every case of a run report (its JSON read at the boundary, :func:`run_report`) that has a
    timed original."""
    return [v for v in map(case_verdict, run_report(report).cases) if v is not None]


def winner_lines(report: ReportLike, columns: int | None = None) -> list[str]:
    """:func:`verdict_text` of every case of a run report that has a timed original (:func:`fitted_verdict` within
    ``columns``)."""
    return [fitted_verdict(v, columns) for v in _verdicts(report)]


def verdict_models(report: ReportLike) -> set[tuple[str, str]]:
    """The (case, model) pairs the verdicts name: the original, its low-precision file, the winner and the fastest
    compressed rival."""
    return {(v.case, m) for v in _verdicts(report) for m in ("original", v.low, v.best, v.rival) if m is not None}


@dataclass
class CaseProgress:
    """A pipeline progress callback for a brief console: one line as each case starts (the pipeline's messages
    begin ``[case]``), none for its steps or for the benchmark's processes."""

    say: Callable[[str], None]
    total: int
    started: list[str] = field(default_factory=list)

    def __call__(self, message: str) -> None:
        case = re.match(r"\[([^\]]+)\] ", message)
        if case and case[1] not in self.started:
            self.started.append(case[1])
            self.say(f"{case[1]} ({len(self.started)}/{self.total}): compressing, exporting, quantising, timing")
