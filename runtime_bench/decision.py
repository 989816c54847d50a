"""A latency verdict from paired per-process ratios, at a stated error rate (pure statistics: no files, no timing).

Each pair is one fresh process that timed the reference and the candidate interleaved; its ratio is the candidate's
p50 over the reference's. The verdict is about the median ``m`` of the per-pair ratio against an allowed ratio
``R``, with two one-sided sign tests on the log ratios (distribution-free: no normality, robust to the odd slow
process; Hollander, Wolfe & Chicken, *Nonparametric Statistical Methods*, 3rd ed., 2014, sec. 3.6, the
order-statistic confidence bounds for a median):

- **fail** when the lower confidence bound of ``m`` is above ``R`` (a false alarm, ``m <= R`` yet fail, has
  probability at most ``alpha``);
- **pass** when the upper confidence bound of ``m`` is at or below ``R`` (a miss, ``m > R`` yet pass, has
  probability at most ``alpha``);
- **undecided** otherwise.

Looking again after adding pairs inflates the error rates, so the pairs are examined at a fixed schedule of at most
``looks`` pair counts, each test at ``alpha`` divided by the number of scheduled looks (a Bonferroni bound over the
looks: the chance of any wrong verdict over the whole sequence stays at most ``alpha`` per direction; Jennison &
Turnbull, *Group Sequential Methods with Applications to Clinical Trials*, 2000, sec. 1.3 and 2.3, on repeated
significance tests). Bonferroni is conservative: the error rates are at most ``alpha``, often well below it (the
looks are correlated, and the sign test's levels are discrete). A look forced by the time budget comes at a pair
count the pairs' wall times choose (not their ratios), and takes the place of the next scheduled one, so the bound
still holds. A gate deciding several cells (candidates, batch sizes, shapes, cases) splits ``alpha`` over them
too (``cells``; Bonferroni again), so that ``alpha`` bounds the whole gate's false alarms (any cell failing although
within its threshold), and likewise its misses (any regressed cell passing).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

__all__ = ["PASS", "FAIL", "UNDECIDED", "DecisionPlan", "LatencyDecision", "median_bounds", "decide", "pairs_needed",
           "describe_decision", "sequential_decision", "decision_evidence", "least_cap"]

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"


@dataclass(frozen=True)
class DecisionPlan:
    """How a paired latency decision is run.

    Attributes
    ----------
    alpha
        Bound on the false-alarm rate (fail although the median ratio is within the allowed one), and
        likewise on the rate of passing a real regression; over all looks, and all ``cells``, together.
    min_pairs
        Pairs (fresh processes) before the first look.
    max_pairs
        Cap on the pairs; undecided at the cap is a verdict of its own.
    looks
        Most looks, spread geometrically from ``min_pairs`` to ``max_pairs`` (each test at ``alpha`` divided
        by the number of distinct scheduled pair counts: :attr:`level`).
    time_budget_s
        Wall-time budget per decision (one model, one cell); when it runs out the pairs so far get
        the next look of the schedule, and no more are added.
    pair_seconds
        Measurement window per model in each process (the bench's ``min_seconds``).
    cells
        Cells the gate decides with this plan (each at ``alpha / cells``: Bonferroni over the cells, so that
        ``alpha`` bounds the gate's error rates, not one cell's); ``minreal.runtime_bench.check_report`` sets it.
    """

    alpha: float = 0.01
    min_pairs: int = 12
    max_pairs: int = 60
    looks: int = 4
    time_budget_s: float = 60.0
    pair_seconds: float = 0.25
    cells: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 0.5:
            raise ValueError(f"alpha must lie in (0, 0.5), got {self.alpha}")
        if not 1 <= self.min_pairs <= self.max_pairs:
            raise ValueError(f"need 1 <= min_pairs <= max_pairs, got {self.min_pairs} and {self.max_pairs}")
        if self.looks < 1 or self.time_budget_s <= 0 or self.pair_seconds < 0 or self.cells < 1:
            raise ValueError("looks and cells must be >= 1, time_budget_s > 0 and pair_seconds >= 0")

    @property
    def level(self) -> float:
        """The one-sided level of each test at each look (Bonferroni: ``alpha`` over the gate's ``cells`` and the
        scheduled looks, at most ``looks``: fewer where the cap leaves fewer distinct pair counts)."""
        return self.alpha / (self.cells * len(self.schedule()))

    def least_pairs(self) -> int:
        """The fewest pairs whose sign test bounds the median at all at :attr:`level` (``2**-n <= level``): no look
        with fewer pairs can decide."""
        n, level = 1, self.level
        while 0.5 ** n > level:
            n += 1
        return n

    def schedule(self) -> tuple[int, ...]:
        """The pair counts at which the pairs are examined: ``looks`` counts, geometric, ending at ``max_pairs``."""
        return _schedule(self.min_pairs, self.max_pairs, self.looks)


def least_cap(alpha: float, cells: int = 1, looks: int = 4, first: int = 12) -> int:
    """The smallest ``max_pairs`` whose plan (first look at ``min(first, cap)``, at most ``looks`` looks, alpha split
    over ``cells``) can decide at all: its last look has as many pairs as the sign test needs at the plan's level (a
    larger cap adds looks, so a cap's own :meth:`DecisionPlan.least_pairs` is not the answer)."""
    cap = 1
    while DecisionPlan(alpha=alpha, min_pairs=min(first, cap), max_pairs=cap, looks=looks,
                       cells=cells).least_pairs() > cap:
        cap += 1
    return cap


@functools.lru_cache(maxsize=64)
def _schedule(min_pairs: int, max_pairs: int, looks: int) -> tuple[int, ...]:
    if looks == 1:
        return (max_pairs,)
    grow = (max_pairs / min_pairs) ** (1.0 / (looks - 1))
    counts = {min(max_pairs, round(min_pairs * grow ** i)) for i in range(looks)}
    return tuple(sorted(counts | {max_pairs}))


@dataclass(frozen=True)
class LatencyDecision:
    """The verdict on one candidate against one reference, with its evidence.

    ``lower`` and ``upper`` are the confidence bounds of the median ratio at the last look (0 and inf where too
    few pairs bound it), each from a one-sided test at ``level`` (that look's; which look stopped depends on the
    data, so over all looks each side holds with probability at least ``1 - alpha / cells``); ``advice`` says what
    would decide an undecided verdict; ``cells`` is the number of cells the gate split ``alpha`` over.
    """

    verdict: str
    allowed: float
    pairs: int
    median_ratio: float
    lower: float
    upper: float
    alpha: float
    level: float
    looks: int
    ratios: tuple[float, ...]
    advice: str = ""
    wall_s: float = math.nan
    cells: int = 1


def _binomial_cdf(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) <= k), exactly."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n if k >= 0 else 0.0


def median_bounds(values: Sequence[float], level: float) -> tuple[float, float]:
    """One-sided ``1 - level`` confidence bounds (lower, upper) of the median of ``values``, from order statistics.

    The lower bound is the ``k``-th smallest value with the largest ``k`` such that ``P(Bin(n, 1/2) <= k - 1) <=
    level``; the upper bound is the ``k``-th largest (Hollander, Wolfe & Chicken 2014, sec. 3.6). With too few values
    (``2**-n > level``) the bounds are ``(-inf, inf)``.
    """
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    k = 0
    while k < n and _binomial_cdf(k, n) <= level:
        k += 1
    if k == 0:
        return -math.inf, math.inf
    return float(x[k - 1]), float(x[n - k])


def decide(ratios: Sequence[float], allowed: float, level: float) -> tuple[str, float, float]:
    """The verdict on per-pair ``ratios`` against ``allowed`` with each one-sided test at ``level``.

    Returns
    -------
    ``(verdict, lower, upper)``: PASS, FAIL or UNDECIDED and the confidence bounds of the median ratio.
    """
    if allowed <= 0 or not all(r > 0 and math.isfinite(r) for r in ratios):
        raise ValueError("ratios and the allowed ratio must be positive and finite")
    lo, hi = median_bounds(np.log(np.asarray(ratios, dtype=float)), level)
    bound = math.log(allowed)
    verdict = FAIL if lo > bound else PASS if hi <= bound else UNDECIDED
    return verdict, math.exp(lo), math.exp(hi)


def pairs_needed(ratios: Sequence[float], allowed: float, level: float) -> int | None:
    """About how many pairs in all would decide, at the spread seen so far; None when the median sits on the
    threshold (more pairs of this spread would not decide it).

    Large-sample width of the sign-test bound: ``z * s * sqrt(pi / 2) / sqrt(n)`` for log ratios of robust standard
    deviation ``s`` (1.4826 MAD), normal errors assumed for the estimate only; never fewer pairs than the sign test
    needs to bound anything (``2**-n <= level``).
    """
    logs = np.log(np.asarray(ratios, dtype=float))
    least = math.ceil(math.log2(1.0 / level))
    if len(logs) == 0:
        return least
    centre = float(np.median(logs))
    spread = 1.4826 * float(np.median(np.abs(logs - centre)))
    distance = abs(centre - math.log(allowed))
    if distance == 0.0:
        return None
    z = NormalDist().inv_cdf(1.0 - level)
    return max(least, math.ceil((z * spread * math.sqrt(math.pi / 2) / distance) ** 2))


def describe_decision(d: LatencyDecision) -> str:
    """One line: the verdict, the median ratio with its bounds against the allowed one, and for an undecided verdict
    what would decide it."""
    if d.pairs == 0:
        head = f"{d.verdict}: no paired process measured, allowed {d.allowed:.4g}"
        return f"{head}; {d.advice}" if d.advice else head
    bounds = f"{d.lower:.4g}-{d.upper:.4g}" if d.lower > 0 and math.isfinite(d.upper) else "too few pairs for any bound"
    over = f"{d.cells} cells and the planned looks" if d.cells > 1 else "the planned looks"
    head = (f"{d.verdict}: median ratio {d.median_ratio:.4g} over {d.pairs} paired processes, "
            f"bounds {bounds} (each look's test at {100 * (1 - d.level):.4g}% each side: alpha {d.alpha:g} split "
            f"over {over}, {d.looks} taken), allowed {d.allowed:.4g}")
    return f"{head}; {d.advice}" if d.advice else head


def decision_evidence(d: LatencyDecision) -> dict[str, object]:
    """The evidence of a decision as plain fields (for ``--json``): verdict, pairs, median ratio, its bounds (None
    where too few pairs bound it), the level of each test, alpha, the cells alpha is split over, looks taken, wall
    time in seconds."""
    def finite(v: float) -> float | None:
        return v if math.isfinite(v) and v > 0 else None

    return {"verdict": d.verdict, "pairs": d.pairs, "median_ratio": finite(d.median_ratio), "lower": finite(d.lower),
            "upper": finite(d.upper), "allowed_ratio": d.allowed, "level": d.level, "alpha": d.alpha,
            "cells": d.cells, "looks": d.looks, "wall_s": finite(d.wall_s)}


def _advice(d: LatencyDecision, plan: DecisionPlan) -> str:
    """What would decide an undecided verdict: more pairs (how many), or a quieter machine."""
    needed = pairs_needed(d.ratios, d.allowed, d.level)
    if needed is None:
        return ("the median ratio sits on the allowed one: no number of pairs decides it at this spread; "
                "a quieter machine, or a threshold that is not the candidate's own latency")
    if needed <= plan.max_pairs and d.pairs < needed:
        return (f"about {needed} pairs in all would decide it; the time budget stopped at {d.pairs} "
                f"(raise --gate-seconds, or a quieter machine)")
    return (f"about {max(needed, d.pairs + 1)} pairs in all would decide it (cap {plan.max_pairs}: raise "
            "--max-pairs and --gate-seconds), or a quieter machine (less pair-to-pair spread)")


def sequential_decision(next_ratio: Callable[[int], float], allowed: float, plan: DecisionPlan,
                        clock: Callable[[], float] = time.monotonic) -> LatencyDecision:
    """Add pairs (``next_ratio(i)`` measures pair ``i``) and look at ``plan.schedule()`` until decided, the cap, or
    the time budget (no pair is started that would overrun it at the mean pair time so far); then the pairs so far
    get the next look of the schedule (still one of at most ``looks``, so the Bonferroni bound holds)."""
    start, ratios = clock(), []
    schedule = list(plan.schedule())
    looks = 0
    while schedule:
        ratios.append(float(next_ratio(len(ratios))))
        elapsed = clock() - start
        out_of_time = elapsed + elapsed / len(ratios) > plan.time_budget_s  # the next pair would overrun the budget
        if len(ratios) < schedule[0] and not out_of_time:
            continue
        schedule.pop(0)
        looks += 1
        verdict, lower, upper = decide(ratios, allowed, plan.level)
        if verdict != UNDECIDED or out_of_time:
            break
    decision = LatencyDecision(verdict, allowed, len(ratios), float(np.exp(np.median(np.log(ratios)))), lower, upper,
                               plan.alpha, plan.level, looks, tuple(ratios), wall_s=clock() - start, cells=plan.cells)
    return replace(decision, advice=_advice(decision, plan) if verdict == UNDECIDED else "")
