"""``fde``: ε-forward-differential-equivalence neuron merging of MLPs (maths in :mod:`.partition` and :mod:`.bound`).

Plain sequential CNNs take the channel path (:mod:`.conv`): BatchNorm folded, channels exactly 0
on the calibration data dropped, conv channels merged by whole filters, no sum merges and no bound.

Pipeline: fold BatchNorm → remove neurons constant on the calibration data (dead ReLUs; a separate, reported
step, exact on that data) → partition refinement to a fixpoint → plain Linear stack → optional fine-tuning.
The report predicts a bound on ``max |N(x) − N'(x)|`` over the calibration input box (widened by
``box_margin``) and measures the deviation on that box and on the data.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch
from torch import nn

from ...core.chain import Chain, build_sequential, chain_forward, chain_layer_reports, extract_chain
from ...core.data import Dataset
from ...core.demo_case import DemoCase, DemoRun
from ...core.errors import CompressionError
from ...core.evaluate import compare_outputs
from ...core.options import CostBudget
from ...core.report import CompressionReport
from ...core.spec import MethodSpec
from .smoke import smoke_case
from ...core.train import FinetuneOptions, finetune
from .conv import (ConvChain, build_conv_sequential, conv_chain_forward, conv_layer_reports, extract_conv_chain,
                   is_conv_chain, remove_zero_channels)
from .partition import RefineResult, box_samples, refine, remove_all_constant

__all__ = ["FDEConfig", "fde_compress", "input_box", "demo_case", "SPEC"]


@dataclass
class FDEConfig(FinetuneOptions, CostBudget):
    """Options of ``fde`` (no cost budget: the merge tolerance sets the reduction).

    ``merge_eps``: tolerance relative to each layer's largest coefficient (0: exact, up to dtype rounding);
    ``remove_dead``: first drop neurons constant on the calibration data; ``scaling``: merge positive
    multiples for ReLU/LeakyReLU/identity; ``sum_merges``: forward (sum) equivalence on identity layers;
    ``box_margin``: widen the calibration input box by this fraction of its range for the bound;
    ``finetune_epochs``/``finetune_lr``: fine-tune the merged network on the (labelled) data.
    """

    DEPRECATED_ALIASES: ClassVar[dict[str, str]] = {"eps": "merge_eps"}

    merge_eps: float = field(
        default=0.0,
        metadata={"help": "Merge tolerance relative to each layer's largest coefficient, >= 0; default 0 (exact up to "
                          "rounding). Deprecated alias: --eps."})
    remove_dead: bool = field(
        default=True,
        metadata={"help": "First drop neurons that are constant on the calibration data; default on."})
    scaling: bool = field(
        default=True,
        metadata={"help": "Merge neurons that are positive multiples (ReLU/LeakyReLU/identity); default on."})
    sum_merges: bool = field(
        default=True,
        metadata={"help": "Forward (sum) equivalence merges on identity layers; default on."})
    max_sweeps: int = field(
        default=50,
        metadata={"help": "Maximum partition-refinement sweeps per layer, >= 1; default 50."})
    box_margin: float = field(
        default=0.0,
        metadata={"help": "Widen the calibration input box by this fraction of its range for the bound, >= 0; default "
                          "0."})
    bound_samples: int = field(
        default=4096,
        metadata={"help": "Points sampled in the input box to measure the error bound, >= 1; default 4096."})

    def __post_init__(self) -> None:
        FinetuneOptions.__post_init__(self)
        CostBudget.__post_init__(self)
        for flag, value in (("--merge-eps", self.merge_eps), ("--box-margin", self.box_margin)):
            if value < 0:
                raise CompressionError(f"{flag} must be >= 0, got {value}")
        for flag, value in (("--max-sweeps", self.max_sweeps), ("--bound-samples", self.bound_samples)):
            if value < 1:
                raise CompressionError(f"{flag} must be >= 1, got {value}")


def input_box(x: torch.Tensor, margin: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature min/max of ``x`` (flattened), widened by ``margin`` × range on each side (float64)."""
    flat = x.reshape(len(x), -1).double()
    lo, hi = flat.amin(0), flat.amax(0)
    pad = margin * (hi - lo)
    return lo - pad, hi + pad


def _layer_details(dead: RefineResult, merged: RefineResult, before: Chain | ConvChain) -> list[dict]:
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


def _fde_cnn(model: nn.Module, data: Dataset, cfg: FDEConfig, report: CompressionReport) -> nn.Module:
    """The channel path: merge conv channels (whole filters) and head neurons by value/scaled equivalence."""
    original = extract_conv_chain(model)
    t0 = time.perf_counter()
    dead = remove_zero_channels(original, data.x) if cfg.remove_dead else RefineResult(original)
    report.timings_s["dead"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    merged = refine(dead.chain, cfg.merge_eps, scaling=cfg.scaling, sums=False, max_sweeps=cfg.max_sweeps)
    report.timings_s["partition"] = time.perf_counter() - t0
    new = build_conv_sequential(merged.chain)
    report.layers = conv_layer_reports(original, merged.chain, _layer_details(dead, merged, original))
    report.predicted.update({
        "output_deviation_bound": None, "hidden_widths": merged.chain.widths,
        "hidden_widths_before": original.widths, "dead_removed": sum(original.widths) - sum(dead.chain.widths),
        "sweeps": merged.sweeps,
    })
    report.measured["max_output_deviation_data_float64"] = float(
        (conv_chain_forward(original, data.x) - conv_chain_forward(merged.chain, data.x)).abs().max())
    report.notes += ["CNN: the output-deviation bound is MLP-only; channels merged by whole filters (BN folded)",
                     "CNN: dead = exactly 0 on the calibration data; no sum (forward) merges",
                     f"{len(merged.steps)} merge steps in {merged.sweeps} sweeps"]
    return new


def _fde_mlp(model: nn.Module, data: Dataset, cfg: FDEConfig, report: CompressionReport) -> nn.Module:
    """The MLP path: dead neurons, value/scaled/sum merges, and the output-deviation bound over the input box."""
    original = extract_chain(model)
    box = input_box(data.x, cfg.box_margin)
    t0 = time.perf_counter()
    dead = remove_all_constant(original, data.x, box=box) if cfg.remove_dead else RefineResult(original)
    report.timings_s["dead"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    merged = refine(dead.chain, cfg.merge_eps, scaling=cfg.scaling, sums=cfg.sum_merges, max_sweeps=cfg.max_sweeps,
                    box=box)
    report.timings_s["partition"] = time.perf_counter() - t0
    new = build_sequential(merged.chain)
    report.layers = chain_layer_reports(original, merged.chain, "merged", _layer_details(dead, merged, original))
    bound = sum(b for b in (dead.bound, merged.bound) if b is not None)
    probe = box_samples(*box, cfg.bound_samples, cfg.seed)
    y0, y1 = chain_forward(original, probe), chain_forward(merged.chain, probe)
    report.predicted.update({
        "output_deviation_bound": float(bound.max()) if torch.is_tensor(bound) else 0.0,
        "bound_dead_step": float(dead.bound.max()) if dead.bound is not None else 0.0,
        "input_box": {"low": box[0].tolist(), "high": box[1].tolist()},
        "hidden_widths": merged.chain.widths, "hidden_widths_before": original.widths,
        "dead_removed": sum(original.widths) - sum(dead.chain.widths),
        "sweeps": merged.sweeps,
    })
    report.bounds["output"] = report.predicted["output_deviation_bound"]
    report.measured["max_output_deviation_box_float64"] = float((y0 - y1).abs().max())
    report.measured["max_output_deviation_data_float64"] = float(
        (chain_forward(original, data.x) - chain_forward(merged.chain, data.x)).abs().max())
    report.notes.append(f"{len(merged.steps)} merge steps in {merged.sweeps} sweeps; bound over the input box")
    return new


def fde_compress(model: nn.Module, data: Dataset, config: FDEConfig) -> tuple[nn.Module, CompressionReport]:
    """Merge neurons (conv channels) whose incoming (or, for linear MLP layers, outgoing) coefficients agree
    within ``eps``."""
    cfg = config
    report = CompressionReport("fde", asdict(cfg))
    new = (_fde_cnn if is_conv_chain(model) else _fde_mlp)(model, data, cfg, report)
    if cfg.finetune_epochs > 0:
        report.measured.update(compare_outputs(model, new, data))
        t0 = time.perf_counter()
        finetune(new, data, cfg.finetune_epochs, cfg.finetune_lr, cfg.seed)
        report.timings_s["finetune"] = time.perf_counter() - t0
        report.measured.update({f"finetuned_{k}": v for k, v in compare_outputs(model, new, data).items()})
        report.notes.append("the bound and deviations describe the merged network before fine-tuning")
    return new, report


def demo_case(quick: bool = True) -> DemoCase:
    """An over-parameterised ReLU MLP (4 → 256 → 256 → 4, seeded) trained on the reaction-network flow map,
    with ``fde`` (ε = 0.3), the same merge fine-tuned, and magnitude pruning to the same hidden widths (so all
    three compressed variants have matched parameter counts)."""
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
    widths = tuple(rep.predicted["hidden_widths"])
    tuned = FDEConfig(merge_eps=cfg.merge_eps, finetune_epochs=5 if quick else 15, finetune_lr=1e-3)
    runs = [DemoRun("fde ε=0.3", "fde", cfg),
            DemoRun("fde ε=0.3 + fine-tune", "fde", tuned),
            DemoRun("magnitude (same widths)", "magnitude", get_method("magnitude").config_cls(widths=widths))]
    return DemoCase("reaction-mlp", model.eval(), tr, te, runs,
                    notes=[f"ReLU MLP 4→256→256→4 on the A+B⇌C→D+B flow map (Δt = 0.1); fde keeps widths {widths}"])


SPEC = MethodSpec("fde", "ε-FDE merging of MLP neurons and conv channels (lump equivalent ones)", FDEConfig,
                  fde_compress, demo_case=demo_case, report_fields=("bounds",), smoke_case=smoke_case)
