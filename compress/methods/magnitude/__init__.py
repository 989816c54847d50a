"""``magnitude`` and ``wanda``: structured neuron-pruning baselines for MLPs at a parameter-count target."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from torch import nn

from ..costs import count_costs
from ..data import Dataset
from ..evaluate import compare_outputs
from ..fde.chain import build_sequential, chain_layer_reports, extract_chain
from ..pruning import (FinetuneOptions, Scorer, finetune, magnitude_scores, prune_chain, wanda_scores,
                       widths_for_params)
from ..realise import mlp_params
from ..registry import register_method
from ..report import CompressionReport

__all__ = ["MagnitudeConfig", "WandaConfig", "magnitude_prune", "wanda_prune"]


@dataclass
class MagnitudeConfig(FinetuneOptions):
    """``params``: target ratio of parameters kept (uniform keep-fraction per hidden layer); ``widths``:
    exact hidden widths instead (e.g. those another method reached); ``finetune_epochs``/``finetune_lr``:
    fine-tune the pruned network on the (labelled) data."""

    params: float = field(
        default=0.5,
        metadata={"help": "Target ratio of parameters kept, in (0, 1] (uniform keep-fraction per hidden layer); "
                          "default 0.5."})
    widths: tuple[int, ...] = field(
        default=(),
        metadata={"help": "Exact hidden width per hidden layer, instead of --params; default none."})


@dataclass
class WandaConfig(MagnitudeConfig):
    """As :class:`MagnitudeConfig`; ``calibration_samples`` inputs give the activation norms ‖X_j‖."""

    calibration_samples: int = field(
        default=2048,
        metadata={"help": "Calibration inputs that give the activation norms ‖X_j‖, >= 1; default 2048."})


def _prune(name: str, scorer: Scorer, model: nn.Module, data: Dataset, cfg: MagnitudeConfig
           ) -> tuple[nn.Module, CompressionReport]:
    report = CompressionReport(name, asdict(cfg))
    chain = extract_chain(model)
    n_in, n_out = chain.weights[0].shape[1], chain.weights[-1].shape[0]
    widths = list(cfg.widths) or widths_for_params(n_in, chain.widths, n_out, cfg.params)
    t0 = time.perf_counter()
    calib = data.x[: getattr(cfg, "calibration_samples", len(data))]
    pruned = prune_chain(chain, scorer(chain, calib), widths)
    report.timings_s["prune"] = time.perf_counter() - t0
    new = build_sequential(pruned)
    example = data.x[:8]
    report.params_before, report.params_after = count_costs(model, example).total_params, mlp_params(
        n_in, widths, n_out)
    report.macs_before, report.macs_after = count_costs(model, example).macs, count_costs(new, example).macs
    report.layers = chain_layer_reports(chain, pruned, "pruned", [])
    report.predicted["hidden_widths"] = widths
    report.measured.update(compare_outputs(model, new, data))
    if cfg.finetune_epochs > 0:
        finetune(new, data, cfg.finetune_epochs, cfg.finetune_lr, cfg.seed)
        report.measured.update({f"finetuned_{k}": v for k, v in compare_outputs(model, new, data).items()})
    return new, report


@register_method("magnitude", MagnitudeConfig, "structured magnitude pruning of MLP neurons (baseline)")
def magnitude_prune(model: nn.Module, data: Dataset, config: MagnitudeConfig) -> tuple[nn.Module, CompressionReport]:
    """Remove the MLP neurons with the smallest incoming-weight L1 norm down to the parameter target."""
    return _prune("magnitude", magnitude_scores, model, data, config)


@register_method("wanda", WandaConfig, "structured Wanda pruning (|W|·‖X‖) of MLP neurons (baseline)")
def wanda_prune(model: nn.Module, data: Dataset, config: WandaConfig) -> tuple[nn.Module, CompressionReport]:
    """Remove the MLP neurons with the smallest Wanda score on the calibration inputs."""
    return _prune("wanda", wanda_scores, model, data, config)
