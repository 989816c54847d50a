"""Shared pieces of the fde benchmarks: seeded training, growing by duplication, confidence intervals."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.evaluate import predict
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.methods.fde import build_sequential, extract_chain
from minreal.compress.models import mlp


def trained_mlp(train_set: Dataset, test_set: Dataset, widths: list[int], seed: int, epochs: int = 25,
                activation: str = "relu") -> nn.Sequential:
    """A seeded MLP trained with Adam (MSE) on ``train_set``, best epoch on ``test_set``."""
    torch.manual_seed(seed)
    model = mlp(train_set.x.shape[1], widths, train_set.y.shape[1], activation)
    train(model, train_set, test_set, TrainConfig(epochs=epochs, batch_size=128, lr=3e-3, patience=epochs,
                                                  seed=seed))
    return model.eval()


def grow_by_duplication(model: nn.Module, factor: int, noise: float, seed: int) -> nn.Sequential:
    """Net2Net-style widening (Chen et al. 2016): every hidden ReLU neuron becomes ``factor`` copies with
    random positive scales ρ (incoming × ρ, outgoing split so the function is kept), then relative Gaussian
    noise of size ``noise`` on every weight."""
    g = torch.Generator().manual_seed(seed)
    chain = extract_chain(model)
    for l in range(len(chain.acts)):
        n = chain.weights[l].shape[0]
        rho = torch.rand(n * factor, generator=g, dtype=torch.float64) * 1.5 + 0.5
        split = torch.rand(n * factor, generator=g, dtype=torch.float64) + 0.5
        split = split / split.reshape(factor, n).sum(0).repeat(factor)
        chain.weights[l] = chain.weights[l].repeat(factor, 1) * rho[:, None]
        chain.biases[l] = chain.biases[l].repeat(factor) * rho
        chain.weights[l + 1] = chain.weights[l + 1].repeat(1, factor) * (split / rho)[None, :]
        chain.groups[l] = [[i] for i in range(n * factor)]
    for l, w in enumerate(chain.weights):
        chain.weights[l] = w + noise * w.abs().max() * torch.randn(w.shape, generator=g, dtype=torch.float64)
    return build_sequential(chain)


def mse(model: nn.Module, data: Dataset) -> float:
    return float(((predict(model, data) - data.y) ** 2).mean())


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), 0.0
    return float(v.mean()), float(stats.t.ppf((1 + level) / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
