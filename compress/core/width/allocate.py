"""Widths per channel group from importance scores and a whole-model budget.

Each group may only take widths on the provider's fast multiple (every ``multiple`` channels, from the
full width down to one multiple; groups narrower than two multiples step by one channel): on small CPU
convnets a 12/24/48-wide ResNet-20 measured 0.90× of the 16/32/64 original, the 8/16/32 one 0.48×.
The allocator is greedy on the Lagrangian trade-off: at each step it lowers the one group whose next
allowed width removes the least importance per unit of predicted cost saved (importance normalised by the
group's mean, so that groups of different scales compare), until the predicted cost meets the budget.
"""

from __future__ import annotations

from typing import Mapping

import torch

from ..errors import CompressionError
from ..options import flag_of
from .cost import cost_terms, predicted_costs
from .graph import WidthGraph

__all__ = ["allowed_widths", "allocate_widths", "BUDGET_COST"]

#: Which predicted cost each whole-model budget field prices.
BUDGET_COST = {"mac_ratio": "macs", "param_ratio": "params"}


def allowed_widths(size: int, multiple: int) -> list[int]:
    """Widths a group of ``size`` channels may take, descending: ``size`` then the multiples of ``multiple``
    below it (down to ``multiple``); every width down to 1 when ``size < 2·multiple``."""
    if multiple <= 1 or size < 2 * multiple:
        return list(range(size, 0, -1))
    return [size] + [w for w in range((size - 1) // multiple * multiple, 0, -multiple)]


def allocate_widths(wg: WidthGraph, scores: Mapping[str, torch.Tensor], budget: str, ratio: float,
                    multiple: int = 8) -> dict[str, list[int]]:
    """Keep sets (indices into each group's atoms, highest scores first kept) meeting ``budget`` ≤ ``ratio``.

    ``scores``: one non-negative importance per atom for each group that may shrink. Raises CompressionError
    naming the flag and the smallest reachable ratio when the budget cannot be met.
    """
    if budget not in BUDGET_COST:
        raise CompressionError(f"width pruning meets {', '.join(flag_of(b) for b in BUDGET_COST)}; "
                               f"{flag_of(budget)} needs a measured width latency table")
    key = BUDGET_COST[budget]
    terms = cost_terms(wg)
    full = predicted_costs(wg, terms, set())[key]
    # units: the segments of every group (see WidthGraph.segments), each with its own ladder of widths
    units: list[tuple[str, list[int], torch.Tensor, list[int]]] = []  # group, atoms by score, norm scores, ladder
    for name, s in scores.items():
        g = wg.group(name)
        s = s.detach().double().clamp_min(0)
        if s.numel() != g.size:
            raise CompressionError(f"channel group {name!r}: {s.numel()} scores for {g.size} channels")
        norm = s / s.mean().clamp_min(1e-30)
        for seg in wg.segments(g):
            ranked = sorted(seg, key=lambda i: -float(s[i]))
            units.append((name, ranked, norm, allowed_widths(len(seg), multiple)))
    step = [0] * len(units)

    def cut_atoms(u: int, width: int) -> set[int]:
        name, ranked, _, _ = units[u]
        g = wg.group(name)
        return {g.atoms[i] for i in ranked[width:]}

    removed: set[int] = set()
    current, target = full, ratio * full
    while current > target + 1e-9 * full:
        best, best_rate, best_cost, best_extra = None, float("inf"), current, set()
        for u, (name, ranked, norm, ladder) in enumerate(units):
            if step[u] + 1 >= len(ladder):
                continue
            width_now, width_next = ladder[step[u]], ladder[step[u] + 1]
            extra = cut_atoms(u, width_next)
            cost = predicted_costs(wg, terms, removed | extra)[key]
            saved = current - cost
            if saved <= 0:
                continue
            rate = float(norm[ranked[width_next:width_now]].sum()) / saved
            if rate < best_rate:
                best, best_rate, best_cost, best_extra = u, rate, cost, extra
        if best is None:
            raise CompressionError(f"{flag_of(budget)} {ratio:g} cannot be reached by width cuts: the smallest "
                                   f"predicted ratio is {current / full:.4f} (every group at its narrowest "
                                   f"allowed width; frozen groups stay whole)")
        step[best] += 1
        removed |= best_extra
        current = best_cost
    keep: dict[str, list[int]] = {name: [] for name in scores}
    for u, (name, ranked, _, ladder) in enumerate(units):
        keep[name] += ranked[:ladder[step[u]]]
    return {name: sorted(k) for name, k in keep.items()}
