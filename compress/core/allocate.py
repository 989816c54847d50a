"""Rank allocators under a global cost budget: Lagrangian knapsack, energy threshold, uniform fraction.

Each layer offers candidate ranks with a cost and a retained energy (normalised to [0, 1] per layer), plus
the option of keeping the original layer (energy 1, original cost). An allocator picks one option per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .options import ALLOCATOR_NAMES

__all__ = ["KEEP", "RankOptions", "options_from_spectrum", "layer_multiple", "allocate", "ALLOCATORS", "cheapest_cost",
           "smallest_ranks", "lagrangian", "energy_threshold", "uniform_fraction", "total_cost", "rank_at_fraction",
           "rank_at_energy"]

KEEP = -1  # rank value meaning "keep the original layer"


@dataclass(frozen=True)
class RankOptions:
    """Candidate ranks of one layer with their cost and retained energy; ``keep_cost`` is the original cost."""

    name: str
    ranks: np.ndarray
    costs: np.ndarray
    energies: np.ndarray
    keep_cost: float
    max_rank: int

    def cost_of(self, rank: int) -> float:
        return float(self.keep_cost if rank == KEEP else self.costs[np.searchsorted(self.ranks, rank)])


def options_from_spectrum(name: str, sq_values: np.ndarray, cost_fn: Callable[[int], float],
                          keep_cost: float, rank_multiple: int = 1) -> RankOptions:
    """Options for one layer from its squared singular values (summed over groups), descending.

    Ranks whose factorised cost is not below ``keep_cost`` are dropped (keeping the layer dominates them);
    with ``rank_multiple`` N only multiples of :func:`layer_multiple` are offered.
    """
    sq = np.clip(np.asarray(sq_values, dtype=np.float64), 0.0, None)
    total = sq.sum()
    energy = np.cumsum(sq) / total if total > 0 else np.ones_like(sq)
    ranks = np.arange(1, len(sq) + 1)
    step = layer_multiple(rank_multiple, len(sq))
    if step > 1:
        ranks = ranks[ranks % step == 0]
    costs = np.array([cost_fn(int(r)) for r in ranks], dtype=np.float64)
    cheaper = costs < keep_cost
    return RankOptions(name, ranks[cheaper], costs[cheaper], energy[ranks[cheaper] - 1], float(keep_cost), len(sq))


def layer_multiple(rank_multiple: int, max_rank: int) -> int:
    """The rank granularity used for a layer: ``rank_multiple``, halved (powers of two) until the layer
    offers at least four multiples, so small layers keep a usable choice of ranks."""
    step = rank_multiple
    while step > 1 and max_rank < 4 * step:
        step = max(1, step // 2)
    return step


def total_cost(options: list[RankOptions], ranks: Mapping[str, int]) -> float:
    """Cost of an allocation."""
    return sum(o.cost_of(ranks[o.name]) for o in options)


def _padded(options: list[RankOptions]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    width = 1 + max((len(o.ranks) for o in options), default=0)
    cost = np.full((len(options), width), np.inf)
    val = np.full((len(options), width), -np.inf)
    rank = np.full((len(options), width), KEEP, dtype=np.int64)
    for i, o in enumerate(options):
        k = len(o.ranks)
        cost[i, :k], val[i, :k], rank[i, :k] = o.costs, o.energies, o.ranks
        cost[i, k], val[i, k] = o.keep_cost, 1.0
    return cost, val, rank


def _pick(cost: np.ndarray, val: np.ndarray, lam: float) -> np.ndarray:
    """Per layer, the option maximising value − λ·cost; ties go to the cheaper option."""
    score = val - lam * np.where(np.isinf(cost), 0.0, cost)
    score[np.isinf(cost)] = -np.inf
    best = score.max(axis=1, keepdims=True)
    tied_cost = np.where(score >= best - 1e-15 * np.maximum(1.0, np.abs(best)), cost, np.inf)
    return tied_cost.argmin(axis=1)


def _min_cost_gap(cost: np.ndarray) -> float:
    """Smallest positive difference between two finite option costs of the same layer (1 if none)."""
    srt = np.sort(np.where(np.isfinite(cost), cost, np.nan), axis=1)
    gaps = np.diff(srt, axis=1)
    gaps = gaps[np.isfinite(gaps) & (gaps > 0)]
    return float(gaps.min()) if gaps.size else 1.0


def lagrangian(options: list[RankOptions], budget: float, iterations: int = 300) -> dict[str, int]:
    """Lagrangian relaxation of the multiple-choice knapsack, bisection on λ (largest value within budget)."""
    cost, val, rank = _padded(options)
    rows = np.arange(len(options))

    def spend(lam: float) -> tuple[float, np.ndarray]:
        idx = _pick(cost, val, lam)
        return float(cost[rows, idx].sum()), idx

    lo, hi = 0.0, 2.0 / _min_cost_gap(cost)  # at hi every layer takes its cheapest option (values lie in [0, 1])
    c_lo, idx_lo = spend(lo)
    if c_lo <= budget:
        return {o.name: int(rank[i, idx_lo[i]]) for i, o in enumerate(options)}
    _, idx_hi = spend(hi)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        c_mid, idx_mid = spend(mid)
        if c_mid <= budget:
            hi, idx_hi = mid, idx_mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    idx = _fill_slack(cost, val, idx_hi, budget)
    return {o.name: int(rank[i, idx[i]]) for i, o in enumerate(options)}


def _fill_slack(cost: np.ndarray, val: np.ndarray, idx: np.ndarray, budget: float) -> np.ndarray:
    """Spend what the Lagrangian left unused: repeatedly take the upgrade with the best value per extra cost
    that still fits (Lagrangian solutions sit on hull vertices and can leave much of the budget unused)."""
    rows = np.arange(len(idx))
    idx = idx.copy()
    spent = float(cost[rows, idx].sum())
    while True:
        gain = val - val[rows, idx][:, None]
        extra = cost - cost[rows, idx][:, None]
        ok = np.isfinite(cost) & (gain > 1e-15) & (extra > 0) & (extra <= budget - spent)
        if not ok.any():
            return idx
        score = np.where(ok, gain / np.where(ok, extra, 1.0), -np.inf)
        i, j = np.unravel_index(int(score.argmax()), score.shape)
        spent += float(extra[i, j])
        idx[i] = j


def _by_parameter(options: list[RankOptions], budget: float, choose: Callable[[RankOptions, float], int],
                  iterations: int = 60) -> dict[str, int]:
    """Bisect a scalar knob t ∈ [0, 1] (larger = more kept) for the largest t whose allocation fits."""
    def at(t: float) -> dict[str, int]:
        return {o.name: choose(o, t) for o in options}

    if total_cost(options, at(1.0)) <= budget:
        return at(1.0)
    lo, hi = 0.0, 1.0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if total_cost(options, at(mid)) <= budget:
            lo = mid
        else:
            hi = mid
    return at(lo)


def rank_at_energy(o: RankOptions, t: float) -> int:
    ok = np.nonzero(o.energies >= t)[0]
    return int(o.ranks[ok[0]]) if len(ok) else KEEP


def rank_at_fraction(o: RankOptions, t: float) -> int:
    ok = np.nonzero(o.ranks >= t * o.max_rank)[0]
    return int(o.ranks[ok[0]]) if len(ok) else KEEP


def energy_threshold(options: list[RankOptions], budget: float) -> dict[str, int]:
    """Same retained energy in every layer (smallest rank reaching it), the largest energy within budget."""
    return _by_parameter(options, budget, rank_at_energy)


def uniform_fraction(options: list[RankOptions], budget: float) -> dict[str, int]:
    """Same rank fraction in every layer, the largest fraction within budget."""
    return _by_parameter(options, budget, rank_at_fraction)


ALLOCATORS: dict[str, Callable[[list[RankOptions], float], dict[str, int]]] = dict(
    zip(ALLOCATOR_NAMES, (lagrangian, energy_threshold, uniform_fraction), strict=True))


def allocate(options: list[RankOptions], budget: float, allocator: str = "lagrangian") -> dict[str, int]:
    """Allocate ranks with a named allocator; ``budget`` is an absolute cost.

    Raises ValueError when even the cheapest option of every layer exceeds the budget (callers that know the
    option the budget came from check :func:`cheapest_cost` first and name it).
    """
    try:
        fn = ALLOCATORS[allocator]
    except KeyError:
        raise ValueError(f"unknown allocator {allocator!r}; choose one of {sorted(ALLOCATORS)}") from None
    floor = cheapest_cost(options)
    if floor > budget:
        full = sum(o.keep_cost for o in options)
        raise ValueError(f"budget {budget / full:.3g} of the factorisable cost is below the smallest reachable "
                         f"{floor / full:.3g} ({smallest_ranks(options)}); raise the budget")
    return fn(options, budget)


def cheapest_cost(options: list[RankOptions]) -> float:
    """The least total cost any allocation reaches: each layer at its cheapest option (a rank, or kept whole)."""
    return sum(min(o.keep_cost, float(o.costs.min(initial=np.inf))) for o in options)


def smallest_ranks(options: list[RankOptions]) -> str:
    """How the cheapest allocation looks: each layer at its smallest offered rank, e.g. "rank 16 everywhere"."""
    smallest = sorted({int(o.ranks[0]) for o in options if len(o.ranks)})
    kept = sum(1 for o in options if not len(o.ranks))
    if len(smallest) == 1:
        ranks = f"rank {smallest[0]} everywhere"
    else:
        ranks = f"smallest offered rank per layer: {', '.join(map(str, smallest))}" if smallest else ""
    kept_text = f"{kept} layer(s) kept whole, no smaller rank is cheaper" if kept else ""
    return "; ".join(t for t in (ranks, kept_text) if t)
