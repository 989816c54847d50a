"""``fde``: ε-forward-differential-equivalence merging of MLP neurons (maths in :mod:`.partition` and :mod:`.bound`)
and of the channels of any traceable model (:mod:`.graph_path`).

Every model but a Sequential MLP takes the graph path: channel groups from the traced graph, channels exactly 0 on
the calibration data at every state point dropped, then ε-FDE merging in every group (scaled merges where the
group's operations are positively homogeneous), no sum merges and no bound.

MLP pipeline: fold BatchNorm → remove neurons constant on the calibration data (dead ReLUs; a separate, reported
step, exact on that data) → partition refinement to a fixpoint → plain Linear stack (recovery, if asked for, is the
shared stage after it). The report predicts a bound on ``max |N(x) − N'(x)|`` over the calibration input box (widened by
``box_margin``) and measures the deviation on that box and on the data.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from ...core.chain import Chain, build_sequential, chain_forward, chain_layer_reports, extract_chain
from ...core.data import Dataset
from ...core.errors import CompressionError
from ...core.measuring import measuring
from ...core.options import flag_of
from ...core.prune import CHAIN_COSTS, widths_for_params
from ...core.recover_options import RecoveryConfig
from ...core.report import CompressionReport
from ...core.run_case import RunCase, VariantSpec
from .compensate import compensate, refit_bound
from .config import FDEConfig
from .graph_path import GraphPrepared, graph_prepare, graph_realise
from .partition import RefineResult, box_samples, merge_to_widths, refine, remove_all_constant

__all__ = ["FDEPrepared", "fde_compress", "fde_prepare", "fde_realise", "input_box", "demo_case"]


def input_box(x: torch.Tensor, margin: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature min/max of ``x`` (flattened), widened by ``margin`` × range on each side (float64)."""
    flat = x.reshape(len(x), -1).double()
    lo, hi = flat.amin(0), flat.amax(0)
    pad = margin * (hi - lo)
    return lo - pad, hi + pad


def _layer_details(dead: RefineResult, merged: RefineResult, before: Chain) -> list[dict]:
    details = []
    for l, width in enumerate(before.widths):
        kinds = {}
        for s in merged.steps:
            if s.layer == l:
                kinds[s.kind] = kinds.get(s.kind, 0) + s.width_before - s.width_after
        removed = sum(s.width_before - s.width_after for s in dead.steps if s.layer == l)
        blocks = [g for g in merged.chain.groups[l] if len(g) > 1]
        details.append({"width_before": width, "dead_removed": removed, "merged_by": kinds,
                        "blocks": len(blocks), "largest_block": max(map(len, blocks), default=1)})
    return details


def _merge(chain: Chain, original: Chain, data: Dataset, cfg: FDEConfig, box: tuple[torch.Tensor, torch.Tensor],
           report: CompressionReport) -> RefineResult:
    """Refinement at ``merge_eps``, or, with a budget, one forward pass to the budget's uniform-fraction widths
    (per-layer tolerances: widths are not monotone in a global ε, so the count is bisected per layer)."""
    if not cfg.budget_given:
        return refine(chain, cfg.merge_eps, scaling=cfg.scaling, sums=cfg.sum_merges, max_sweeps=cfg.max_sweeps,
                      box=box, representative=cfg.representative, x=data.x)
    kind = cfg.budget_given[0]
    n_in, n_out = original.weights[0].shape[1], original.weights[-1].shape[0]
    widths = widths_for_params(n_in, original.widths, n_out, getattr(cfg, kind), kind)
    merged = merge_to_widths(chain, widths, scaling=cfg.scaling, representative=cfg.representative, x=data.x,
                             box=box)
    cost, full = CHAIN_COSTS[kind], CHAIN_COSTS[kind](n_in, original.widths, n_out)
    reached = cost(n_in, merged.chain.widths, n_out) / full
    if reached > cost(n_in, [w + 1 for w in widths], n_out) / full:
        raise CompressionError(f"`{kind}`: {flag_of(kind)} {getattr(cfg, kind):g} not met: the merge reached a cost "
                               f"ratio of {reached:.3g} (hidden widths {merged.chain.widths}, target {widths}); give "
                               f"a larger {flag_of(kind)} or use `merge_eps` (--merge-eps)", fields=(kind, "merge_eps"))
    report.predicted = replace(report.predicted, budget_widths=widths,
                                           merge_eps_per_layer=merged.tolerances, budget_cost_ratio=reached)
    report.notes.append(f"{flag_of(kind)} {getattr(cfg, kind):g}: widths {merged.chain.widths}, each layer cut at "
                        f"its own ε {[round(t, 4) for t in merged.tolerances]} (bisected on the count per layer; "
                        "greedy leader blocks are not monotone in ε)")
    return merged


def _compensate(original: Chain, merged: Chain, data: Dataset, cfg: FDEConfig,
                box: tuple[torch.Tensor, torch.Tensor], report: CompressionReport) -> tuple[Chain, torch.Tensor | None]:
    """The held-out-checked refit; returns the chain kept and the bound of its change (None when not kept)."""
    comp = compensate(original, merged, data.x, cfg.compensation_ridge, cfg.compensation_holdout, cfg.seed)
    report.predicted.compensation = {
        "accepted": comp.accepted, "heldout_mse_merged": comp.heldout_mse_merged,
        "heldout_mse_refit": comp.heldout_mse_refit, "fit_samples": comp.fit_samples,
        "heldout_samples": comp.heldout_samples}
    if not comp.accepted:
        report.notes.append(f"compensation rejected: the refit did not lower the held-out output MSE "
                            f"({comp.heldout_mse_refit:.3g} vs {comp.heldout_mse_merged:.3g}); uncompensated weights "
                            "kept")
        return merged, None
    report.notes.append(f"compensation kept: held-out output MSE {comp.heldout_mse_merged:.3g} -> "
                        f"{comp.heldout_mse_refit:.3g}")
    return comp.chain, refit_bound(merged, comp.chain, *box)


def _fde_mlp(model: nn.Module, data: Dataset, cfg: FDEConfig, report: CompressionReport) -> nn.Module:
    """The MLP path: dead neurons, value/scaled/sum merges (or a budget), optional compensation, and the
    output-deviation bound over the input box for the network actually built."""
    cfg = cfg.for_mlp()
    original = extract_chain(model)
    box = input_box(data.x, cfg.box_margin)
    t0 = time.perf_counter()
    dead = remove_all_constant(original, data.x, box=box) if cfg.remove_dead else RefineResult(original)
    report.timings_s["dead"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    merged = _merge(dead.chain, original, data, cfg, box, report)
    report.timings_s["partition"] = time.perf_counter() - t0
    final, extra = merged.chain, None
    if cfg.compensation:
        t0 = time.perf_counter()
        final, extra = _compensate(original, merged.chain, data, cfg, box, report)
        report.timings_s["compensation"] = time.perf_counter() - t0
    new = build_sequential(final)
    report.layers = chain_layer_reports(original, final, "merged", _layer_details(dead, merged, original))
    bound = sum(b for b in (dead.bound, merged.bound, extra) if b is not None)
    probe = box_samples(*box, cfg.bound_samples, cfg.seed)
    y0, y1 = chain_forward(original, probe), chain_forward(final, probe)
    report.predicted = replace(
        report.predicted, output_deviation_bound=float(bound.max()) if torch.is_tensor(bound) else 0.0,
        bound_dead_step=float(dead.bound.max()) if dead.bound is not None else 0.0,
        bound_compensation_step=float(extra.max()) if extra is not None else 0.0,
        input_box={"low": box[0].tolist(), "high": box[1].tolist()},
        hidden_widths=final.widths, hidden_widths_before=original.widths,
        dead_removed=sum(original.widths) - sum(dead.chain.widths),
        sweeps=merged.sweeps, representative=cfg.representative, compensation_tried=cfg.compensation)
    report.bounds["output"] = report.predicted.output_deviation_bound
    report.measured.max_output_deviation_box_float64 = float((y0 - y1).abs().max())
    if measuring():  # off when the caller measures on its own held-out data (the bound above is what counts)
        report.measured.max_output_deviation_data_float64 = float(
            (chain_forward(original, data.x) - chain_forward(final, data.x)).abs().max())
    report.notes.append(f"{len(merged.steps)} merge steps in {merged.sweeps} sweeps; bound over the input box "
                        f"(representative {cfg.representative}"
                        + (", plus the compensation refit's own step bounds)" if extra is not None else ")"))
    return new


def _is_mlp(model: nn.Module) -> bool:
    """Whether ``model`` is a Sequential MLP (the path with the bound); every other model takes the graph path."""
    try:
        extract_chain(model)
    except CompressionError:
        return False
    return True


@dataclass
class FDEPrepared:
    """What ``fde`` computes once, whatever ε or the budget: ``model`` (the original, a reference) and ``data``
    (the calibration data); ``graph``: on a model other than a Sequential MLP, the graph path's preparation (the
    channel analysis's dead channels and every group's exact partition, :class:`~.graph_path.GraphPrepared`); None
    for an MLP, whose every step (dead neurons, merges, compensation, bound) runs in :func:`fde_realise`: cheap on
    an MLP, and its merges start from the dead-free chain at the given ε rather than from an exact partition."""

    model: nn.Module
    data: Dataset
    graph: GraphPrepared | None = None


def fde_prepare(model: nn.Module, data: Dataset, config: FDEConfig) -> FDEPrepared:
    """The budget-free phase: the graph path's exact partitions (nothing for an MLP)."""
    return FDEPrepared(model, data, None if _is_mlp(model) else graph_prepare(model, data, config))


def fde_realise(prep: FDEPrepared, config: FDEConfig) -> tuple[nn.Module, CompressionReport]:
    """The per-ε (per-budget) phase: merges at ``merge_eps`` or to the budget, the merged model and its report."""
    if prep.graph is None:
        config = config.for_mlp()  # the report records the options the MLP path runs with (compensation on)
        report = CompressionReport("fde", asdict(config))
        return _fde_mlp(prep.model, prep.data, config, report), report
    report = CompressionReport("fde", asdict(config))
    return graph_realise(prep.graph, config, report), report


def fde_compress(model: nn.Module, data: Dataset, config: FDEConfig) -> tuple[nn.Module, CompressionReport]:
    """Merge neurons (conv channels) whose incoming (or, for linear MLP layers, outgoing) coefficients agree
    within ``eps`` (:func:`fde_prepare`, then :func:`fde_realise`)."""
    return fde_realise(fde_prepare(model, data, config), config)


def demo_case(quick: bool = True) -> RunCase:
    """An over-parameterised ReLU MLP (4 → 256 → 256 → 4, seeded) trained on the reaction-network flow map,
    with ``fde`` (ε = 0.3), the same merge recovered by distillation, and magnitude pruning to the same hidden widths
    (so all three compressed variants have matched parameter counts)."""
    from ...core.train import TrainConfig, train
    from ...dynamics import flow_map
    from ...models import mlp
    from ...registry import get_method

    tr, te = flow_map("reaction", n=2000 if quick else 4000, seed=0)
    torch.manual_seed(0)
    model = mlp(4, [256, 256], 4)
    train(model, tr, te, TrainConfig(epochs=15 if quick else 40, batch_size=128, lr=3e-3, patience=100))
    cfg = FDEConfig(merge_eps=0.3)
    _, rep = fde_compress(model, tr, cfg)
    widths = tuple(rep.predicted.hidden_widths)
    runs = [VariantSpec("fde ε=0.3", "fde", cfg),
            VariantSpec("fde ε=0.3 + recovery", "fde", cfg, recovery=RecoveryConfig(epochs=5 if quick else 15)),
            VariantSpec("magnitude (same widths)", "magnitude", get_method("magnitude").config_cls(widths=widths))]
    return RunCase("reaction-mlp", model.eval(), tr, te, runs,
                    notes=[f"ReLU MLP 4→256→256→4 on the A+B⇌C→D+B flow map (Δt = 0.1); fde keeps widths {widths}"])
