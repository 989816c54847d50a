"""Successive halving of the recovered candidates (Jamieson & Talwalkar 2016; Li et al. 2018, "Hyperband").

Recovery is what a tune cannot make cheap: it trains. So the recovered candidates are not bisected at the full
recovery budget; they race. The pool is, per method, the ``per_method`` grid budgets just below the smallest budget
its zero-shot search met (recovery only matters where the zero-shot model misses: above that boundary the zero-shot
model is as fast and already feasible), less the budgets whose zero-shot model is one a larger budget of the same
method already brings. Every candidate of the pool gets the first rung, a fraction of the recovery
cap (the same epochs on a seeded subsample of the calibration data). Then, at each rung:

- a candidate that meets the constraint is done: it is a real candidate already (exported and timed like any other;
  more recovery could only make it more accurate, not faster), and it stops the race of its method's larger
  budgets, which it dominates (same method, fewer MACs);
- of the candidates that miss it, the ``1/eta`` with the smallest losses (the likeliest to meet it with more
  recovery) go on, with ``eta`` times the recovery, up to the full cap; the others are cut.

So only candidates that can still reach the front get more recovery, and no candidate that meets the constraint is
thrown away for its MACs (MACs are predictions; only the timing decides).

The pool is chosen from zero-shot losses, and some structures recover far more than their zero-shot loss suggests
(a depth cut of a pretrained ResNet-44 at 0.66 of the MACs loses 50.8 pp zero-shot and about 2 pp after recovery,
``benchmarks/depth.json``). So the race **extends**: when a method's smallest budget raced so far meets the
constraint before the full cap, its next grid budget below enters the next rung (it gets ``eta`` times the
recovery that sufficed for the milder cut). A method whose smaller budget missed or was cut does not extend: the
race already found where its recovery stops. The report says which candidate got which rung, its loss there and its
fate, and which budgets entered by extension.

Recovery changes a candidate's weights, not its structure, so what its file costs on the target is known before it
is recovered. With the latency objective the race first **screens structures**: each method's smallest pool
budget (its fastest structure in the pool) is exported as its zero-shot model and timed on the target beside the
baselines (the short protocol, fresh processes), and a method whose fastest file there (fp32 or INT8) is not faster
than the fastest baseline that meets the constraint, in any (provider, batch) cell, races none of its budgets: no
recovery could make them the answer, and its larger budgets are no faster (their layers are the same or wider, or
more of them). On a pretrained CIFAR ResNet-44 that takes out the rank factorisations and neuron merging, whose
INT8 files run at 1.2-2.1x the original's INT8 (``benchmarks/real_models_screen.json``), before they cost any
recovery. Extensions need no screen of their own: a method extends only if it raced, and below a budget of it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Halving", "RungEntry", "HALVING_ETA", "HALVING_RUNGS", "HALVING_PER_METHOD", "halving_pool",
           "halving_twins", "rung_fractions"]

HALVING_ETA = 3
"""Each rung keeps a third of its candidates and gives them three times the recovery."""
HALVING_RUNGS = 3
"""Rungs from the first to the full cap: fractions 1/9, 1/3, 1 of the recovery cap with ``eta`` 3."""
HALVING_PER_METHOD = 2
"""Grid budgets per method in the pool: the two just below its zero-shot boundary."""


def rung_fractions(eta: int = HALVING_ETA, rungs: int = HALVING_RUNGS) -> tuple[float, ...]:
    """The recovery fraction of each rung, the last being the full cap: ``(1/eta**(rungs-1), ..., 1/eta, 1)``."""
    if eta < 2 or rungs < 1:
        raise ValueError(f"successive halving needs eta >= 2 and at least one rung, got eta={eta}, rungs={rungs}")
    return tuple(float(eta) ** -(rungs - 1 - i) for i in range(rungs))


def halving_pool(grid: Sequence[float], boundaries: dict[str, float | None], per_method: int = HALVING_PER_METHOD,
                 models: Mapping[tuple[str, float], Hashable] | None = None) -> list[tuple[str, float]]:
    """``(method, budget)`` pairs that enter the first rung: for each method the ``per_method`` largest grid
    budgets below its zero-shot boundary (the smallest budget its zero-shot model met; None: it met none, so the
    largest budgets of the grid). ``models``: the digest of each probed ``(method, budget)``'s zero-shot model
    (:func:`minreal.compress.core.cache.model_key`; None or absent: unknown, never equal to another); of those
    budgets, one whose model a larger one of its method already brings is left out (a width allocator whose coarse
    step overshoots realises several budgets as one model, and recovering the same model twice tells nothing),
    without another budget taking its place. Only budgets the zero-shot search probed have a digest: with the
    default two budgets per method, both are probed (the failed boundary, or 0.9 and 0.8 when nothing met)."""
    return _pool_and_twins(grid, boundaries, per_method, models or {})[0]


def halving_twins(grid: Sequence[float], boundaries: dict[str, float | None], per_method: int = HALVING_PER_METHOD,
                  models: Mapping[tuple[str, float], Hashable] | None = None) -> list[tuple[str, float, float]]:
    """``(method, budget left out, budget raced instead)`` for each budget :func:`halving_pool` leaves out."""
    return _pool_and_twins(grid, boundaries, per_method, models or {})[1]


def _pool_and_twins(grid: Sequence[float], boundaries: dict[str, float | None], per_method: int,
                    models: Mapping[tuple[str, float], Hashable]
                    ) -> tuple[list[tuple[str, float]], list[tuple[str, float, float]]]:
    """The pool's pairs, and the left-out ones with the budget that brings their model."""
    ordered = sorted(set(grid), reverse=True)
    pool: list[tuple[str, float]] = []
    twins: list[tuple[str, float, float]] = []
    for method, boundary in boundaries.items():
        below = [b for b in ordered if boundary is None or b < boundary]
        seen: dict[Hashable, float] = {}
        for b in below[:per_method]:
            digest = models.get((method, b))
            if digest is not None and digest in seen:
                twins.append((method, b, seen[digest]))
                continue
            if digest is not None:
                seen[digest] = b
            pool.append((method, b))
    return pool, twins


@dataclass
class RungEntry:
    """One candidate at one rung: its loss and score under the constraint (None: refused or not measured) and
    what became of it (``met``: it meets the constraint, a real candidate; ``dominated`` by a smaller budget of its
    method that met it; ``promoted`` to the next rung; ``cut`` by the ranking; ``missed``: it missed the
    constraint at the full cap; ``refused`` by the method; ``skipped`` by the time budget)."""

    method: str
    budget: float
    fraction: float
    samples: int
    loss: float | None
    meets: bool
    seconds: float
    outcome: str = ""
    score: float | None = None


@dataclass
class Halving:
    """The race: ``pool`` enters at ``fractions[0]``; ``rungs[i]`` holds what rung ``i`` measured."""

    fractions: tuple[float, ...]
    eta: int
    pool: list[tuple[str, float]]
    rungs: list[list[RungEntry]] = field(default_factory=list)
    twins: list[tuple[str, float, float]] = field(default_factory=list)
    """``(method, budget, raced as)``: budgets left out of the pool because a larger one realised the same model."""
    grid: tuple[float, ...] = ()
    """The tune's grid budgets, from which the race extends (empty: it never extends)."""
    extended: list[tuple[str, float, int]] = field(default_factory=list)
    """``(method, budget, rung)``: budgets that entered the race at rung index ``rung`` by extension."""
    screened: list[dict[str, Any]] = field(default_factory=list)
    """The structure screen before the race: per pool budget (``method``, ``budget``), the p50 ratio of its fastest
    file to the fastest baseline that meets the constraint by cell (``ratio``; None: not timed, as a method's larger
    budgets are not) and whether it ``raced`` (its method's smallest pool budget was faster than that baseline in
    some cell, or was not timed)."""

    def promote(self, entries: list[RungEntry]) -> list[tuple[str, float]]:
        """Mark ``entries`` (one rung) and return the candidates that go on to the next rung."""
        self.rungs.append(entries)
        met = [e for r in self.rungs for e in r if e.meets and not e.outcome]
        alive = []
        for e in entries:
            if e.outcome:
                continue  # refused or skipped
            if any(o.method == e.method and o.budget < e.budget for o in met):
                e.outcome = "dominated"
            elif e.meets:
                e.outcome = "met"
            else:
                alive.append(e)
        if len(self.rungs) == len(self.fractions):
            for e in alive:
                e.outcome = "missed"
            return []
        alive.sort(key=lambda e: (math.inf if e.loss is None else e.loss, -e.budget))
        keep = math.ceil(len(alive) / self.eta)
        for i, e in enumerate(alive):
            e.outcome = "promoted" if i < keep else "cut"
        going_on = [(e.method, e.budget) for e in alive[:keep]]
        return going_on + self._extensions(entries)

    def _extensions(self, entries: list[RungEntry]) -> list[tuple[str, float]]:
        """The next grid budget below each method whose smallest budget raced so far met the constraint at this
        rung (recorded in :attr:`extended`)."""
        raced = {*self.pool, *((e.method, e.budget) for rung in self.rungs for e in rung)}
        out = []
        for e in entries:
            if e.outcome != "met" or e.budget != min(b for m, b in raced if m == e.method):
                continue
            left_out = {b for m, b, _ in self.twins if m == e.method}  # the same model as a raced budget
            below = [b for b in self.grid if b < e.budget and b not in left_out]
            if below and (e.method, max(below)) not in raced:
                out.append((e.method, max(below)))
                self.extended.append((e.method, max(below), len(self.rungs)))
        return out

    def met(self) -> list[RungEntry]:
        """The candidates that met the constraint (at whichever rung), in the order they did."""
        return [e for rung in self.rungs for e in rung if e.outcome == "met"]

    def record(self) -> dict[str, Any]:
        """JSON-safe: the fractions, and each rung's candidates with their loss and outcome."""
        return {"eta": self.eta, "fractions": list(self.fractions),
                "pool": [[m, b] for m, b in self.pool], "twins": [list(t) for t in self.twins],
                "extended": [list(t) for t in self.extended], "screened": self.screened,
                "rungs": [[{"method": e.method, "budget": e.budget, "fraction": e.fraction, "samples": e.samples,
                            "loss": e.loss, "meets": e.meets, "seconds": round(e.seconds, 2), "outcome": e.outcome}
                           for e in rung] for rung in self.rungs]}
