"""The Pareto front of measured candidates and the choice among them (pure functions over numbers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minreal.app.plots import pareto_front as _pareto_front

__all__ = ["Point", "pareto_front", "choose"]


@dataclass(frozen=True)
class Point:
    """One model in one (provider, batch) cell: its latency (lower is better), its quality as a higher-is-better
    score (the constrained metric, MSE negated), its file size, and whether it meets the constraint."""

    label: str
    latency_ms: float
    quality: float
    size_bytes: int
    feasible: bool


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """Points no other point dominates, fastest first (:func:`minreal.app.plots.pareto_front`, one definition of
    dominance for plots and choices)."""
    return _pareto_front(points, "higher")  # type: ignore[arg-type]


def choose(points: Sequence[Point], objective: str = "latency") -> Point | None:
    """The feasible point with the lowest latency (``objective="latency"``) or the smallest file (``"size"``, ties
    broken by latency); a better quality breaks the remaining ties. None when no point is feasible."""
    feasible = [p for p in points if p.feasible]
    if not feasible:
        return None
    if objective == "size":
        return min(feasible, key=lambda p: (p.size_bytes, p.latency_ms, -p.quality))
    return min(feasible, key=lambda p: (p.latency_ms, -p.quality))
