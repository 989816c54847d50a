"""Propagated output-deviation bound for one merge step, from interval arithmetic and Lipschitz constants.

A merge step replaces the network ``N`` by a network equal to ``N`` with the pre-activation of one layer
perturbed: ``z' = z − ΔW (h − c) − Δb`` (``h`` the layer input, ``c`` a centre). Over an input box,
``|z − z'| ≤ |ΔW| · max|h − c| + |Δb|`` elementwise, where ``max|h − c|`` comes from interval arithmetic on
``N``; the deviation then grows at most by each later activation's Lipschitz constant on the widened
interval and by ``|W|`` of each later layer (Weng et al. 2018, "Towards fast computation of certified
robustness", §3: layer-wise bounds). Steps add up by the triangle inequality.

References
----------
.. [1] Weng et al. 2018, "Towards fast computation of certified robustness", §3: layer-wise bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.chain import ActSpec, Chain

__all__ = ["Perturbation", "GLOBAL_LIPSCHITZ", "act_interval", "local_lipschitz", "interval_bounds",
           "step_bound"]

GLOBAL_LIPSCHITZ = {"relu": 1.0, "identity": 1.0, "tanh": 1.0, "sigmoid": 0.25, "silu": 1.0999, "gelu": 1.1290}
# (argmin window, lower bound of the global minimum) of the non-monotone activations, both GELU variants.
_VALLEY = {"silu": ((-1.2790, -1.2780), -0.2784646), "gelu": ((-0.7530, -0.7510), -0.1700408)}


@dataclass
class Perturbation:
    """The step changes layer ``layer``'s pre-activation by ``ΔW (h − centre) + Δb`` (``centre`` 0 if None)."""

    layer: int
    delta_w: torch.Tensor
    delta_b: torch.Tensor
    centre: torch.Tensor | None = None


def act_interval(act: ActSpec, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Range of ``act`` over ``[lo, hi]`` elementwise (monotone, or unimodal with a known valley).

    Parameters
    ----------
    act : ActSpec
        The activation.
    lo, hi : torch.Tensor
        Elementwise lower and upper ends of the input interval (same shape).

    Returns
    -------
    low, high : torch.Tensor
        Elementwise minimum and maximum of ``act`` over the interval.
    """
    a, b = act(lo), act(hi)
    if act.kind not in _VALLEY:
        return a, b
    (v_lo, v_hi), v_min = _VALLEY[act.kind]
    low = torch.minimum(a, b)
    low = torch.where((lo <= v_hi) & (hi >= v_lo), torch.full_like(low, v_min), low)
    return low, torch.maximum(a, b)


def local_lipschitz(act: ActSpec, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """An upper bound on ``|act'|`` over ``[lo, hi]`` elementwise.

    Parameters
    ----------
    act : ActSpec
        The activation.
    lo, hi : torch.Tensor
        Elementwise ends of the pre-activation interval.

    Returns
    -------
    torch.Tensor
        Elementwise local Lipschitz constant (float64 for ReLU/LeakyReLU).
    """
    if act.kind == "relu":
        return (hi > 0).double()
    if act.kind == "leaky_relu":
        s = abs(act.negative_slope)
        return torch.where(hi <= 0, s, torch.where(lo >= 0, 1.0, max(1.0, s))).double()
    if act.kind in ("tanh", "sigmoid"):
        z = torch.clamp(torch.zeros_like(lo), lo, hi)  # the point of [lo, hi] closest to 0
        y = act(z)
        return 1 - y * y if act.kind == "tanh" else y * (1 - y)
    return torch.full_like(lo, GLOBAL_LIPSCHITZ[act.kind])


def interval_bounds(chain: Chain, lo: torch.Tensor, hi: torch.Tensor
                    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Interval bound propagation of the box ``[lo, hi]`` through ``chain`` (centre–radius form).

    Parameters
    ----------
    chain : Chain
        The MLP as weights, biases and activations.
    lo, hi : torch.Tensor
        Ends of the input box, shape (n_0,).

    Returns
    -------
    list of tuple of torch.Tensor
        Per layer: (input lo, input hi, pre-activation lo, pre-activation hi), float64.
    """
    out, hl, hh = [], lo.double(), hi.double()
    for l, (w, b) in enumerate(zip(chain.weights, chain.biases)):
        c, r = (hl + hh) / 2, (hh - hl) / 2
        zc, zr = w @ c + b, w.abs() @ r
        out.append((hl, hh, zc - zr, zc + zr))
        if l < len(chain.acts):
            hl, hh = act_interval(chain.acts[l], zc - zr, zc + zr)
    return out


def step_bound(chain: Chain, pert: Perturbation, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Elementwise bound on ``|N(x) − N'(x)|`` over the box, ``N`` = ``chain`` and ``N'`` = it perturbed.

    The weight change of one layer is bounded on that layer's input interval, then carried to the output by
    ``|W|`` and the activations' local Lipschitz constants on the widened pre-activation intervals.

    Parameters
    ----------
    chain : Chain
        The unperturbed MLP.
    pert : Perturbation
        The change of one layer's weights and bias (and the centre its inputs are measured from).
    lo, hi : torch.Tensor
        Ends of the input box.

    Returns
    -------
    torch.Tensor
        Bound on each output's absolute change, shape (n_out,).
    """
    iv = interval_bounds(chain, lo, hi)
    hl, hh, _, _ = iv[pert.layer]
    c = torch.zeros_like(hl) if pert.centre is None else pert.centre
    reach = torch.maximum((hh - c).abs(), (hl - c).abs())
    d = pert.delta_w.abs() @ reach + pert.delta_b.abs()
    for l in range(pert.layer, len(chain.acts)):
        _, _, zl, zh = iv[l]
        d = chain.weights[l + 1].abs() @ (local_lipschitz(chain.acts[l], zl - d, zh + d) * d)
    return d
