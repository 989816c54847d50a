"""The ``magnitude`` method's functions (the package exports its ``SPEC`` and options).

References
----------
.. [1] Li et al. 2017, "Pruning filters for efficient ConvNets", §3.1: the L1 norm of a filter's weights, here of a
       neuron's incoming weights (:func:`magnitude_scores`) or a channel group's
       (:mod:`minreal.compress.core.width.importance`).
"""

from __future__ import annotations

import torch
from torch import nn

from ...core.chain import Chain
from ...core.data import Dataset
from ...core.prune import PrunePrepared, prune_prepare, prune_realise
from ...core.report import CompressionReport
from ...core.width import ChannelGroup, WidthGraph
from ...core.width.importance import magnitude_importance
from .config import MagnitudeConfig

__all__ = ["magnitude_scores", "magnitude_group_scores", "magnitude_prepare", "magnitude_prune"]


def magnitude_scores(chain: Chain, x: torch.Tensor | None = None) -> list[torch.Tensor]:
    """L1 norm of each hidden neuron's incoming weights (Li et al. 2017, "Pruning filters for efficient
    ConvNets", §3.1, applied to neurons). ``x`` is unused."""
    return [w.abs().sum(1) for w in chain.weights[:-1]]


def magnitude_group_scores(wg: WidthGraph, groups: list[ChannelGroup], x: torch.Tensor | None = None
                           ) -> dict[str, torch.Tensor]:
    """:func:`~minreal.compress.core.width.importance.magnitude_importance` of each group. ``x`` is unused."""
    return {g.name: magnitude_importance(wg, g) for g in groups}


def magnitude_prepare(model: nn.Module, data: Dataset, config: MagnitudeConfig) -> PrunePrepared:
    """The budget-free phase: every neuron's (channel's) magnitude score."""
    return prune_prepare("magnitude", magnitude_scores, model, config, data.x, graph_scorer=magnitude_group_scores)


def magnitude_prune(model: nn.Module, data: Dataset, config: MagnitudeConfig) -> tuple[nn.Module, CompressionReport]:
    """Remove the MLP neurons (channels) with the smallest incoming-weight L1 norm down to the budget
    (:func:`magnitude_prepare`, then :func:`~minreal.compress.core.prune.prune_realise`)."""
    return prune_realise(magnitude_prepare(model, data, config), config)
