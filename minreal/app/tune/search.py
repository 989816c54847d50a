"""Bisection of one method's budget on accuracy: the smallest MAC ratio of a grid that meets the constraint.

Accuracy is assumed to fall as the budget shrinks. The bisection checks that assumption with one extra probe: the
first budget past the failed boundary that it did not evaluate; when a smaller budget passes where a larger one failed,
it evaluates the rest of the grid instead (and says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BudgetSearch", "Probe"]


@dataclass
class Probe:
    """One evaluated budget: whether it met the constraint and its score (None: the method refused it)."""

    budget: float
    ok: bool
    score: float | None


@dataclass
class BudgetSearch:
    """State of the search over ``grid`` (descending MAC ratios) for one (method, recovery) pair.

    Invariant while monotone: every grid index below ``lo`` met the constraint, every index from ``hi`` on failed.
    """

    grid: tuple[float, ...]
    probes: dict[float, Probe] = field(default_factory=dict)
    lo: int = 0
    hi: int = -1
    monotone: bool = True
    checked: bool = False
    abandoned: str | None = None
    """Why the search stopped before the grid told anything (the method refused every budget it was given)."""

    def __post_init__(self) -> None:
        self.grid = tuple(sorted(self.grid, reverse=True))
        self.hi = len(self.grid)

    def next_budget(self) -> float | None:
        """The next budget to evaluate, or None when the search is over."""
        if self.abandoned:
            return None
        if not self.monotone:
            rest = [g for g in self.grid if g not in self.probes]
            return rest[0] if rest else None
        if self.lo < self.hi:
            return self.grid[(self.lo + self.hi) // 2]
        if not self.checked:
            self.checked = True
            probed = self._probed_indices()
            beyond = [i for i in range(self.hi + 1, len(self.grid)) if i not in probed]
            if self.lo > 0 and beyond:  # the first unprobed budget past the failed boundary must fail too
                return self.grid[beyond[0]]
        return None

    def record(self, budget: float, ok: bool, score: float | None) -> None:
        """Take the result of :meth:`next_budget`'s budget; detect a violation of monotonicity."""
        self.probes[budget] = Probe(budget, ok, score)
        i = self.grid.index(budget)
        if self.monotone and self.lo < self.hi:
            if ok:
                self.lo = i + 1
            else:
                self.hi = i
        if self._violated():
            self.monotone = False

    def _probed_indices(self) -> set[int]:
        return {self.grid.index(b) for b in self.probes}

    def _violated(self) -> bool:
        """A smaller budget met the constraint where a larger one did not."""
        failed = [b for b, p in self.probes.items() if not p.ok]
        return any(p.ok and any(p.budget < f for f in failed) for p in self.probes.values())

    def passing(self) -> list[float]:
        """Budgets evaluated that met the constraint, smallest first."""
        return sorted(b for b, p in self.probes.items() if p.ok)

    def smallest(self) -> float | None:
        """The smallest budget that met the constraint (None: none did)."""
        passing = self.passing()
        return passing[0] if passing else None
