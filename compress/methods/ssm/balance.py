"""Square-root balanced truncation (float64) and the choice of reduced orders.

Balanced truncation: Moore (1981); square-root form: Tombs & Postlethwaite (1987), with eigh-based
square roots so that a semidefinite P or Q is handled. Error bound: ‖G − G_r‖_∞ ≤ 2 Σ_{i>r} σ_i
(Enns 1984; Glover 1984), hence ‖y − ŷ‖₂ ≤ 2‖u‖₂ Σ_{i>r} σ_i from zero state.

References
----------
.. [1] Moore (1981), "Principal component analysis in linear systems: controllability, observability, and model
       reduction", IEEE Trans. Automatic Control 26(1): balanced truncation.
.. [2] Tombs & Postlethwaite (1987): the square-root form of balanced truncation.
.. [3] Enns 1984; Glover 1984: the error bound ‖G − G_r‖_∞ ≤ 2 Σ_{i>r} σ_i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.linalg import energy_rank, psd_sqrt
from .gramians import singular_value_tail
from .system import StateSpace

__all__ = ["BalancedResult", "balanced_truncation", "truncation_bound", "tail_energy", "order_from_trunc",
           "order_from_energy", "orders_from_budget"]


@dataclass(frozen=True)
class BalancedResult:
    """The reduced system, all HSVs of the original, and the a-priori bound 2 Σ_{i>r} σ_i."""

    reduced: StateSpace
    hsv: torch.Tensor
    bound: float


def truncation_bound(hsv: torch.Tensor, r: int) -> float:
    """A-priori H∞ error bound of balanced truncation to order r, 2 Σ_{i>r} σ_i (Enns 1984; Glover 1984).

    Parameters
    ----------
    hsv : torch.Tensor
        Hankel singular values (n,), descending.
    r : int
        Reduced order.

    Returns
    -------
    float
        2 Σ_{i>r} σ_i, a bound on ‖G − G_r‖_∞ and hence on ‖y − ŷ‖₂ / ‖u‖₂ from zero state.
    """
    return float(2 * hsv[r:].sum())


def tail_energy(hsv: torch.Tensor, r: int) -> float:
    """Fraction of the HSV sum a truncation to order r drops, Σ_{i>r} σ_i / Σ_i σ_i (the complement of the energy
    :func:`order_from_energy` keeps; 0 for a zero system).

    Parameters
    ----------
    hsv : torch.Tensor
        Hankel singular values (n,), descending.
    r : int
        Reduced order, >= 0.

    Returns
    -------
    float
        The tail energy in [0, 1].
    """
    return float(singular_value_tail(hsv, r, relative=True))


def balanced_truncation(sys: StateSpace, p: torch.Tensor, q: torch.Tensor, r: int,
                        rel_tol: float = 1e-12) -> BalancedResult:
    """Keep the ``r`` most observable-and-controllable balanced states: (Wᵀ A V, Wᵀ B, C V, D).

    With P = L_P L_Pᵀ, Q = L_Q L_Qᵀ (eigh square roots) and L_Qᵀ L_P = U Σ Vᵀ:
    V = L_P V_r Σ_r^{-1/2}, W = L_Q U_r Σ_r^{-1/2}, so Wᵀ V = I. ``r`` is capped at the number of
    σ_i > rel_tol·σ_1 (states with zero Hankel singular value carry no input-output energy). Square-root
    method of Tombs & Postlethwaite (1987) on Moore's (1981) balanced realisation.

    Parameters
    ----------
    sys : StateSpace
        Stable system (A, B, C, D) of order n.
    p, q : torch.Tensor
        Its reachability and observability Gramians (n, n), symmetric PSD.
    r : int
        Requested reduced order, ``0 <= r <= n``.
    rel_tol : float, optional
        Hankel singular values below ``rel_tol`` · σ_1 are treated as zero.

    Returns
    -------
    BalancedResult
        ``reduced`` (float64 system of order ≤ r), ``hsv`` (all n Hankel singular values, descending) and
        ``bound`` (2 Σ_{i>r} σ_i, see :func:`truncation_bound`).
    """
    sys = sys.double()
    lp, lq = psd_sqrt(p), psd_sqrt(q)
    u, s, vh = torch.linalg.svd(lq.T @ lp)
    r = min(r, int((s > rel_tol * s[0]).sum())) if s.numel() else 0
    scale = s[:r].rsqrt()
    v = lp @ vh[:r].T * scale
    w = lq @ u[:, :r] * scale
    reduced = StateSpace(w.T @ sys.a @ v, w.T @ sys.b, sys.c @ v, sys.d)
    return BalancedResult(reduced, s, truncation_bound(s, r))


def order_from_trunc(n: int, trunc: float) -> int:
    """Order after removing the fraction ``trunc`` of the n states (at least 1).

    Parameters
    ----------
    n : int
        Current order.
    trunc : float
        Fraction of the states removed, in [0, 1).

    Returns
    -------
    int
        ``max(1, round((1 − trunc)·n))``.
    """
    if not 0.0 <= trunc < 1.0:
        raise ValueError(f"trunc is the fraction of states removed and must lie in [0, 1), got {trunc}")
    return max(1, round((1.0 - trunc) * n))


def order_from_energy(hsv: torch.Tensor, energy: float) -> int:
    """Smallest r whose σ_1..σ_r keep at least ``energy`` of Σσ (at least 1).

    Parameters
    ----------
    hsv : torch.Tensor
        Hankel singular values, descending.
    energy : float
        Kept fraction of Σσ, in (0, 1].

    Returns
    -------
    int
        The reduced order r.
    """
    if not 0.0 < energy <= 1.0:
        raise ValueError(f"energy is the kept fraction of the HSV sum and must lie in (0, 1], got {energy}")
    return max(1, energy_rank(hsv, 1.0 - energy))


def orders_from_budget(hsvs: dict[str, torch.Tensor], budget: int, iters: int = 60) -> dict[str, int]:
    """Per-layer orders with Σ r ≤ ``budget`` and every layer keeping the same HSV energy (bisection).

    The largest common energy level whose orders fit the budget is found by bisection.

    Parameters
    ----------
    hsvs : dict of str to torch.Tensor
        Hankel singular values of each layer, descending.
    budget : int
        Total order across the layers, at least one per layer.
    iters : int
        Bisection steps on the energy level.

    Returns
    -------
    dict of str to int
        Order of each layer.
    """
    if budget < len(hsvs):
        raise ValueError(f"state budget {budget} is below one state per layer ({len(hsvs)} layers)")
    orders = lambda e: {k: order_from_energy(h, e) for k, h in hsvs.items()}  # noqa: E731
    lo, hi = 0.0, 1.0
    if sum(orders(hi).values()) <= budget:
        return orders(hi)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if mid > 0 and sum(orders(mid).values()) <= budget:
            lo = mid
        else:
            hi = mid
    return orders(lo) if lo > 0 else {k: 1 for k in hsvs}
