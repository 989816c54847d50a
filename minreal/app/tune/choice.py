"""The tune's choice policy over its measured files: the Pareto front of each (provider, batch) cell, which files the
release protocol confirms (:func:`to_confirm`), and the chosen file with its one-line verdict
(:func:`choose_candidate`, the tie rule included). The numbers underneath (dominance, the objective's order) are
:mod:`.front`'s."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .config import Constraint, Quality, TuneConfig
from .front import Point, choose, pareto_front
from .model import Candidate

__all__ = ["points", "fronts", "to_confirm", "choose_candidate"]


def points(candidates: list[Candidate], cell: str, which: str, constraint: Constraint) -> list[Point]:
    """The files with a latency in ``cell`` (``which``: ``screen_ms`` or ``confirm_ms``) and a score under
    ``constraint``, as points of :mod:`.front`."""
    out = []
    for c in candidates:
        ms = getattr(c, which).get(cell)
        score = constraint.score(Quality.from_metrics(c.quality))
        if ms is not None and score is not None:
            out.append(Point(c.label, ms, score, c.shipped_bytes, c.feasible))
    return out


def fronts(screened: Sequence[Candidate], cells: Sequence[str], constraint: Constraint) -> dict[str, list[str]]:
    """The labels on each cell's Pareto front of screened latency and quality, among the files that meet the
    constraint, fastest first."""
    return {cell: [p.label for p in pareto_front([p for p in points(list(screened), cell, "screen_ms", constraint)
                                                  if p.feasible])] for cell in cells}


def to_confirm(screened: Sequence[Candidate], front: dict[str, list[str]], cell: str,
               cfg: TuneConfig) -> list[Candidate]:
    """The files the release protocol times again: the baselines, every cell's front and, for ``--objective size``,
    the smallest feasible file on ``cell`` (in ``screened``'s order)."""
    keep = {c.label for c in screened if c.kind == "baseline"} | {lb for labels in front.values() for lb in labels}
    smallest = choose(points(list(screened), cell, "screen_ms", cfg.constraint), "size")
    if cfg.objective == "size" and smallest is not None:
        keep.add(smallest.label)  # size needs no timing: the smallest feasible file competes whatever its latency
    return [c for c in screened if c.label in keep]


def choose_candidate(confirmed: list[Candidate], candidates: list[Candidate], cell: str, cfg: TuneConfig,
                     notes: list[str]) -> tuple[Candidate | None, str]:
    """The chosen file and the one-line verdict: the winner and its margins over the baselines, or plainly that
    nothing structural beats them (and why). A latency win that does not hold in every fresh process against a
    baseline is a tie, and a tie goes to the baseline."""
    best = choose(points(confirmed, cell, "confirm_ms", cfg.constraint), cfg.objective)
    if best is None:
        return None, f"no model meets {cfg.describe_limits()} on the held-out data, not even the original's"
    by_label = {c.label: c for c in confirmed}
    win, size = by_label[best.label], cfg.objective == "size"
    base = [c for c in confirmed if c.kind == "baseline" and c.feasible and cell in c.confirm_ms]
    unit = "KB" if size else f"ms p50 on {cell}"

    def value(c: Candidate) -> float:
        return c.shipped_bytes / 1024 if size else c.confirm_ms[cell]

    tied = [] if size else [b for b in base if win.kind == "structural"
                            and win.confirm_range_ms[cell][1] >= b.confirm_range_ms[cell][0]]
    if win.kind == "structural" and not tied:
        margins = ", ".join(f"{value(win) / value(b):.2f}x of {b.label}" for b in base)
        spread = "" if size else "; faster in every confirmation process"
        return win, (f"{win.label} wins: {value(win):.4g} {unit} ({margins or 'no baseline measured'}), loss "
                     f"{win.loss:.3g} within {cfg.describe_limits()}{spread}")
    if tied:
        fallback = min(tied, key=value)
        notes.append(f"{win.label} had the lowest p50 ({value(win):.4g} ms) but not in every confirmation process "
                     f"against {', '.join(b.label for b in tied)}: a tie on this machine, which goes to the baseline")
        return fallback, (f"no structural candidate reliably beats the baselines: {fallback.label} is chosen "
                          f"({win.label} was {value(win) / value(fallback):.2f}x of it by p50, within the spread "
                          "over processes)")
    why = _why_not(confirmed, candidates, value, unit, win, notes)
    return win, f"no structural candidate beats the baselines: {win.label} is best ({why})"


def _why_not(confirmed: list[Candidate], candidates: list[Candidate], value: Callable[[Candidate], float],
             unit: str, win: Candidate, notes: list[str]) -> str:
    """Why no structural candidate won: none met the constraint, none reached the confirmation, or the best one's
    number."""
    structural = [c for c in confirmed if c.kind == "structural" and c.feasible]
    if structural:
        best = min(structural, key=value)
        return f"the best structural candidate, {best.label}, needs {value(best):.4g} {unit} vs {value(win):.4g}"
    if not [c for c in candidates if c.kind == "structural"]:
        cut = "; the time budget cut the search short" if any("time budget" in n for n in notes) else ""
        return f"no structural candidate met the constraint in torch (see the searches){cut}"
    if not [c for c in candidates if c.kind == "structural" and c.feasible]:
        return "no structural candidate kept the constraint in ONNX Runtime"
    return "no structural candidate reached the front of the screening"
