"""``magnitude``: structured magnitude pruning of MLP neurons, or of the channel groups of any traceable model
(:mod:`compress.core.width`), at a whole-model budget (baseline)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...core.chain import Chain
from ...core.data import Dataset
from ...core.prune import PruneOptions, PrunePrepared, prune_prepare, prune_realise
from ...core.report import CompressionReport
from ...core.spec import MethodSpec
from ...core.width.allocate import width_multiple_defaults
from ...core.width import ChannelGroup, WidthGraph
from ...core.width.importance import magnitude_importance
from .smoke import smoke_case

__all__ = ["MagnitudeConfig", "magnitude_scores", "magnitude_group_scores", "magnitude_prepare", "magnitude_prune",
           "SPEC"]


@dataclass
class MagnitudeConfig(PruneOptions):
    """``param_ratio``/``mac_ratio``: whole-model budget (uniform keep-fraction per hidden layer); ``widths``:
    exact hidden widths instead (e.g. those another method reached); ``finetune_epochs``/``finetune_lr``:
    deprecated, a label-only recovery (:func:`compress.registry.finetune_alias`)."""


def magnitude_scores(chain: Chain, x: torch.Tensor | None = None) -> list[torch.Tensor]:
    """L1 norm of each hidden neuron's incoming weights (Li et al. 2017, "Pruning filters for efficient
    ConvNets", §3.1, applied to neurons). ``x`` is unused."""
    return [w.abs().sum(1) for w in chain.weights[:-1]]


def magnitude_group_scores(wg: WidthGraph, groups: list[ChannelGroup], x: torch.Tensor | None = None
                           ) -> dict[str, torch.Tensor]:
    """:func:`~compress.core.width.importance.magnitude_importance` of each group. ``x`` is unused."""
    return {g.name: magnitude_importance(wg, g) for g in groups}


def magnitude_prepare(model: nn.Module, data: Dataset, config: MagnitudeConfig) -> PrunePrepared:
    """The budget-free phase: every neuron's (channel's) magnitude score."""
    return prune_prepare("magnitude", magnitude_scores, model, config, data.x, graph_scorer=magnitude_group_scores)


def magnitude_prune(model: nn.Module, data: Dataset, config: MagnitudeConfig) -> tuple[nn.Module, CompressionReport]:
    """Remove the MLP neurons (channels) with the smallest incoming-weight L1 norm down to the budget
    (:func:`magnitude_prepare`, then :func:`~compress.core.prune.prune_realise`)."""
    return prune_realise(magnitude_prepare(model, data, config), config)


SPEC = MethodSpec("magnitude", "structured magnitude pruning of MLP neurons and conv/attention channel groups (baseline)", MagnitudeConfig,
                  magnitude_prune, smoke_case=smoke_case,
                  provider_defaults=width_multiple_defaults, budgets=("mac_ratio", "param_ratio", "latency_ratio"),
                  prepare=magnitude_prepare, realise=prune_realise,
                  realise_fields=("widths", "width_multiple", "latency_table", "finetune_epochs", "finetune_lr"))
