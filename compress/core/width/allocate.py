"""Widths per channel group from importance scores and a whole-model budget.

Each segment of a group may only take widths on the provider's fast multiple (see :func:`segment_ladders`).
The allocator is greedy on the Lagrangian trade-off: at each step it lowers the one group whose next
allowed width removes the least importance per unit of predicted cost saved (importance normalised by the
group's mean, so that groups of different scales compare, and by default weighted by each segment's cost per
channel: ``--importance-weighting``), until the predicted cost meets the budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import CompressionError
from ..options import flag_of
from .cost import cost_terms
from .graph import ChannelGroup, WidthGraph

WEIGHTINGS = ("cost", "none")
"""The allocator's weightings (:data:`minreal.compress.core.options.IMPORTANCE_WEIGHTINGS` less ``auto``, which the
pruning methods resolve per method)."""

__all__ = ["WEIGHTINGS", "allowed_widths", "segment_ladders", "allocate_widths", "segment_key",
           "load_width_latency_table", "saving_curve", "calibrated_saving", "check_width_table", "BUDGET_COST"]

#: Which predicted cost each whole-model budget field prices.
BUDGET_COST = {"mac_ratio": "macs", "param_ratio": "params"}


def allowed_widths(size: int, multiple: int, minimum: int = 0) -> list[int]:
    """Widths a segment of ``size`` channels may take, descending: ``size`` then the multiples of ``multiple``
    below it, none narrower than ``minimum`` (a segment no wider than ``minimum`` stays whole). A segment no wider
    than ``multiple`` halves the multiple until one narrower width exists (16 channels at multiple 16: 16, 8;
    with minimum 16: 16 alone); multiple 1 or a segment of at most 2 channels: every width."""
    step = max(1, multiple)
    while step > 1 and step >= size:
        step //= 2
    if step <= 1:
        return [w for w in range(size, 0, -1) if w == size or w >= minimum]
    return [size] + [w for w in range((size - 1) // step * step, 0, -step) if w >= minimum]


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


def segment_ladders(wg: WidthGraph, group: ChannelGroup, multiple: int, minimum: int = 0) -> list[list[int]]:
    """The allowed widths of each segment of ``group``: :func:`allowed_widths`, halving the multiple only in a
    group of one segment — in a group of several (the option-A streams) every segment steps by the multiple,
    so that the width of every value (a sum of segment widths) lands on it too. No segment narrower than
    ``minimum`` (one no wider stays whole)."""
    segments = wg.segments(group)
    if len(segments) == 1:
        return [allowed_widths(len(segments[0]), multiple, minimum)]
    return [[len(seg)] + [w for w in range((len(seg) - 1) // multiple * multiple, 0, -multiple) if w >= minimum]
            if multiple > 1 else [w for w in range(len(seg), 0, -1) if w == len(seg) or w >= minimum]
            for seg in segments]


class _Price:
    """The predicted cost of unit widths: ``price(widths)`` for any widths; after ``price.set(widths)``,
    ``price.moved(u, w)`` is the cost of those widths with unit ``u`` at width ``w``. The base class evaluates every
    call in full."""

    def __init__(self, full: Callable[[list[int]], float]) -> None:
        self._full, self._widths = full, []

    def __call__(self, widths: list[int]) -> float:
        return self._full(widths)

    def set(self, widths: list[int]) -> None:
        self._widths = list(widths)

    def moved(self, u: int, w: int) -> float:
        widths = self._widths.copy()
        widths[u] = w
        return self._full(widths)

    def moved_all(self, u: int, ws: list[int]) -> np.ndarray:
        """``moved(u, w)`` for each of ``ws``."""
        return np.asarray([self.moved(u, w) for w in ws], dtype=np.float64)


class _CountPrice(_Price):
    """MACs or parameters of unit widths, summed over the cost terms (layer positions): a term costs
    ``n_out * n_in * unit + n_out * bias`` with its kept output and input atoms counted. ``moved`` recounts only the
    terms the moved unit's atoms belong to, and sums the same per-term array as a full evaluation, so that both give
    the same float (the greedy allocator's choices do not depend on which one priced a move)."""

    def __init__(self, terms: list, where: Mapping[int, tuple[int, int]], key: str, units: int) -> None:
        def flat(atom_lists: list[list[int] | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """Every (term, atom) pair as three flat arrays: the term's index, the atom's unit (-1: in no unit,
            always kept) and its rank in that unit."""
            term, unit, rank = [], [], []
            for k, atoms in enumerate(atom_lists):
                for a in atoms or ():
                    u, r = where.get(a, (-1, 0))
                    term.append(k)
                    unit.append(u)
                    rank.append(r)
            return (np.asarray(term, dtype=np.int64), np.asarray(unit, dtype=np.int64),
                    np.asarray(rank, dtype=np.int64))

        self.n_terms = len(terms)
        self.out = flat([t.out_atoms for t in terms])
        self.ins = flat([t.in_atoms or None for t in terms])
        self.no_inputs = np.asarray([not t.in_atoms for t in terms], dtype=bool)
        self.unit_w = np.asarray([t.mac_unit if key == "macs" else t.param_unit for t in terms], dtype=np.float64)
        self.bias_w = np.asarray([t.extra_macs if key == "macs" else t.bias for t in terms], dtype=np.float64)
        self.fixed = np.asarray([float(t.in_fixed) for t in terms], dtype=np.float64)
        # per unit, its (term, rank) pairs on each side, and the terms it touches (a term without input atoms has
        # no pair on the input side: its input count is fixed)
        self.per_unit = []
        for u in range(units):
            o, i = self.out[1] == u, self.ins[1] == u
            touched = np.union1d(self.out[0][o], self.ins[0][i])
            self.per_unit.append((touched, (np.searchsorted(touched, self.out[0][o]), self.out[2][o]),
                                  (np.searchsorted(touched, self.ins[0][i]), self.ins[2][i])))
        self._below_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        super().__init__(self._evaluate)

    def _count(self, side: tuple[np.ndarray, np.ndarray, np.ndarray], w: np.ndarray) -> np.ndarray:
        """Per term, its atoms kept at unit widths ``w`` (an atom of rank r in a unit of width w is kept iff r < w;
        atoms in no unit are always kept): one pass over every (term, atom) pair."""
        term, unit, rank = side
        kept = (unit < 0) | (rank < w[np.maximum(unit, 0)])
        return np.bincount(term, weights=kept.astype(np.float64), minlength=self.n_terms)

    def _counts(self, widths: list[int]) -> tuple[np.ndarray, np.ndarray]:
        w = np.asarray(widths, dtype=np.int64) if widths else np.zeros(1, dtype=np.int64)
        return self._count(self.out, w), np.where(self.no_inputs, self.fixed, self._count(self.ins, w))

    def _contributions(self, n_out: np.ndarray, n_in: np.ndarray, at: Any = slice(None)) -> np.ndarray:
        return n_out * n_in * self.unit_w[at] + n_out * self.bias_w[at]

    def _evaluate(self, widths: list[int]) -> float:
        return float(self._contributions(*self._counts(widths)).sum())

    def set(self, widths: list[int]) -> None:
        super().set(widths)
        self.n_out, self.n_in = self._counts(widths)
        self.terms_cost = self._contributions(self.n_out, self.n_in)

    def moved(self, u: int, w: int) -> float:
        touched, (o_at, o_rank), (i_at, i_rank) = self.per_unit[u]
        now = self._widths[u]
        n_out, n_in = self.n_out[touched].copy(), self.n_in[touched].copy()
        n_out += np.bincount(o_at, weights=(o_rank < w).astype(np.float64) - (o_rank < now), minlength=len(touched))
        n_in += np.bincount(i_at, weights=(i_rank < w).astype(np.float64) - (i_rank < now), minlength=len(touched))
        cost = self.terms_cost.copy()
        cost[touched] = self._contributions(n_out, n_in, touched)
        return float(cost.sum())

    def moved_all(self, u: int, ws: list[int]) -> np.ndarray:
        """``moved(u, w)`` for each of ``ws`` at once: the same counts (integers, exact in any order) and the same
        per-term array summed row by row, so each is the float ``moved`` gives (numpy sums a row as a 1-D array)."""
        touched = self.per_unit[u][0]
        below_out, below_in = self._below(u)
        last = below_out.shape[1] - 1
        w, now = np.minimum(np.asarray(ws, dtype=np.int64), last), min(self._widths[u], last)
        n_out = self.n_out[touched] + (below_out[:, w] - below_out[:, [now]]).T
        n_in = self.n_in[touched] + (below_in[:, w] - below_in[:, [now]]).T
        cost = np.repeat(self.terms_cost[None, :], len(ws), axis=0)
        cost[:, touched] = self._contributions(n_out, n_in, touched)
        return cost.sum(axis=1)

    def _below(self, u: int) -> tuple[np.ndarray, np.ndarray]:
        """Per term unit ``u`` touches and width w, how many of its (term, atom) pairs on the output and the input
        side have a rank below w: (touched terms, largest rank + 2) counts, computed once per unit."""
        if u not in self._below_cache:
            touched, (o_at, o_rank), (i_at, i_rank) = self.per_unit[u]
            size = int(max(o_rank.max(initial=-1), i_rank.max(initial=-1))) + 2

            def below(at: np.ndarray, rank: np.ndarray) -> np.ndarray:
                per_rank = np.bincount(at * size + rank + 1, minlength=len(touched) * size)
                return np.cumsum(per_rank.reshape(len(touched), size), axis=1)

            self._below_cache[u] = (below(o_at, o_rank), below(i_at, i_rank))
        return self._below_cache[u]


def _fixed_hint(fixed: float, full: float) -> str:
    """What an unreachable-budget message says of the cost no width cut changes (nothing when there is none)."""
    if not fixed:
        return ""
    return f"{fixed / (full + fixed):.1%} of the model's cost lies outside the layers that cuts narrow; "


def _pricer(wg: WidthGraph, units: list[tuple[str, list[int], torch.Tensor, list[int]]], keys: list[str],
            budget: str, latency: Mapping[str, Any] | None) -> _Price:
    """The predicted cost as a function of every unit's width (:class:`_Price`)."""
    if budget == "latency_ratio":
        model_ms, table, curve = float(latency["model_ms"]), latency["segments"], saving_curve(latency)
        if not any(k in table for k in keys):
            raise CompressionError("the width latency table has no segment of this model's channel groups; rebuild "
                                   "it for this model with `minreal latency-table --kind width`")

        def latency_price(widths: list[int]) -> float:
            saving = sum(model_ms - _interpolate(table[k]["widths"], table[k]["ms"], w)
                         for k, w in zip(keys, widths) if k in table)
            return model_ms - calibrated_saving(curve, saving)
        return _Price(latency_price)
    where: dict[int, tuple[int, int]] = {}  # atom → (unit, rank of the atom in its unit)
    for u, (name, ranked, _, _) in enumerate(units):
        atoms = wg.group(name).atoms
        for r, i in enumerate(ranked):
            where[atoms[i]] = (u, r)
    return _CountPrice(cost_terms(wg), where, BUDGET_COST[budget], len(units))


def check_width_table(table: Mapping[str, Any], path: str | Path | None, model: nn.Module, multiple: int,
                      minimum: int = 0) -> None:
    """Refuse a width latency table measured on other weights, at another width multiple, or with a higher width
    minimum than the allocation's, both rounded up to the multiple (it lacks the narrower widths the allocator may
    choose; one line). A table without ``"minimum"`` (written before the field existed) was measured with none."""
    from ..cache import model_key

    if table.get("model_hash") not in (None, model_key(model)):
        raise CompressionError(f"width latency table {path} was measured on another model or other weights; rebuild "
                               "it for this one with `minreal latency-table MODEL --kind width --weights ...`")
    if int(table.get("multiple", multiple)) != multiple:
        raise CompressionError(f"width latency table {path} steps by {table['multiple']} channels but "
                               f"--width-multiple is {multiple}; rebuild it with --width-multiple {multiple} or "
                               f"pass --width-multiple {table['multiple']}")

    def floor(m: int) -> int:  # the narrowest width a minimum allows on the multiple (ladders step by it)
        return -(-m // max(multiple, 1)) * max(multiple, 1)

    if floor(int(table.get("minimum", 0))) > floor(minimum):
        raise CompressionError(f"width latency table {path} measured no width below {table['minimum']} channels but "
                               f"--width-min is {minimum}; rebuild it with --width-min {minimum} or pass "
                               f"--width-min {table['minimum']}")


def _floor_hint(multiple: int, minimum: int) -> str:
    """What lowers the floor of a refused budget, and at what cost (an empty string without a minimum)."""
    if not minimum:
        return ""
    finer = " --width-multiple 8" if multiple > 8 else ""
    return (f", `width_min`={minimum} (--width-min {minimum}: --width-min 0{finer} cuts further, but on the CPU an "
            "INT8 convolution narrower than 16 channels leaves ONNX Runtime's fast kernel and can run slower than "
            "the wider one)")


def _cost_weights(units: list, price: Callable[[list[int]], float], full: float) -> list[float]:
    """Each unit's cost per channel at full width: what narrowing it to the end of its ladder saves, every other
    unit whole, over the channels that removes (0 for a unit that cannot narrow or saves nothing). The whole ladder,
    not its first step: a latency table's first step often saves nothing (a kernel pads 56 channels to 64), and a
    zero weight would make every channel of the unit free to drop."""
    base = [ladder[0] for _, _, _, ladder in units]
    weights = []
    for u, (_, _, _, ladder) in enumerate(units):
        if len(ladder) < 2:
            weights.append(0.0)
            continue
        widths = base.copy()
        widths[u] = ladder[-1]
        weights.append(max(full - price(widths), 0.0) / (ladder[0] - ladder[-1]))
    return weights


def allocate_widths(wg: WidthGraph, scores: Mapping[str, torch.Tensor], budget: str, ratio: float,
                    multiple: int = 8, latency: Mapping[str, Any] | None = None,
                    report: dict[str, Any] | None = None, weighting: str = "cost", minimum: int = 0,
                    whole: float | None = None) -> dict[str, list[int]]:
    """Keep sets (indices into each group's atoms, highest scores first kept) meeting ``budget`` ≤ ``ratio``,
    every segment on :func:`segment_ladders` ``(multiple, minimum)``.

    ``scores``: one non-negative importance per atom for each group that may shrink. ``latency``: a width
    latency table (``minreal latency-table --kind width``), needed for ``latency_ratio``: the predicted
    latency is the whole model's minus the measured savings of each segment at its width, summed and mapped by
    :func:`saving_curve` (calibrated on the table's uniform cuts).
    After the budget is met, steps are taken back while it still holds (most importance regained per unit of
    cost first), so one coarse step does not overshoot.

    Scores are compared across groups after dividing by their group's mean. ``weighting="cost"`` (the default)
    then scales each segment's scores by its cost per channel at full width, so that a move's rate (importance
    lost per cost saved) is, while the segment's neighbours are whole, the mean relative score of the channels it
    drops, whatever the segment's cost: the least important channels go first in every group alike. ``"none"``
    keeps the relative scores as they are, which makes the costliest channels per unit the cheapest to cut — on an
    option-A ResNet the residual stream, whose channels feed every block (``benchmarks/width_allocation.json``).
    ``whole``: the whole model's cost of the budget's kind per sample (torch's MAC count, or every parameter), for
    a MAC or parameter budget: what it holds beyond the cost terms (34 % of a Swin-T's MACs: its attention, whose
    projections torchvision applies as functions of the weights, and the attention products) is taken as fixed, so
    the budget is of the whole model, ``ratio · whole``, not of the terms alone (the terms at 0.7 left a Swin-T at
    0.80 of its MACs).
    ``report`` (a dict) receives ``predicted_ratio`` (of the whole model when ``whole`` is given).
    Raises CompressionError naming the flag and the smallest reachable ratio when the budget cannot be met.
    """
    if weighting not in WEIGHTINGS:  # "auto" is the pruning methods' to resolve (minreal.compress.core.prune)
        raise CompressionError(f"`importance_weighting` (--importance-weighting) must be one of "
                               f"{', '.join(WEIGHTINGS)} here (auto is resolved by the method), got {weighting!r}",
                               fields=("importance_weighting",))
    if budget not in BUDGET_COST and not (budget == "latency_ratio" and latency is not None):
        raise CompressionError(f"width pruning meets {', '.join(f'`{b}`' for b in BUDGET_COST)}; `{budget}` needs a "
                               "width latency table (minreal latency-table --kind width)",
                               fields=(*BUDGET_COST, budget))
    units: list[tuple[str, list[int], torch.Tensor, list[int]]] = []  # group, atoms by score, norm, ladder
    keys: list[str] = []  # each unit's key in a width latency table
    for name, s in scores.items():
        g = wg.group(name)
        s = s.detach().double().clamp_min(0)
        if s.numel() != g.size:
            raise CompressionError(f"channel group {name!r}: {s.numel()} scores for {g.size} channels")
        norm = s / s.mean().clamp_min(1e-30)
        for k, (seg, ladder) in enumerate(zip(wg.segments(g), segment_ladders(wg, g, multiple, minimum))):
            keys.append(segment_key(name, k))
            units.append((name, sorted(seg, key=lambda i: -float(s[i])), norm, ladder))
    price = _pricer(wg, units, keys, budget, latency)
    step = [0] * len(units)
    widths = lambda: [units[u][3][step[u]] for u in range(len(units))]  # noqa: E731
    full = current = price(widths())
    fixed = max(0.0, float(whole) - full) if whole is not None and budget in BUDGET_COST else 0.0
    target = ratio * (full + fixed) - fixed
    if weighting == "cost":
        scale = _cost_weights(units, price, full)
        mean = sum(scale) / max(sum(w > 0 for w in scale), 1) or 1.0
        units = [(name, ranked, norm * (w / mean), ladder) for (name, ranked, norm, ladder), w in zip(units, scale)]

    ordered = [norm[ranked] for _, ranked, norm, _ in units]  # each unit's scores, most important first

    def lost(u: int, wide: int, narrow: int) -> float:
        return float(ordered[u][narrow:wide].sum())

    while current > target + 1e-9 * full:  # narrow where it costs least importance per saving; a move may
        best, best_rate, best_cost = None, float("inf"), current  # jump several steps past a flat stretch
        price.set(widths())
        for u, (_, _, _, ladder) in enumerate(units):
            now = step[u]
            if now + 1 >= len(ladder):
                continue
            for j, cost in enumerate(price.moved_all(u, ladder[now + 1:]).tolist(), start=now + 1):
                if current - cost > 1e-12 * full:
                    rate = lost(u, ladder[now], ladder[j]) / (current - cost)
                    if rate < best_rate:
                        best, best_rate, best_cost = (u, j), rate, cost
        if best is None:
            step = [len(units[u][3]) - 1 for u in range(len(units))]
            raise CompressionError(f"`{budget}`: {flag_of(budget)} {ratio:g} cannot be reached by width cuts: the "
                                   f"smallest predicted ratio is {(price(widths()) + fixed) / (full + fixed):.4f} "
                                   f"({_fixed_hint(fixed, full)}every group at its "
                                   f"narrowest allowed width{_floor_hint(multiple, minimum)}; frozen groups stay "
                                   "whole)", fields=(budget, *(("width_min",) if minimum else ())))
        step[best[0]] = best[1]
        current = best_cost
    while True:  # refill: widen back, most importance regained per cost first, while the budget still holds
        best, best_rate, best_cost = None, -1.0, current
        price.set(widths())
        for u, (_, _, _, ladder) in enumerate(units):
            if step[u] == 0:
                continue
            cost = price.moved(u, ladder[step[u] - 1])
            if cost > target + 1e-9 * full:
                continue
            rate = lost(u, ladder[step[u] - 1], ladder[step[u]]) / max(cost - current, 1e-12 * full)
            if rate > best_rate:
                best, best_rate, best_cost = u, rate, cost
        if best is None:
            break
        step[best] -= 1
        current = best_cost
    if report is not None:
        report["predicted_ratio"] = (current + fixed) / (full + fixed)
    keep: dict[str, list[int]] = {name: [] for name in scores}
    for u, (name, ranked, _, ladder) in enumerate(units):
        keep[name] += ranked[:ladder[step[u]]]
    return {name: sorted(k) for name, k in keep.items()}
