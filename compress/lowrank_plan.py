"""Shared planning for low-rank methods: find target layers, allocate ranks under a budget, apply factors.

Scoring (the spectra) belongs to each method; this module turns spectra into ranks and factors into modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .allocate import KEEP, RankOptions, allocate, options_from_spectrum, rank_at_fraction
from .costs import CostTable, count_costs
from .errors import CompressionError
from .lowrank import FACTORIZABLE, build_pair, layer_macs, matrix_view, pair_macs, pair_params
from .report import CompressionReport, LayerReport
from .surgery import parent_weight_readers, replace_modules

__all__ = ["Budget", "Target", "find_targets", "plan_ranks", "apply_factors", "fill_report"]


@dataclass(frozen=True)
class Budget:
    """How ranks are chosen: a cost target (``flops`` or ``params`` ratio) or a plain rank fraction."""

    flops: float | None = None
    params: float | None = None
    rank_fraction: float | None = None
    allocator: str = "lagrangian"
    rank_multiple: int = 1

    def validate(self) -> "Budget":
        given = [k for k in ("flops", "params", "rank_fraction") if getattr(self, k) is not None]
        if len(given) > 1:
            raise CompressionError(f"give only one of --flops/--params/--rank-fraction, got {', '.join(given)}")
        for k in given:
            v = getattr(self, k)
            if not 0.0 < v <= 1.0:
                raise CompressionError(f"--{k.replace('_', '-')} must lie in (0, 1], got {v}")
        if self.rank_multiple < 1:
            raise CompressionError(f"--rank-multiple must be >= 1, got {self.rank_multiple}")
        return self if given else Budget(flops=0.5, allocator=self.allocator, rank_multiple=self.rank_multiple)

    @property
    def cost_kind(self) -> str:
        return "params" if self.params is not None else "macs"


@dataclass
class Target:
    """A layer to factorise: qualified name, module, output positions per sample."""

    name: str
    layer: nn.Module
    positions: int


def find_targets(model: nn.Module, example: torch.Tensor, exclude: tuple[str, ...] = ()
                 ) -> tuple[list[Target], list[LayerReport], CostTable]:
    """Factorisable layers of ``model`` and the layers skipped with their reasons."""
    table = count_costs(model, example)
    readers = parent_weight_readers(model)
    targets, skipped = [], []
    for name, mod in model.named_modules():
        if name in readers:
            own = sum(p.numel() for p in mod.parameters(recurse=False))
            skipped.append(LayerReport(name, type(mod).__name__, "skipped", readers[name], own, own))
            continue
        if not isinstance(mod, FACTORIZABLE) or name not in table.layers:
            continue
        cost = table.layers[name]
        reason = "excluded by option" if name in exclude else ""
        if not reason and matrix_view(mod).max_rank <= 1:
            reason = "depthwise/rank-1 layer: factorising cannot reduce its cost"
        if reason:
            skipped.append(LayerReport(name, cost.kind, "skipped", reason, cost.params, cost.params,
                                       cost.macs, cost.macs))
        else:
            targets.append(Target(name, mod, cost.positions))
    if not targets:
        raise CompressionError("model has no Linear/Conv layer that can be factorised")
    return targets, skipped, table


def _cost_fn(t: Target, kind: str):
    if kind == "params":
        return lambda r: float(pair_params(t.layer, r))
    return lambda r: float(pair_macs(t.layer, r, t.positions))


def _keep_cost(t: Target, kind: str) -> float:
    if kind == "params":
        return float(sum(p.numel() for p in t.layer.parameters(recurse=False)))
    return float(layer_macs(t.layer, t.positions))


def plan_ranks(targets: list[Target], sq_spectra: dict[str, np.ndarray], budget: Budget
               ) -> tuple[dict[str, int], list[RankOptions]]:
    """Ranks per layer (``KEEP`` = leave the layer) from squared singular values summed over groups."""
    kind = budget.cost_kind
    options = [options_from_spectrum(t.name, sq_spectra[t.name], _cost_fn(t, kind), _keep_cost(t, kind),
                                     budget.rank_multiple) for t in targets]
    if budget.rank_fraction is not None:
        return {o.name: rank_at_fraction(o, budget.rank_fraction) for o in options}, options
    ratio = budget.flops if budget.flops is not None else budget.params
    total = sum(o.keep_cost for o in options)
    return allocate(options, ratio * total, budget.allocator), options


def apply_factors(model: nn.Module, targets: list[Target], factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
                  ) -> nn.Module:
    """A copy of ``model`` with each factorised layer replaced by its pair (factors: first, second)."""
    by_name = {t.name: t for t in targets}
    pairs = {n: build_pair(by_name[n].layer, a, b) for n, (a, b) in factors.items()}
    return replace_modules(model, pairs)


def fill_report(report: CompressionReport, model: nn.Module, new: nn.Module, example: torch.Tensor,
                targets: list[Target], skipped: list[LayerReport], ranks: dict[str, int],
                sq_spectra: dict[str, np.ndarray]) -> None:
    """Per-layer and whole-model costs, retained energy per layer, before and after."""
    before, after = count_costs(model, example), count_costs(new, example)
    report.params_before, report.params_after = before.total_params, sum(p.numel() for p in new.parameters())
    report.macs_before, report.macs_after = before.macs, after.macs
    report.not_counted = before.not_counted
    for t in targets:
        r = ranks[t.name]
        b = before.layers[t.name]
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
    report.predicted["factorizable_mac_ratio"] = sum(lr.macs_after for lr in fact) / max(keep_total, 1)
    report.predicted["factorizable_param_ratio"] = (sum(lr.params_after for lr in fact)
                                                     / max(sum(lr.params_before for lr in fact), 1))
    report.predicted["whole_model_mac_ratio"] = report.mac_ratio
    report.predicted["whole_model_param_ratio"] = report.param_ratio
