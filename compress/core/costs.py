"""Parameter and multiply-accumulate (MAC) counts per layer, measured with forward hooks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from .evaluate import eval_mode, hooks_removed

__all__ = ["LayerCost", "CostTable", "count_costs", "linear_macs", "conv_macs", "register_mac_rule", "MacRule"]


@dataclass
class LayerCost:
    """Cost of one counted layer for one sample of the example input."""

    name: str
    kind: str
    params: int
    macs: int
    positions: int = 1


@dataclass
class CostTable:
    """Per-layer costs; layers with parameters that are not counted are listed by name."""

    layers: dict[str, LayerCost] = field(default_factory=dict)
    not_counted: list[str] = field(default_factory=list)
    total_params: int = 0

    @property
    def macs(self) -> int:
        return sum(c.macs for c in self.layers.values())

    @property
    def counted_params(self) -> int:
        return sum(c.params for c in self.layers.values())


def linear_macs(layer: nn.Linear, out: torch.Tensor) -> int:
    """MACs of a Linear layer per sample: rows × in × out."""
    rows = math.prod(out.shape[1:-1]) if out.dim() > 1 else 1
    return rows * layer.in_features * layer.out_features


def conv_macs(layer: nn.modules.conv._ConvNd, out: torch.Tensor) -> int:
    """MACs of a convolution per sample: output positions × C_out × (C_in/groups) × prod(kernel)."""
    positions = math.prod(out.shape[2:])
    k = math.prod(layer.kernel_size)
    return positions * layer.out_channels * (layer.in_channels // layer.groups) * k


MacRule = Callable[[nn.Module, torch.Tensor], int]  # (layer, its output) -> MACs per sample

_MAC_RULES: dict[type, MacRule] = {
    nn.Linear: linear_macs,
    nn.Conv1d: conv_macs,
    nn.Conv2d: conv_macs,
    nn.Conv3d: conv_macs,
}


def register_mac_rule(module_type: type, rule: MacRule) -> None:
    """Count MACs of ``module_type`` layers with ``rule`` (per sample); a second rule for a type is an error."""
    if module_type in _MAC_RULES:
        raise ValueError(f"a MAC rule for {module_type.__name__} is already registered")
    _MAC_RULES[module_type] = rule


def _own_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters(recurse=False))


def count_costs(model: nn.Module, example_input: torch.Tensor) -> CostTable:
    """Count params and per-sample MACs of every layer with a MAC rule by running ``example_input`` once.

    Linear/Conv have rules here; other packages add theirs with :func:`register_mac_rule` (SSM layers).
    MACs are divided by the batch size of ``example_input``. Modules with their own parameters and no
    rule (BatchNorm, ...) are listed in ``not_counted``.
    """
    table = CostTable(total_params=sum(p.numel() for p in model.parameters()))
    batch = example_input.shape[0]
    hooks = []

    def make_hook(name: str, rule):
        def hook(mod: nn.Module, _inp, out: torch.Tensor) -> None:
            macs = rule(mod, out) if out.shape[0] == batch else rule(mod, out) // max(batch, 1)
            prev = table.layers.get(name)
            total = macs + (prev.macs if prev else 0)
            positions = 1 if out.dim() <= 2 else (math.prod(out.shape[1:-1]) if isinstance(mod, nn.Linear)
                                                  else math.prod(out.shape[2:]))
            table.layers[name] = LayerCost(name, type(mod).__name__, _own_params(mod), total, positions)
        return hook

    for name, mod in model.named_modules():
        rule = _MAC_RULES.get(type(mod))
        if rule is not None:
            hooks.append(mod.register_forward_hook(make_hook(name, rule)))
        elif _own_params(mod) > 0:
            table.not_counted.append(name or type(mod).__name__)
    with hooks_removed(hooks), eval_mode(model), torch.no_grad():
        model(example_input)
    return table
