"""The ``wanda`` method's functions (the package exports its ``SPEC`` and options).

References
----------
.. [1] Sun et al. 2023, "A simple and effective pruning approach for large language models", eq. 1: the score
       ``|W_ij|·‖X_j‖₂`` that :func:`wanda_scores` sums per neuron (per channel:
       :mod:`minreal.compress.core.width.importance`).
"""

from __future__ import annotations

import torch
from torch import nn

from ...core.chain import Chain, chain_forward
from ...core.data import Dataset
from ...core.distributed import all_reduce_sum, parallel, shard
from ...core.prune import PrunePrepared, prune_prepare, prune_realise
from ...core.report import CompressionReport
from ...core.width.importance import wanda_importance
from .config import WandaConfig

__all__ = ["activation_norms", "wanda_scores", "wanda_prepare", "wanda_prune"]


def activation_norms(chain: Chain, x: torch.Tensor) -> list[torch.Tensor]:
    """‖h_j‖₂ over the inputs ``x`` of every hidden neuron j of every hidden layer (float64).

    Under a process group each rank runs its :func:`~minreal.compress.core.distributed.shard` of ``x`` and the sums of
    squares are all-reduced before the square root; otherwise this is ``h.norm(dim=0)`` on all of ``x``."""
    if not parallel():
        return [h.norm(dim=0) for h in chain_forward(chain, x, hidden=True)[:-1]]
    hidden = chain_forward(chain, shard(x), hidden=True)[:-1]
    return [all_reduce_sum(h.pow(2).sum(0)).sqrt() for h in hidden]


def wanda_scores(chain: Chain, x: torch.Tensor) -> list[torch.Tensor]:
    """Wanda (Sun et al. 2023, "A simple and effective pruning approach for large language models", eq. 1:
    ``S_ij = |W_ij|·‖X_j‖_2``) summed over each hidden neuron's outgoing column:
    ``S_j = ‖h_j‖_2 · Σ_i |W_{l+1}[i, j]|`` with ``h_j`` its activations on the calibration inputs
    (:func:`activation_norms`)."""
    return [n * w.abs().sum(0) for n, w in zip(activation_norms(chain, x), chain.weights[1:])]


def wanda_prepare(model: nn.Module, data: Dataset, config: WandaConfig) -> PrunePrepared:
    """The budget-free phase: every neuron's (channel's) Wanda score on the first ``norm_samples`` inputs."""
    return prune_prepare("wanda", wanda_scores, model, config, data.x[: config.norm_samples],
                         graph_scorer=wanda_importance)


def wanda_prune(model: nn.Module, data: Dataset, config: WandaConfig) -> tuple[nn.Module, CompressionReport]:
    """Remove the MLP neurons (channels) with the smallest Wanda score on the calibration inputs down to the budget
    (:func:`wanda_prepare`, then :func:`~minreal.compress.core.prune.prune_realise`)."""
    return prune_realise(wanda_prepare(model, data, config), config)
