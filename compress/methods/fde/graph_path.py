"""``fde`` on any traceable model: ε-FDE over the channel groups of its traced graph (maths in :mod:`.graph`), cut by
:func:`minreal.compress.core.width.apply_cuts`, a whole-model MAC or parameter budget met by bisecting ε.

No output-deviation bound here: the interval bound (:mod:`.bound`) is for Linear chains (the MLP path); this
path reports the deviation measured on the calibration data, unless the caller measures on its own held-out data
(:func:`minreal.compress.core.measuring.measuring`), which the report's notes then say.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from ...core.costs import model_macs
from ...core.data import Dataset
from ...core.distributed import shard
from ...core.errors import CompressionError
from ...core.measuring import measuring
from ...core.options import flag_of
from ...core.report import CompressionReport, LayerReport
from ...core.width import WidthGraph, analyse, apply_cuts, is_exported_program
from .graph import (
    MAX_EPS,
    WHOLE,
    GroupPlan,
    Lumper,
    LumpStats,
    Partition,
    blocks_of,
    dead_atoms,
    group_cuts,
    plan_groups,
)

if TYPE_CHECKING:
    from .config import FDEConfig

__all__ = ["GraphPrepared", "fde_graph", "graph_prepare", "graph_realise"]

#: Bisection steps on ε in [0, MAX_EPS] for a budget (resolution MAX_EPS / 2¹⁴ ≈ 1e-4).
_BISECTIONS = 14
_BATCH = 256


@dataclass
class _Lumped:
    """One merge: the partitions, refinement statistics, the cut model and the ε it was made at."""

    parts: dict[str, Partition]
    stats: LumpStats
    model: fx.GraphModule
    eps: float


def _lump(wg: WidthGraph, lumper: Lumper, eps: float) -> _Lumped:
    parts, stats = lumper.at(eps)
    return _Lumped(parts, stats, apply_cuts(wg, group_cuts(lumper.plans, parts)), eps)


def _cost(model: nn.Module, example: torch.Tensor, kind: str) -> float:
    """Whole-model parameters, or MACs per sample as the report counts them
    (:func:`~minreal.compress.core.costs.model_macs`)."""
    if kind == "param_ratio":
        return float(sum(p.numel() for p in model.parameters()))
    return float(model_macs(model, example))


def _meet_budget(model: nn.Module, wg: WidthGraph, lumper: Lumper, cfg: "FDEConfig", data: Dataset,
                 report: CompressionReport) -> _Lumped:
    """The merge at the smallest ε found by bisection whose cut model meets the budget (ε = 0 when that does);
    a one-line error naming the smallest reachable ratio (ε = MAX_EPS) when even that misses it."""
    kind = cfg.budget_given[0]
    target, flag = getattr(cfg, kind), flag_of(kind)
    example = data.x[:min(len(data), 8)]
    full = _cost(model, example, kind)

    ratios: dict[bytes, float] = {}  # cost ratio per cut: the same leaders keep the same widths, so the same cost

    def attempt(eps: float) -> tuple[_Lumped | None, float]:
        """The cut at ``eps`` and its cost ratio; the cut model is built only for a cut not costed yet (None)."""
        parts, stats = lumper.at(eps)
        cut = b"".join(k.encode() + parts[k].leader.tobytes() for k in sorted(parts))
        if cut in ratios:
            return None, ratios[cut]
        lumped = _Lumped(parts, stats, apply_cuts(wg, group_cuts(lumper.plans, parts)), eps)
        ratios[cut] = _cost(lumped.model, example, kind) / full
        return lumped, ratios[cut]

    best, ratio = attempt(MAX_EPS)
    if ratio > target:
        raise CompressionError(f"{flag} {target:g} cannot be met: merging every channel fde may merge "
                               f"(ε = {MAX_EPS:g}) reaches {ratio:.3g} at best; give {flag} >= {ratio:.3g}")
    lo, hi = 0.0, MAX_EPS
    for step in range(_BISECTIONS + 1):
        eps = 0.0 if step == 0 else (lo + hi) / 2
        lumped, r = attempt(eps)
        if r <= target:
            best, ratio, hi = lumped, r, eps
        else:
            lo = eps
        if hi == 0.0:
            break
    if best is None:  # the cut at ``hi`` was a memo hit (costed at another ε): build it, with the merges of ``hi``
        best = _lump(wg, lumper, hi)
    report.predicted.merge_eps_reached, report.predicted.budget_cost_ratio = hi, ratio
    report.notes.append(f"{flag} {target:g}: merge tolerance bisected to ε = {hi:.4g} (cost ratio {ratio:.3g}); "
                        "channels merge in blocks, so the ratio can land below the budget")
    return best


def _group_report(plan: GroupPlan, part: Partition) -> LayerReport:
    """Widths before/after, dead channels removed and the merged blocks (atom indices) of one group."""
    before = plan.group.size
    blocks = list(blocks_of(part).values())
    dead = int((part.leader < 0).sum())
    merged_blocks = [b.tolist() for b in blocks if len(b) > 1]
    merged = before - dead - len(blocks)
    details = {"width_before": before, "width_after": len(blocks), "dead_removed": dead, "merged": merged,
               "mode": plan.mode, "blocks": len(merged_blocks),
               "largest_block": max(map(len, merged_blocks), default=1), "merged_blocks": merged_blocks}
    action = "merged" if merged else "reduced" if dead else "kept"
    return LayerReport(plan.group.name, "channel group", action, plan.reason, rank=len(blocks), full_rank=before,
                       details=details)


def _flat(out: Any) -> torch.Tensor:
    """A model output (tensor, or tuple/list/dict of them) as one ``[batch, features]`` float64 matrix."""
    if isinstance(out, torch.Tensor):
        return out.reshape(len(out), -1).double()
    items = out.values() if isinstance(out, dict) else out
    return torch.cat([_flat(o) for o in items], 1)


def _max_deviation(model: nn.Module, new: nn.Module, data: Dataset) -> tuple[str, float]:
    """``max |model(x) − new(x)|`` over the calibration inputs: in float64 when both run in it, else as they are."""
    for dtype in (torch.float64, None):
        a, b = (copy.deepcopy(m).eval() for m in (model, new))
        if dtype is not None:
            a, b = a.to(dtype), b.to(dtype)
        try:
            with torch.no_grad():
                dev = 0.0
                for xb in data.inputs(_BATCH):
                    xb = xb.to(dtype) if dtype is not None and xb.is_floating_point() else xb
                    dev = max(dev, float((_flat(a(xb)) - _flat(b(xb))).abs().max()))
        except RuntimeError:
            if dtype is None:
                raise
            continue
        return ("max_output_deviation_data_float64" if dtype is not None else "max_output_deviation_data"), dev
    raise AssertionError("unreachable")


def _fill_report(report: CompressionReport, plans: dict[str, GroupPlan], lumped: _Lumped) -> None:
    cut = [name for name, p in plans.items() if not p.group.frozen]
    report.layers = [_group_report(plans[name], lumped.parts[name]) for name in cut]
    widths = {lr.name: [lr.full_rank, lr.rank] for lr in report.layers}
    dead = sum(lr.details["dead_removed"] for lr in report.layers)
    merged = sum(lr.details["merged"] for lr in report.layers)
    whole = {name: plans[name].reason for name in cut if plans[name].mode == WHOLE}
    report.predicted = replace(
        report.predicted, output_deviation_bound=None, hidden_widths_before=[w[0] for w in widths.values()],
        hidden_widths=[w[1] for w in widths.values()], group_widths=widths, dead_removed=dead,
        merged_channels=merged, sweeps=lumped.stats.sweeps, block_splits=lumped.stats.splits,
        block_merges=lumped.stats.merges, merge_eps=lumped.eps, groups_left_whole=whole)
    report.notes += [
        "graph path: no output-deviation bound (the interval bound is MLP-only); " + (
            "the deviation is measured on the calibration data" if measuring() else
            "the deviation is not measured here: the caller measures the result on its own held-out data"),
        f"{merged} channels merged in {sum(lr.action == 'merged' for lr in report.layers)} channel groups "
        f"({lumped.stats.splits} block splits refining the exact partition, {lumped.stats.merges} block merges at "
        f"ε = {lumped.eps:g}; {lumped.stats.sweeps} sweeps); {dead} dead channels removed "
        "(exactly 0 on the calibration data at every state point: exact on that data only)"]
    if whole:
        report.notes.append("left whole: " + "; ".join(f"{k} ({v})" for k, v in whole.items()))


def _like_input(model: nn.Module, gm: fx.GraphModule) -> nn.Module:
    """A Sequential comes back as a Sequential of the resized layers when its traced graph only chains them;
    any other model as the cut graph module."""
    if not isinstance(model, nn.Sequential) or any(n.op not in ("placeholder", "call_module", "output")
                                                   for n in gm.graph.nodes):
        return gm
    out = copy.deepcopy(model)
    for n in gm.graph.nodes:
        if n.op == "call_module":
            parent, _, name = n.target.rpartition(".")
            setattr(out.get_submodule(parent), name, gm.get_submodule(n.target))
    return out.train(gm.training)


@dataclass
class GraphPrepared:
    """What ``fde`` computes once on a traceable model, whatever ε or the budget: ``model`` (the original, a
    reference) and ``data`` (the calibration data: the graph is traced again on its first inputs, the budget's costs
    are counted and the deviation measured on it); ``exact``: every channel group's exact partition (dead channels
    removed, refinement to the greatest fixpoint); ``stats``: that refinement's sweeps and splits; ``dtype``: the
    model's parameter dtype (the rounding tolerance); ``timings_s``: the preparation's timings."""

    model: nn.Module
    data: Dataset
    exact: dict[str, Partition]
    stats: LumpStats
    dtype: torch.dtype
    timings_s: dict[str, float] = field(default_factory=dict)


def graph_prepare(model: nn.Module, data: Dataset, cfg: "FDEConfig") -> GraphPrepared:
    """The budget-free phase of the graph path: the channel analysis, dead channels (exactly 0 on the data at every
    state point) and the exact partition of every group (:class:`~.graph.Lumper`)."""
    if is_exported_program(model):
        raise CompressionError("fde needs the Python model (path/to/file.py:factory or a torchvision name): the "
                               "layers of a torch.export program (.pt2) cannot be resized")
    if cfg.graph_options_given():
        raise CompressionError("`representative` and `compensation`: --representative mean/lstsq and --compensation "
                               "are for MLPs; fde merges channels of other models into their leader "
                               "(--representative leader, no --compensation)",
                               fields=("representative", "compensation"))
    timings = {}
    t0 = time.perf_counter()
    wg = analyse(model, data.x[:2])
    plans = plan_groups(wg, cfg.scaling)
    timings["analyse"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dead = dead_atoms(wg, plans, list(shard(data).inputs(_BATCH))) if cfg.remove_dead else {}
    timings["dead"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dtype = next(model.parameters(), torch.empty(0)).dtype
    lumper = Lumper(wg, plans, dead, dtype, cfg.max_sweeps)
    timings["refine"] = time.perf_counter() - t0
    return GraphPrepared(model, data, lumper.exact, lumper.stats, dtype, timings)


def graph_realise(prep: GraphPrepared, cfg: "FDEConfig", report: CompressionReport) -> nn.Module:
    """The per-budget phase of the graph path: the graph traced again, ε-FDE merges from the prepared exact
    partitions at ``cfg.merge_eps`` or bisected to a MAC/parameter budget, the cut model."""
    model, data = prep.model, prep.data
    report.timings_s.update(prep.timings_s)
    t0 = time.perf_counter()
    wg = analyse(model, data.x[:2])
    plans = plan_groups(wg, cfg.scaling)
    lumper = Lumper.from_exact(wg, plans, prep.exact, prep.stats, prep.dtype, cfg.max_sweeps)
    lumped = (_meet_budget(model, wg, lumper, cfg, data, report) if cfg.budget_given
              else _lump(wg, lumper, cfg.merge_eps))
    report.timings_s["partition"] = time.perf_counter() - t0
    _fill_report(report, plans, lumped)
    new = _like_input(model, lumped.model)
    if measuring():  # off when the caller measures on its own held-out data (tune): 62 % of this phase's time
        key, dev = _max_deviation(model, new, data)
        setattr(report.measured, key, dev)  # a field of Measured: max_output_deviation_data[_float64]
    return new


def fde_graph(model: nn.Module, data: Dataset, cfg: "FDEConfig", report: CompressionReport) -> nn.Module:
    """Dead channels (exactly 0 on the data at every state point) removed, then ε-FDE merging in every channel
    group of the traced model (:mod:`.graph`), at ``cfg.merge_eps`` or bisected to a MAC/parameter budget
    (:func:`graph_prepare`, then :func:`graph_realise`)."""
    return graph_realise(graph_prepare(model, data, cfg), cfg, report)
