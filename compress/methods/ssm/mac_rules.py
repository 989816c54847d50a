"""MACs of SSM layers, registered with compress.costs so every cost table counts them."""

from __future__ import annotations

import torch
from torch import nn

from ...core.costs import register_mac_rule
from .layers import DenseSSM, DiagonalSSM, ModalSSM, RotationSSM, SchurSSM

__all__ = ["ssm_macs"]

# State update cost per state: 2 for 1×1/2×2 modal blocks, n for a dense or Schur-form A.
_MODAL = (RotationSSM, DiagonalSSM, ModalSSM)


def ssm_macs(layer: nn.Module, out: torch.Tensor) -> int:
    """Per-sample MACs of the recurrence x⁺ = Ax + Bu, y = Cx + Du over the output's sequence length.

    This is the recurrence's cost; the exported modal layer evaluates the same map as a causal convolution.
    """
    n, h_in = layer.b.shape
    h_out = layer.c.shape[0]
    a_cost = 2 * n if isinstance(layer, _MODAL) else n * n
    return out.shape[1] * (n * h_in + a_cost + n * h_out + h_out)


for _kind in (*_MODAL, DenseSSM, SchurSSM):
    register_mac_rule(_kind, ssm_macs, defines_cost=True)  # an FFT in eager mode, a convolution exported
