"""Low-rank layer pairs: views of Linear/Conv weights as (grouped) matrices, their costs, and the surgery
that turns per-group factors into two plain layers (Linear→Linear, or k×k conv with P·G outputs → 1×1 conv).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["MatrixView", "matrix_view", "grouped_weight", "pair_params", "pair_macs", "layer_macs",
           "build_pair", "output_positions", "FACTORIZABLE"]

FACTORIZABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_PLAIN_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


@dataclass(frozen=True)
class MatrixView:
    """A layer seen as ``groups`` matrices W_g of shape (out/groups) × fan_in (fan_in = in/groups·prod(k))."""

    groups: int
    out_per_group: int
    fan_in: int

    @property
    def max_rank(self) -> int:
        return min(self.out_per_group, self.fan_in)


def matrix_view(layer: nn.Module) -> MatrixView:
    """The grouped-matrix view of a Linear or Conv layer."""
    if isinstance(layer, nn.Linear):
        return MatrixView(1, layer.out_features, layer.in_features)
    g = layer.groups
    return MatrixView(g, layer.out_channels // g, layer.weight[0].numel())


def grouped_weight(layer: nn.Module) -> torch.Tensor:
    """Weight as a (groups, out/groups, fan_in) tensor."""
    v = matrix_view(layer)
    return layer.weight.detach().reshape(v.groups, v.out_per_group, v.fan_in)


def pair_params(layer: nn.Module, rank: int) -> int:
    """Parameters of the factorised pair at ``rank`` (per group), bias included."""
    v = matrix_view(layer)
    bias = 0 if layer.bias is None else layer.bias.numel()
    return v.groups * rank * (v.fan_in + v.out_per_group) + bias


def pair_macs(layer: nn.Module, rank: int, positions: int) -> int:
    """Per-sample MACs of the factorised pair; ``positions`` = output rows (tokens or spatial positions)."""
    v = matrix_view(layer)
    return positions * v.groups * rank * (v.fan_in + v.out_per_group)


def layer_macs(layer: nn.Module, positions: int) -> int:
    """Per-sample MACs of the original layer."""
    v = matrix_view(layer)
    return positions * v.groups * v.out_per_group * v.fan_in


def build_pair(layer: nn.Module, first: torch.Tensor, second: torch.Tensor) -> nn.Sequential:
    """Two plain layers computing ``second @ first`` per group, plus the original bias, as an ``nn.Sequential``.

    The pair is torch.nn's own Linear or ConvNd whatever subclass ``layer`` is (torchvision's ``Conv3DSimple``
    has a constructor of its own), so it exports as any plain layer does.

    The Sequential also holds ``weight``, an empty non-persistent buffer of the replaced layer's dtype and device
    (cast and moved with the pair, absent from its state dict), for a model whose own ``forward`` reads the
    replaced layer's weight only for those (transformers' ViT casts its input to
    ``patch_embeddings.projection.weight.dtype``). It holds no values: arithmetic with it fails loudly.

    Parameters
    ----------
    layer : nn.Module
        the original nn.Linear or nn.ConvNd.
    first : torch.Tensor
        (groups, rank, fan_in) factor applied first (the k×k conv / first Linear).
    second : torch.Tensor
        (groups, out/groups, rank) factor applied second (the 1×1 conv / second Linear).
    """
    g, r = first.shape[0], first.shape[1]
    dtype, device = layer.weight.dtype, layer.weight.device
    has_bias = layer.bias is not None
    if isinstance(layer, nn.Linear):
        a = nn.Linear(layer.in_features, r, bias=False, device=device, dtype=dtype)
        b = nn.Linear(r, layer.out_features, bias=has_bias, device=device, dtype=dtype)
        a.weight.data.copy_(first[0])
        b.weight.data.copy_(second[0])
    else:
        conv = _PLAIN_CONV[len(layer.kernel_size)]  # torch.nn's own, also for a subclass built its own way
        a = conv(layer.in_channels, r * g, layer.kernel_size, stride=layer.stride, padding=layer.padding,
                 dilation=layer.dilation, groups=g, bias=False, padding_mode=layer.padding_mode,
                 device=device, dtype=dtype)
        b = conv(r * g, layer.out_channels, 1, groups=g, bias=has_bias, device=device, dtype=dtype)
        a.weight.data.copy_(first.reshape(a.weight.shape))
        b.weight.data.copy_(second.reshape(b.weight.shape))
    if has_bias:
        b.bias.data.copy_(layer.bias.detach())
    pair = nn.Sequential(a, b)
    pair.register_buffer("weight", torch.empty(0, dtype=dtype, device=device), persistent=False)
    return pair


def output_positions(out: torch.Tensor, layer: nn.Module) -> int:
    """Rows per sample of a layer output: tokens for Linear, spatial positions for conv."""
    if isinstance(layer, nn.Linear):
        return math.prod(out.shape[1:-1]) if out.dim() > 1 else 1
    return math.prod(out.shape[2:])
