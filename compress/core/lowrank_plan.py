"""Shared planning for low-rank methods: find target layers, allocate ranks under a budget, apply factors.

Scoring (the spectra) belongs to each method; this module turns spectra into ranks and factors into modules.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .allocate import (
    KEEP,
    RankOptions,
    allocate,
    cheapest_cost,
    options_from_spectrum,
    rank_at_fraction,
    smallest_ranks,
    total_cost,
)
from .attention import PlainAttention, Unfused, unfuse_attention
from .conv1d import rewrite_conv1d
from .costs import CostTable, computes_as, count_costs, model_macs
from .errors import CompressionError
from .evaluate import eval_mode
from .inputs import Inputs, call
from .lowrank import FACTORIZABLE, build_pair, layer_macs, matrix_view, pair_macs, pair_params
from .options import Budget
from .report import CompressionReport, LayerReport
from .surgery import parent_weight_readers, replace_modules, tied_weights
from .width.tracing import is_exported_program

__all__ = ["Target", "factorisable_model", "find_targets", "note_attention", "plan_ranks", "apply_factors",
           "fill_report", "load_latency_table", "whole_model_total", "layer_target", "predicted_latency_ratio"]

CostFn = Callable[[int], float]
log = logging.getLogger(__name__)

@dataclass
class Target:
    """A layer to factorise: qualified name, module, output positions per sample."""

    name: str
    layer: nn.Module
    positions: int


def factorisable_model(model: nn.Module, example: Inputs) -> Unfused:
    """``model`` with its transformers ``Conv1D`` layers rewritten as nn.Linear
    (:func:`~minreal.compress.core.conv1d.rewrite_conv1d`) and its nn.MultiheadAttention layers as
    :class:`~minreal.compress.core.attention.PlainAttention` (a copy; same function, see
    :func:`~minreal.compress.core.attention.unfuse_attention`), so that GPT-2's projections and the q/k/v/out
    projections are plain Linear targets; ``model`` itself when it has neither. Should the rewritten model fail on
    ``example`` with an AttributeError (a parent reading the fused weights itself), the attention is kept fused and
    every attention layer reported as refused."""
    model, rewritten, left = rewrite_conv1d(model, example)
    result = _unfused_attention(model, example)
    result.conv1d, result.conv1d_left = rewritten, left
    return result


def _unfused_attention(model: nn.Module, example: Inputs) -> Unfused:
    if not any(isinstance(m, nn.MultiheadAttention) for m in model.modules()):
        return Unfused(model)
    result = unfuse_attention(model)
    if not result.unfused:
        return Unfused(model, refused=result.refused)
    try:
        with eval_mode(result.model), torch.no_grad():
            call(result.model, example)
    except AttributeError as exc:
        reason = f"the model fails once its attention is unfused ({exc}); it may read the fused weights itself"
        return Unfused(model, refused={**{n: reason for n in result.unfused}, **result.refused})
    return result


def note_attention(report: CompressionReport, unfused: Unfused) -> None:
    """Mark each layer of ``report`` that is a projection of an unfused attention layer (``details["attention"]``:
    that layer's name) and note which attention layers were unfused or left fused, and why, and which ``Conv1D``
    layers became nn.Linear."""
    if unfused.conv1d:
        report.notes.append(f"{len(unfused.conv1d)} Conv1D layer(s) (transformers' Linear with its weight stored "
                            "in × out) rewritten as nn.Linear (weight transposed, same function) so that they are "
                            f"candidates: {', '.join(n or '(the model)' for n in unfused.conv1d)}")
    for reason, names in _by_reason(unfused.conv1d_left).items():
        report.notes.append(f"{len(names)} layer(s) named Conv1D left as they are, not factorised ({reason}): "
                            f"{', '.join(n or '(the model)' for n in names)}")
    parents = set(unfused.unfused)
    for lr in report.layers:
        parent, _, child = lr.name.rpartition(".")
        if parent in parents and child in PlainAttention.PROJECTIONS:
            lr.details["attention"] = parent
    if unfused.unfused:
        report.notes.append(f"{len(unfused.unfused)} nn.MultiheadAttention layer(s) rewritten as PlainAttention "
                            "(separate q_proj/k_proj/v_proj/out_proj Linears, same function) so that their projections "
                            f"are candidates: {', '.join(n or '(the model)' for n in unfused.unfused)}")
    for name, reason in unfused.refused.items():
        report.notes.append(f"attention layer {name!r} left fused, its projections not factorised: {reason}")


def find_targets(model: nn.Module, example: torch.Tensor, exclude: tuple[str, ...] = (),
                 conv1d_left: Mapping[str, str] | None = None) -> tuple[list[Target], list[LayerReport], CostTable]:
    """Factorisable layers of ``model`` and the layers skipped with their reasons (``conv1d_left``: layers named
    ``Conv1D`` that :func:`factorisable_model` left, with the reason; reported as skipped).

    A target is a Linear or ConvNd, or a subclass computing as one (:func:`~minreal.compress.core.costs.computes_as`:
    torchvision's video ``Conv3DSimple``); a subclass with a computation of its own (timm's ``StdConv2d``) is not.
    """
    table = count_costs(model, example)
    readers = {**parent_weight_readers(model), **(conv1d_left or {})}
    tied = tied_weights(model)
    targets, skipped = [], []
    for name, mod in model.named_modules():
        if name in readers:
            own = sum(p.numel() for p in mod.parameters(recurse=False))
            skipped.append(LayerReport(name, type(mod).__name__, "skipped", readers[name], own, own))
            continue
        if computes_as(mod, FACTORIZABLE) is None or name not in table.layers:  # a forward of its own: not W x + b
            continue
        cost = table.layers[name]
        reason = "excluded by option" if name in exclude else tied.get(name, "")
        if not reason and matrix_view(mod).max_rank <= 1:
            reason = "depthwise/rank-1 layer: factorising cannot reduce its cost"
        if reason:
            skipped.append(LayerReport(name, cost.kind, "skipped", reason, cost.params, cost.params,
                                       cost.macs, cost.macs))
        else:
            targets.append(Target(name, mod, cost.positions))
    if not targets and is_exported_program(model):  # its layers are ATen calls on weight tensors, not modules
        raise CompressionError("rank methods need the model's Python modules (an nn.Module built by its code, e.g. "
                               "file.py:factory or a torchvision name): a torch.export program (.pt2) holds ATen "
                               "operations, whose layers cannot be split; compress the model it was made from")
    if not targets:
        raise CompressionError(f"model has no Linear/Conv layer that can be factorised{_conv1d_hint(conv1d_left)}")
    return targets, skipped, table


def _by_reason(left: Mapping[str, str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, reason in left.items():
        grouped.setdefault(reason, []).append(name)
    return grouped


def _conv1d_hint(left: Mapping[str, str] | None) -> str:
    """The refusal's tail naming the layers called ``Conv1D`` that were not read as transformers' transposed Linear
    (``y = x @ W + b``), the first three by name, with the first reason; empty where there are none."""
    if not left:
        return ""
    names = list(left)
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return (f"; its {len(names)} layer(s) named Conv1D ({', '.join(names[:3])}{more}) were not read as a Linear: "
            f"{left[names[0]]}; replace each by an nn.Linear or a ConvNd computing the same function, then compress")


def _cost_fn(t: Target, kind: str):
    if kind == "params":
        return lambda r: float(pair_params(t.layer, r))
    return lambda r: float(pair_macs(t.layer, r, t.positions))


def _keep_cost(t: Target, kind: str) -> float:
    if kind == "params":
        return float(sum(p.numel() for p in t.layer.parameters(recurse=False)))
    return float(layer_macs(t.layer, t.positions))


def _layer_costs(targets: list[Target], kind: str, cost_tables: Mapping[str, CostFn] | None,
                 keep_costs: Mapping[str, float] | None) -> tuple[dict[str, CostFn], dict[str, float]]:
    """Cost function and keep cost per target: measured tables when given, else counted MACs/params."""
    if cost_tables is None:
        if kind == "latency":
            raise CompressionError("a latency budget needs measured per-layer cost tables")
        return {t.name: _cost_fn(t, kind) for t in targets}, {t.name: _keep_cost(t, kind) for t in targets}
    if keep_costs is None:
        raise CompressionError("cost_tables need keep_costs (the measured cost of each original layer)")
    missing = [t.name for t in targets if t.name not in cost_tables or t.name not in keep_costs]
    if missing:
        raise CompressionError(f"the cost table has no entry for layer(s) {', '.join(missing)}; "
                               "rebuild it for this model with `minreal latency-table`")
    return ({t.name: cost_tables[t.name] for t in targets},
            {t.name: float(keep_costs[t.name]) for t in targets})


def plan_ranks(targets: list[Target], sq_spectra: dict[str, np.ndarray], budget: Budget,
               cost_tables: Mapping[str, CostFn] | None = None, keep_costs: Mapping[str, float] | None = None,
               whole_total: float | None = None) -> tuple[dict[str, int], list[RankOptions]]:
    """Ranks per layer (``KEEP`` = leave the layer) from squared singular values summed over groups.

    ``cost_tables`` (rank -> cost) and ``keep_costs`` (cost of the original layer), e.g. measured
    latencies, replace the counted MAC/param costs when given. A whole-model budget (``scope="model"``)
    needs ``whole_total``, the whole model's cost of the budget's kind (see :func:`whole_model_total`).
    """
    fns, keeps = _layer_costs(targets, budget.cost_kind, cost_tables, keep_costs)
    options = [options_from_spectrum(t.name, sq_spectra[t.name], fns[t.name], keeps[t.name],
                                     budget.rank_multiple) for t in targets]
    if budget.rank_fraction is not None:
        return {o.name: rank_at_fraction(o, budget.rank_fraction) for o in options}, options
    if budget.scope == "model":
        if whole_total is None:
            raise CompressionError("a whole-model budget needs the whole model's cost (whole_total)")
        target = layer_target(options, whole_total, budget.ratio, budget.flag(budget.given[0]), budget.rank_multiple)
    else:
        target = budget.ratio * sum(o.keep_cost for o in options)
        _check_layer_target(options, target, budget)
    return allocate(options, target, budget.allocator), options


def _multiple_hint(rank_multiple: int) -> str:
    """What a rank multiple above 1 adds to an unreachable-budget message (nothing for 1)."""
    if rank_multiple <= 1:
        return ""
    return (f"; ranks are multiples of `rank_multiple` (--rank-multiple {rank_multiple}) (from --providers unless "
            "given), a smaller multiple reaches lower")


def _hint_fields(rank_multiple: int) -> tuple[str, ...]:
    """The field :func:`_multiple_hint` names (none for a multiple of 1)."""
    return ("rank_multiple",) if rank_multiple > 1 else ()


def _check_layer_target(options: list[RankOptions], target: float, budget: Budget) -> None:
    """CompressionError naming the ``--layer-*`` flag when a factorisable-layer budget is below every allocation."""
    floor, full = cheapest_cost(options), sum(o.keep_cost for o in options)
    if floor > target:
        raise CompressionError(
            f"{budget.flag(budget.given[0])} {budget.ratio:g} cannot be reached: the smallest ratio of the "
            f"factorisable layers' cost is {floor / max(full, 1e-300):.4f} ({smallest_ranks(options)}); raise the "
            f"ratio{_multiple_hint(budget.rank_multiple)}", fields=_hint_fields(budget.rank_multiple))


def predicted_latency_ratio(options: list[RankOptions], ranks: dict[str, int], whole_total: float) -> float:
    """The whole-model latency ratio a latency table predicts for ``ranks``: the unfactorised rest unchanged,
    each factorisable layer at its table latency (the sum taken as the whole when it exceeds the whole-model
    latency, as :func:`layer_target` does)."""
    layers = sum(o.keep_cost for o in options)
    total = max(whole_total, layers)
    return (total - layers + total_cost(options, ranks)) / max(total, 1e-300)


def layer_target(options: list[RankOptions], whole_total: float, ratio: float, flag: str, multiple: int = 1) -> float:
    """The factorisable layers' cost that meets a whole-model ``ratio``: ``ratio·total − (total − Σ keep)``.

    Raises CompressionError naming ``flag`` and the smallest whole-model ratio the layers can reach (every
    layer at its cheapest rank, the rest of the model unchanged) when ``ratio`` is below it; ``multiple`` (the
    rank multiple) is mentioned there when above 1. When the layers' costs sum to more than ``whole_total`` (per-layer
    latencies measured one layer at a time can), their sum is taken as the whole, with a warning, so the smallest ratio
    is never above 1.
    """
    layers = sum(o.keep_cost for o in options)
    if layers > whole_total:
        log.warning("the factorisable layers' costs sum to %.4g, more than the whole model's %.4g (layers measured "
                    "one at a time); %s is taken of their sum", layers, whole_total, flag)
        whole_total = layers
    rest = whole_total - layers
    smallest = (rest + cheapest_cost(options)) / max(whole_total, 1e-300)
    if ratio < smallest - 1e-12:
        field = flag.removeprefix("--").replace("-", "_")
        raise CompressionError(f"`{field}`: {flag} {ratio:g} cannot be reached: the smallest whole-model ratio this "
                               f"method can reach is {smallest:.4f} (every factorisable layer at its lowest rank; "
                               f"{rest / max(whole_total, 1e-300):.4f} of the cost is in layers it does not "
                               f"factorise{_multiple_hint(multiple)})", fields=(field, *_hint_fields(multiple)))
    return ratio * whole_total - rest


def whole_model_total(budget: Budget, model: nn.Module, example: torch.Tensor, table: CostTable,
                      latency_table: str | Path | None) -> float | None:
    """The whole model's cost of ``budget``'s kind (None for a factorisable-layer budget): MACs as the report
    counts them (:func:`~minreal.compress.core.costs.model_macs`), parameters, or the measured whole-model latency
    of ``latency_table``."""
    if budget.scope != "model":
        return None
    if budget.cost_kind == "latency":
        return load_model_latency(latency_table)
    if budget.cost_kind == "params":
        return float(table.total_params)
    return float(model_macs(model, example))


def _interpolated(ranks: list[float], ms: list[float]) -> CostFn:
    grid, times = np.asarray(ranks, dtype=np.float64), np.asarray(ms, dtype=np.float64)
    return lambda r: float(np.interp(r, grid, times))  # clipped to the end values outside the grid


def _positive(value: Any, what: str) -> float:
    """``value`` as a float when it is a finite, positive number (a measured time or a rank)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} is {value!r}, not a finite positive number")
    return float(value)


def _checked_grid(name: str, ranks: Any, ms: Any) -> tuple[list[float], list[float]]:
    """A layer's measured grid: increasing positive ranks and as many finite positive times."""
    if not isinstance(ranks, list) or not isinstance(ms, list) or not ranks or len(ranks) != len(ms):
        raise ValueError(f"layer {name!r} needs equally long, non-empty lists ranks and ms")
    grid = [_positive(r, f"a rank of layer {name!r}") for r in ranks]
    if any(b <= a for a, b in zip(grid, grid[1:])):
        raise ValueError(f"the ranks of layer {name!r} do not increase")
    return grid, [_positive(t, f"a time of layer {name!r}") for t in ms]


def load_latency_table(path: str | Path) -> tuple[dict[str, CostFn], dict[str, float]]:
    """Per-layer latency cost functions (linear interpolation over the measured rank grid, clipped) and
    keep latencies from a JSON table ``{"provider", "layers": {name: {"keep_ms", "ranks", "ms"}}}``."""
    try:
        layers = json.loads(Path(path).read_text())["layers"]
        tables = {n: _interpolated(*_checked_grid(n, e["ranks"], e["ms"])) for n, e in layers.items()}
        keeps = {n: _positive(e["keep_ms"], f"layer {n!r} keep_ms") for n, e in layers.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CompressionError(f"cannot read latency table {path}: {exc}; build one with "
                               "`minreal latency-table`") from None
    return tables, keeps


def load_model_latency(path: str | Path | None) -> float:
    """The whole-model latency (``model_ms``) of a latency table; tables built before it was recorded say
    to rebuild."""
    try:
        return _positive(json.loads(Path(str(path)).read_text())["model_ms"], "model_ms")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CompressionError(f"latency table {path} has no whole-model latency ({exc}), which `latency_ratio` "
                               "needs; rebuild it with `minreal latency-table`", fields=("latency_ratio",)) from None


def apply_factors(model: nn.Module, targets: list[Target],
                  factors: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
                  | Iterable[tuple[str, tuple[torch.Tensor, torch.Tensor]]]) -> nn.Module:
    """A copy of ``model`` with each factorised layer replaced by its pair (factors: first, second).

    ``factors`` is a mapping, or an iterable of ``(name, (first, second))`` consumed one layer at a time, so only
    one layer's (float64) factors are alive beside the pairs already built.
    """
    by_name = {t.name: t for t in targets}
    items = factors.items() if isinstance(factors, Mapping) else factors
    pairs = {n: build_pair(by_name[n].layer, a, b) for n, (a, b) in items}
    return replace_modules(model, pairs)


def fill_report(report: CompressionReport, table: CostTable, targets: list[Target], skipped: list[LayerReport],
                ranks: dict[str, int], sq_spectra: dict[str, np.ndarray]) -> None:
    """Per-layer costs before and after (from the original's cost ``table``) and retained energy per layer;
    the whole-model costs are filled by :func:`minreal.compress.registry.compress`."""
    for t in targets:
        r = ranks[t.name]
        b = table.layers[t.name]
        sq = np.clip(sq_spectra[t.name], 0, None)
        kept = 1.0 if r == KEEP else float(sq[:r].sum() / max(sq.sum(), 1e-300))
        if r == KEEP:
            report.layers.append(LayerReport(t.name, b.kind, "kept", "factorising would not reduce cost at the "
                                             "allocated rank", b.params, b.params, b.macs, b.macs, None,
                                             matrix_view(t.layer).max_rank, {"energy_kept": 1.0}))
            continue
        pa = pair_params(t.layer, r)
        ma = pair_macs(t.layer, r, t.positions)
        report.layers.append(LayerReport(t.name, b.kind, "factorized", "", b.params, pa, b.macs, ma, r,
                                         matrix_view(t.layer).max_rank, {"energy_kept": kept}))
    report.layers.extend(skipped)
    fact = [lr for lr in report.layers if lr.name in ranks]
    keep_total = sum(lr.macs_before for lr in fact)
    report.predicted.factorizable_mac_ratio = sum(lr.macs_after for lr in fact) / max(keep_total, 1)
    report.predicted.factorizable_param_ratio = (sum(lr.params_after for lr in fact)
                                                     / max(sum(lr.params_before for lr in fact), 1))
