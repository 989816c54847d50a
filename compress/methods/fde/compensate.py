"""Compensation of the consumers of merged layers: a least-squares refit of every Linear after the first on
calibration activations of the merged network, checked on a held-out split.

Layer by layer (as cbalanced's warm-start refit), ``A = [h̃_{l−1}, 1]`` from the refitted prefix and the target
is what layer ``l`` stood for in the original network: the original outputs for the last layer; for a merged
hidden neuron ``k`` with members ``G_k``, ``t_k = Σ_i ρ_i z_i / Σ_i ρ_i²`` — the least-squares fit of its
members' original pre-activations ``z_i`` at their data-fitted scales ``ρ_i = ⟨z_i, z̃_k⟩/‖z̃_k‖²`` (``z̃_k``
the merged neuron's own pre-activation; the next layer reads member ``i`` as ``ρ_i h̃_k``), clamped to ``ρ_i >= 0``
and ignored when all are below a floor (:func:`member_targets`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.chain import Chain, chain_forward
from ...core.linalg import ridge_lstsq
from .bound import Perturbation, step_bound

__all__ = ["pre_activations", "member_targets", "refit_consumers", "CompensationResult", "compensate",
           "refit_bound"]


def pre_activations(chain: Chain, x: torch.Tensor) -> list[torch.Tensor]:
    """Pre-activation ``z_l`` of every Linear of ``chain`` on ``x`` (float64), the output last."""
    h, out = x.reshape(len(x), -1).double(), []
    for l, (w, b) in enumerate(zip(chain.weights, chain.biases)):
        z = h @ w.T + b
        out.append(z)
        h = chain.acts[l](z) if l < len(chain.acts) else z
    return out


def member_targets(z_orig: torch.Tensor, z_merged: torch.Tensor, groups: list[list[int]],
                   rho_floor: float = 0.1) -> torch.Tensor:
    """Target pre-activation of each merged neuron: ``t_k = Σ_i ρ_i z_i / Σ_i ρ_i²`` over its members ``G_k``,
    ``ρ_i = max(⟨z_i, z̃_k⟩/‖z̃_k‖², 0)``.

    ``ρ`` is a data correlation, not the lump's scale: a negative one is clamped to 0 (``σ(−z)`` is no
    rescaling of ``σ(z)``, so that member cannot be stood for), and where every ``ρ_i < rho_floor`` the
    members are not rescalings of ``z̃_k`` on the data and ``t_k = z̃_k`` (no target change) instead of the
    unbounded ``z_i/ρ_i``.

    Parameters
    ----------
    z_orig : torch.Tensor
        Original pre-activations of the layer, shape (n, width before).
    z_merged : torch.Tensor
        The merged layer's pre-activations, shape (n, width after).
    groups : list of list of int
        Original members of each merged neuron.
    rho_floor : float
        Smallest largest-member ``ρ`` for which the members define the target, > 0.

    Returns
    -------
    torch.Tensor
        Targets, shape (n, width after).
    """
    out = z_merged.clone()
    for k, g in enumerate(groups):
        zk, zi = z_merged[:, k], z_orig[:, g]
        rho = ((zi * zk[:, None]).sum(0) / float(zk.pow(2).sum().clamp_min(1e-300))).clamp_min(0.0)
        if float(rho.max()) >= rho_floor:
            out[:, k] = zi @ rho / float(rho.pow(2).sum())
    return out


def refit_consumers(original: Chain, merged: Chain, x: torch.Tensor, ridge: float) -> Chain:
    """Refit every Linear of ``merged`` after the first by ridge least squares (:func:`ridge_lstsq`) so its
    pre-activation on ``x`` matches :func:`member_targets` (the original outputs for the last layer).

    Parameters
    ----------
    original, merged : Chain
        The network before merging and the merged one (``merged.groups`` index ``original``'s neurons).
    x : torch.Tensor
        Calibration inputs the refit is fitted on.
    ridge : float
        Relative ridge of :func:`~minreal.compress.core.linalg.ridge_lstsq`, >= 0.

    Returns
    -------
    Chain
        A refitted copy of ``merged``.
    """
    z_orig, z_merged = pre_activations(original, x), pre_activations(merged, x)
    new = merged.copy()
    h = merged.acts[0](z_merged[0])
    for l in range(1, len(new.weights)):
        last = l == len(new.acts)
        target = z_orig[l] if last else member_targets(z_orig[l], z_merged[l], merged.groups[l])
        new.weights[l], new.biases[l] = ridge_lstsq(h, target, ridge)
        if not last:
            h = new.acts[l](h @ new.weights[l].T + new.biases[l])
    return new


@dataclass
class CompensationResult:
    """The chain kept, whether the refit was kept, and the held-out mean squared output deviation from the
    original network without and with the refit."""

    chain: Chain
    accepted: bool
    heldout_mse_merged: float
    heldout_mse_refit: float
    fit_samples: int
    heldout_samples: int


def compensate(original: Chain, merged: Chain, x: torch.Tensor, ridge: float, holdout: float,
               seed: int = 0) -> CompensationResult:
    """Refit on a seeded ``1 − holdout`` share of ``x``; keep the refit only when it lowers the mean squared
    deviation from ``original``'s outputs on the held-out rest.

    Parameters
    ----------
    original, merged : Chain
        As in :func:`refit_consumers`.
    x : torch.Tensor
        Calibration inputs (at least 2).
    ridge : float
        Relative ridge, >= 0.
    holdout : float
        Share of ``x`` held out for the check, in (0, 1).
    seed : int
        Seed of the split.

    Returns
    -------
    CompensationResult
        ``chain`` is the refit when ``accepted``, else ``merged``.
    """
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_hold = min(len(x) - 1, max(1, round(holdout * len(x))))
    fit, held = x[perm[n_hold:]], x[perm[:n_hold]]
    refit = refit_consumers(original, merged, fit, ridge)
    y = chain_forward(original, held)
    before = float((chain_forward(merged, held) - y).pow(2).mean())
    after = float((chain_forward(refit, held) - y).pow(2).mean())
    return CompensationResult(refit if after < before else merged, after < before, before, after, len(fit), n_hold)


def refit_bound(merged: Chain, refit: Chain, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Bound on ``|N_merged(x) − N_refit(x)|`` over the box: the refit changes one layer at a time, each change a
    :class:`Perturbation` of the chain refitted so far (:func:`step_bound`), summed (triangle inequality)."""
    cur, total = merged, torch.zeros(merged.weights[-1].shape[0], dtype=torch.float64)
    for l in range(1, len(merged.weights)):
        pert = Perturbation(l, cur.weights[l] - refit.weights[l], cur.biases[l] - refit.biases[l])
        total = total + step_bound(cur, pert, lo, hi)
        cur = cur.copy()
        cur.weights[l], cur.biases[l] = refit.weights[l].clone(), refit.biases[l].clone()
    return total
