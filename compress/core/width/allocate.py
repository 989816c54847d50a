"""Widths per channel group from importance scores and a whole-model budget.

Each segment of a group may only take widths on the provider's fast multiple (see :func:`allowed_widths`):
on small CPU convnets a 12/24/48-wide ResNet-20 measured 0.90× of the 16/32/64 original, the 8/16/32 one 0.48×.
The allocator is greedy on the Lagrangian trade-off: at each step it lowers the one group whose next
allowed width removes the least importance per unit of predicted cost saved (importance normalised by the
group's mean, so that groups of different scales compare), until the predicted cost meets the budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import torch

from runtime_bench.facts import PROVIDERS

from ..errors import CompressionError
from ..options import flag_of
from .cost import cost_terms, predicted_costs
from .graph import WidthGraph

__all__ = ["WIDTH_MULTIPLE_BY_PROVIDER", "width_multiple_defaults", "allowed_widths", "allocate_widths", "segment_key", "load_width_latency_table", "saving_curve", "calibrated_saving",
           "BUDGET_COST"]

#: Which predicted cost each whole-model budget field prices.
BUDGET_COST = {"mac_ratio": "macs", "param_ratio": "params"}


#: Channel granularity of the providers' fast convolution kernels: ONNX Runtime's CPU kernels block channels by
#: 16 on AVX-512 machines (ResNet-20 at 16/32/48 measured 0.96× of 16/32/64 on this CPU, at 8/16/32 0.49×,
#: benchmarks/width_resnet20.json); GPU tensor cores want multiples of 8.
WIDTH_MULTIPLE_BY_PROVIDER: Mapping[str, int] = MappingProxyType({name: 16 if name == "cpu" else 8 for name in PROVIDERS})


def width_multiple_defaults(providers: Sequence[str]) -> dict[str, Any]:
    """Provider defaults of the width methods: the coarsest width multiple the target providers ask for."""
    multiples = [WIDTH_MULTIPLE_BY_PROVIDER[p] for p in providers if p in WIDTH_MULTIPLE_BY_PROVIDER]
    return {"width_multiple": max(multiples)} if multiples else {}


def allowed_widths(size: int, multiple: int) -> list[int]:
    """Widths a segment of ``size`` channels may take, descending: ``size`` then the multiples of ``multiple``
    below it. A segment no wider than ``multiple`` halves the multiple until one narrower width exists (16
    channels at multiple 16: 16, 8); multiple 1 or a segment of at most 2 channels: every width."""
    step = max(1, multiple)
    while step > 1 and step >= size:
        step //= 2
    if step <= 1:
        return list(range(size, 0, -1))
    return [size] + [w for w in range((size - 1) // step * step, 0, -step)]


def segment_key(group: str, index: int) -> str:
    """Key of a group's ``index``-th segment in a width latency table."""
    return f"{group}/{index}"


def _interpolate(widths: list[int], ms: list[float], w: int) -> float:
    pts = sorted(zip(widths, ms))
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    if w <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if w <= x1:
            return y0 + (y1 - y0) * (w - x0) / (x1 - x0)
    return ys[-1]


def load_width_latency_table(path: str | Path) -> dict[str, Any]:
    """A width latency table (``minreal latency-table --kind width``) with each segment's latencies made
    non-increasing as the width falls (timing noise must not make a narrower layer look slower)."""
    try:
        table = json.loads(Path(path).read_text())
        if table.get("kind") != "width":
            raise CompressionError(f"latency table {path} is a per-layer rank table; width methods need one built "
                                   "with `minreal latency-table --kind width`")
        float(table["model_ms"])
        for entry in table["segments"].values():
            pts = sorted(zip(entry["widths"], entry["ms"]), reverse=True)
            best, ms = float("inf"), []
            for _, t in pts:
                best = min(best, float(t))
                ms.append(best)
            entry["widths"], entry["ms"] = [p[0] for p in pts], ms
    except CompressionError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CompressionError(f"cannot read width latency table {path}: {type(exc).__name__}: {exc}; build one "
                               "with `minreal latency-table --kind width`") from None
    return table


def _additive_saving(table: Mapping[str, Any], widths: Mapping[str, int]) -> float:
    model_ms = float(table["model_ms"])
    return sum(model_ms - _interpolate(e["widths"], e["ms"], widths[k])
               for k, e in table["segments"].items() if k in widths)


def saving_curve(table: Mapping[str, Any]) -> list[tuple[float, float]]:
    """Points (summed single-segment saving, measured joint saving), through (0, 0), that calibrate how savings add.

    The table times each segment narrowed alone; cutting every group at once saves more or less than the sum
    (ResNet-20 on this CPU at batch 32: every group at ¼ width summed to a predicted 0.55× but measured 0.47×).
    The table's uniform cuts (every segment at ¾, ½, ¼) give the points; joint savings are made non-decreasing.
    Tables without uniform cuts: the identity (savings add)."""
    points = [(0.0, 0.0)]
    uniform = table.get("uniform")
    if uniform:
        model_ms = float(table["model_ms"])
        for j, ms in enumerate(uniform["ms"]):
            a = _additive_saving(table, {k: w[j] for k, w in uniform["widths"].items()})
            if a > 0:
                points.append((a, max(0.0, model_ms - float(ms))))
    points.sort()
    best = 0.0
    for i, (a, m) in enumerate(points):
        best = max(best, m)
        points[i] = (a, best)
    return points


def calibrated_saving(points: list[tuple[float, float]], additive: float) -> float:
    """The joint saving for a summed single-segment saving: linear between the curve's points, and beyond the
    last point along the line from the origin through it."""
    if len(points) < 2:
        return additive
    for (a0, m0), (a1, m1) in zip(points, points[1:]):
        if additive <= a1:
            return m0 + (m1 - m0) * (additive - a0) / (a1 - a0) if a1 > a0 else m1
    a, m = points[-1]
    return additive * m / a


def allocate_widths(wg: WidthGraph, scores: Mapping[str, torch.Tensor], budget: str, ratio: float,
                    multiple: int = 8, latency: Mapping[str, Any] | None = None) -> dict[str, list[int]]:
    """Keep sets (indices into each group's atoms, highest scores first kept) meeting ``budget`` ≤ ``ratio``.

    ``scores``: one non-negative importance per atom for each group that may shrink. ``latency``: a width
    latency table (``minreal latency-table --kind width``), needed for ``latency_ratio``: the predicted
    latency is the whole model's minus the measured savings of each segment at its width, summed and mapped by
    :func:`saving_curve` (calibrated on the table's uniform cuts).
    Raises CompressionError naming the flag and the smallest reachable ratio when the budget cannot be met.
    """
    if budget not in BUDGET_COST and not (budget == "latency_ratio" and latency is not None):
        raise CompressionError(f"width pruning meets {', '.join(flag_of(b) for b in BUDGET_COST)}; "
                               f"{flag_of(budget)} needs a width latency table (minreal latency-table --kind width)")
    terms = cost_terms(wg)
    if budget == "latency_ratio":
        model_ms = float(latency["model_ms"])
        table = latency["segments"]
        curve = saving_curve(latency)
        keys: dict[int, str] = {}  # unit → table key

        def price(removed: set[int]) -> float:
            saving = 0.0
            for u, (name, ranked, _, _) in enumerate(units):
                entry = table.get(keys[u])
                if entry is None:
                    continue
                g = wg.group(name)
                width = sum(1 for i in ranked if g.atoms[i] not in removed)
                saving += model_ms - _interpolate(entry["widths"], entry["ms"], width)
            return model_ms - calibrated_saving(curve, saving)
    else:
        key = BUDGET_COST[budget]

        def price(removed: set[int]) -> float:
            return predicted_costs(wg, terms, removed)[key]
    units: list[tuple[str, list[int], torch.Tensor, list[int]]] = []
    # units: the segments of every group (see WidthGraph.segments), each with its own ladder of widths
    for name, s in scores.items():
        g = wg.group(name)
        s = s.detach().double().clamp_min(0)
        if s.numel() != g.size:
            raise CompressionError(f"channel group {name!r}: {s.numel()} scores for {g.size} channels")
        norm = s / s.mean().clamp_min(1e-30)
        for k, seg in enumerate(wg.segments(g)):
            ranked = sorted(seg, key=lambda i: -float(s[i]))
            if budget == "latency_ratio":
                keys[len(units)] = segment_key(name, k)
            units.append((name, ranked, norm, allowed_widths(len(seg), multiple)))
    if budget == "latency_ratio" and not any(keys[u] in table for u in keys):
        raise CompressionError("the width latency table has no segment of this model's channel groups; rebuild it "
                               "for this model with `minreal latency-table --kind width`")
    full = price(set())
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
            cost = price(removed | extra)
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
