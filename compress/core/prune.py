"""Structured (whole-neuron) pruning baselines for MLPs: magnitude and Wanda scores, matched parameter counts.

Scoring is apart from surgery: a scorer maps a :class:`~compress.fde.chain.Chain` (and calibration inputs) to
one score per hidden neuron; :func:`prune_chain` keeps the top-scoring neurons of each layer. Removing a
neuron deletes a row of ``W_l``/``b_l`` and a column of ``W_{l+1}``, so parameters really drop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Callable

import torch
from torch import nn

from .data import Dataset
from .errors import CompressionError
from .fde.chain import Chain, chain_forward
from .realise import mlp_params
from .train import TrainConfig, TrainResult, train

__all__ = ["FinetuneOptions", "Scorer", "magnitude_scores", "wanda_scores", "widths_for_params", "prune_chain",
           "finetune"]

Scorer = Callable[[Chain, torch.Tensor], list[torch.Tensor]]


def magnitude_scores(chain: Chain, x: torch.Tensor | None = None) -> list[torch.Tensor]:
    """L1 norm of each hidden neuron's incoming weights (Li et al. 2017, "Pruning filters for efficient
    ConvNets", §3.1, applied to neurons). ``x`` is unused."""
    return [w.abs().sum(1) for w in chain.weights[:-1]]


def wanda_scores(chain: Chain, x: torch.Tensor) -> list[torch.Tensor]:
    """Wanda (Sun et al. 2023, eq. 1: ``S_ij = |W_ij|·‖X_j‖_2``) summed over each hidden neuron's outgoing
    column: ``S_j = ‖h_j‖_2 · Σ_i |W_{l+1}[i, j]|`` with ``h_j`` its activations on the calibration inputs."""
    hidden = chain_forward(chain, x, hidden=True)[:-1]
    return [h.norm(dim=0) * w.abs().sum(0) for h, w in zip(hidden, chain.weights[1:])]


def widths_for_params(in_features: int, widths: list[int], out_features: int, ratio: float) -> list[int]:
    """Largest uniform keep-fraction widths (≥ 1 each) whose parameter count is at most ``ratio`` of the full
    one, found by bisection on the fraction."""
    if not 0.0 < ratio <= 1.0:
        raise CompressionError(f"--params must lie in (0, 1], got {ratio}")
    target = ratio * mlp_params(in_features, widths, out_features)
    at = lambda f: [max(1, int(f * w)) for w in widths]  # noqa: E731
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mlp_params(in_features, at(mid), out_features) <= target else (lo, mid)
    return at(1.0) if ratio >= 1.0 else at(lo)


def prune_chain(chain: Chain, scores: list[torch.Tensor], widths: list[int]) -> Chain:
    """Keep the ``widths[l]`` highest-scoring neurons of each hidden layer (original order preserved)."""
    if len(widths) != len(chain.acts) or any(not 1 <= k <= n for k, n in zip(widths, chain.widths)):
        raise CompressionError(f"pruned widths {widths} must give 1..n neurons for hidden widths {chain.widths}")
    new = chain.copy()
    for l, (s, k) in enumerate(zip(scores, widths)):
        keep = torch.sort(torch.topk(s, k).indices).values
        new.weights[l], new.biases[l] = new.weights[l][keep], new.biases[l][keep]
        new.weights[l + 1] = new.weights[l + 1][:, keep]
        new.groups[l] = [new.groups[l][int(i)] for i in keep]
    return new


@dataclass
class FinetuneOptions:
    """Options shared by methods that can fine-tune their result (fields become CLI options)."""

    finetune_epochs: int = field(
        default=0,
        metadata={"help": "Fine-tuning epochs on the (labelled) data after compression, >= 0; default 0 (no "
                          "fine-tuning)."})
    finetune_lr: float = field(
        default=1e-3,
        metadata={"help": "Learning rate (Adam) of the fine-tuning, > 0; default 1e-3."})
    seed: int = field(
        default=0,
        metadata={"help": "Random seed (sampling, data split, initialisation, training); default 0."})


def finetune(model: nn.Module, data: Dataset, epochs: int, lr: float, seed: int = 0) -> TrainResult:
    """Fine-tune ``model`` in place on labelled ``data`` with :func:`compress.train.train` (MSE for floats)."""
    if data.y is None:
        raise CompressionError("fine-tuning needs targets: give calibration data with labels, or finetune_epochs=0")
    val = None
    if len(data) >= 20:
        data, val = data.split(0.2, seed)
    return train(model, data, val, TrainConfig(epochs=epochs, lr=lr, seed=seed, patience=max(epochs, 1)))
