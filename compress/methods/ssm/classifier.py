"""The S5-like sequence classifier and the Hankel nuclear-norm regulariser (full or tail-only) over its SSM layers."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from .balance import orders_from_budget, tail_energy
from .gramians import hankel_singular_values, hankel_svdvals, rotation_gramians, singular_value_tail
from .layers import RotationSSM

__all__ = ["SSMBlock", "SSMClassifier", "TargetOrder", "rotation_layers", "target_orders", "hankel_regulariser",
           "tail_energies"]


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


TargetOrder = int | Mapping[str, int] | None


def rotation_layers(model: nn.Module) -> dict[str, RotationSSM]:
    """Every :class:`RotationSSM` in ``model`` by qualified name (the names ``ssm_compress`` reports)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, RotationSSM)}


def _layer_gramians(layer: RotationSSM) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, Q) of one layer in float64 by the O(n²) block route, differentiable."""
    return rotation_gramians(layer.rho.double(), layer.alpha.double(), layer.b.double(), layer.c.double())


def _layer_svdvals(layer: RotationSSM, jitter: float) -> torch.Tensor:
    """Differentiable σ of one layer in float64: O(n²) block Gramians, Cholesky-factor singular values."""
    return hankel_svdvals(*_layer_gramians(layer), jitter)


def target_orders(hsvs: Mapping[str, torch.Tensor], target_order: TargetOrder = None,
                  state_budget: int | None = None) -> dict[str, int] | None:
    """Per-layer kept orders r: one ``target_order`` for all, a per-layer mapping, or a total ``state_budget``
    shared at equal HSV energy (:func:`orders_from_budget`, as ``ssm_compress --state-budget``); None for neither.

    Raises
    ------
    ValueError
        If both are given, or a mapping misses a layer.
    """
    if target_order is not None and state_budget is not None:
        raise ValueError("give target_order (per layer) or state_budget (total), not both")
    if state_budget is not None:
        return orders_from_budget({k: h.detach() for k, h in hsvs.items()}, state_budget)
    if target_order is None:
        return None
    if isinstance(target_order, int):
        return {k: target_order for k in hsvs}
    missing = sorted(set(hsvs) - set(target_order))
    if missing:
        raise ValueError(f"target_order has no order for the SSM layers {missing}; give one per layer "
                         f"(names as in model.named_modules()) or a single int")
    return {k: int(target_order[k]) for k in hsvs}


def _check_weights(weight: float | Mapping[str, float], layers: Mapping[str, object]) -> None:
    """Weights are finite and >= 0; a mapping names exactly the SSM layers."""
    values = weight.values() if isinstance(weight, Mapping) else [weight]
    if not all(math.isfinite(w) and w >= 0 for w in values):
        raise ValueError(f"Hankel regulariser weights must be finite and >= 0, got {weight}")
    if isinstance(weight, Mapping) and set(weight) != set(layers):
        raise ValueError(f"weight must name every SSM layer and no other: missing {sorted(set(layers) - set(weight))}"
                         f", unknown {sorted(set(weight) - set(layers))} (names as in model.named_modules())")


def hankel_regulariser(model: nn.Module, weight: float | Mapping[str, float] = 1.0, *,
                       target_order: TargetOrder = None,
                       state_budget: int | None = None, relative: bool = False,
                       jitter: float = 1e-9) -> torch.Tensor:
    """Σ_l w_l Σ_i σ_i(l), the weighted Hankel nuclear norms of the RotationSSM layers l (Schwerdtner et al.,
    "Hankel singular value regularization for highly compressible state space models"), or with a target only
    their tails Σ_{i>r} σ_i(l).

    Gramians by the O(n²) block route, σ from Cholesky factors (:func:`hankel_svdvals`), float64 inside and
    differentiable. ``weight`` is one weight for every layer or a mapping layer name → weight (the training
    helper's per-layer controller). With ``target_order`` (an int for every layer, or a mapping name → r) or
    ``state_budget`` (total order shared at equal energy, re-allocated from the current σ at each call, the
    allocation itself not differentiated) only σ_{r+1}, σ_{r+2}, … are penalised (:func:`hankel_tail_norm`);
    ``relative`` penalises the tail energy Σ_{i>r} σ_i / Σ σ_i instead (scale-free, but training can lower it by
    inflating the free head σ_1..σ_r rather than shrinking the tail; the absolute tail is what the truncation bound
    2 Σ_{i>r} σ_i controls). With neither, the full nuclear norm.

    Returns
    -------
    torch.Tensor
        The penalty, a float32 scalar (0 for a model without RotationSSM layers).
    """
    svs = {k: _layer_svdvals(m, jitter) for k, m in rotation_layers(model).items()}
    _check_weights(weight, svs)
    orders = target_orders(svs, target_order, state_budget)
    total = torch.zeros((), dtype=torch.float64)
    for name, s in svs.items():
        w = weight[name] if isinstance(weight, Mapping) else weight
        if w:
            total = total + w * singular_value_tail(s, 0 if orders is None else orders[name], relative)
    return total.float()


@torch.no_grad()
def tail_energies(model: nn.Module, target_order: TargetOrder = None,
                  state_budget: int | None = None) -> tuple[dict[str, float], dict[str, int]]:
    """Measured tail energy Σ_{i>r} σ_i / Σ σ_i of every RotationSSM at its target order, from the exact HSVs
    that ``ssm_compress`` truncates (:func:`hankel_singular_values`); returns (tail energies, orders).

    Raises
    ------
    ValueError
        If neither ``target_order`` nor ``state_budget`` is given.
    """
    hsvs = {k: hankel_singular_values(*_layer_gramians(m)) for k, m in rotation_layers(model).items()}
    orders = target_orders(hsvs, target_order, state_budget)
    if orders is None:
        raise ValueError("tail energies need a target: give target_order or state_budget")
    return {k: tail_energy(h, orders[k]) for k, h in hsvs.items()}, orders
