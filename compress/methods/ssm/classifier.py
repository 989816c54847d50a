"""The S5-like sequence classifier and the Hankel nuclear-norm regulariser over its SSM layers."""

from __future__ import annotations

import torch
from torch import nn

from .gramians import hankel_nuclear_norm, rotation_gramians
from .layers import RotationSSM

__all__ = ["SSMBlock", "SSMClassifier", "hankel_regulariser"]


class SSMBlock(nn.Module):
    """BatchNorm → SSM → GELU → x·sigmoid(Wx) gate → residual, on (batch, length, features)."""

    def __init__(self, features: int, state: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(features)
        self.ssm = RotationSSM(features, state)
        self.act = nn.GELU()
        self.gate = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.act(self.ssm(self.norm(x.transpose(1, 2)).transpose(1, 2)))
        return x + z * torch.sigmoid(self.gate(z))


class SSMClassifier(nn.Module):
    """Linear encoder, ``depth`` SSM blocks, mean over time, linear decoder; input (batch, length, in)."""

    def __init__(self, in_features: int, features: int, state: int, depth: int, classes: int) -> None:
        super().__init__()
        self.encoder = nn.Linear(in_features, features)
        self.blocks = nn.Sequential(*(SSMBlock(features, state) for _ in range(depth)))
        self.decoder = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.blocks(self.encoder(x)).mean(1))


def hankel_regulariser(model: nn.Module, weight: float) -> torch.Tensor:
    """weight · Σ_layers Σ_i σ_i over every RotationSSM in ``model`` (float64 inside, differentiable).

    Gramians by the O(n²) block route; Hankel nuclear norm via Cholesky factors.
    """
    total = torch.zeros((), dtype=torch.float64)
    for layer in model.modules():
        if isinstance(layer, RotationSSM):
            p, q = rotation_gramians(layer.rho.double(), layer.alpha.double(), layer.b.double(), layer.c.double())
            total = total + hankel_nuclear_norm(p, q)
    return (weight * total).float()
