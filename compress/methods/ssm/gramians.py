"""Gramians and Hankel singular values of discrete LTI systems.

Controllability P = A P Aᵀ + B Bᵀ and observability Q = Aᵀ Q A + Cᵀ C (discrete Lyapunov equations).
Two routes: the O(n²) block route for A = diag(ρ_i R(α_i)) (Schwerdtner et al., "Hankel singular value
regularization for highly compressible state space models", the q² independent 2×2 Stein equations),
batched and differentiable in torch; and a general route for dense A (scipy's solve_discrete_lyapunov,
bilinear transform to a continuous equation solved by Bartels–Stewart).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch

from ...core.linalg import psd_sqrt
from .system import StateSpace

__all__ = ["rotation_gramians", "dense_gramians", "hankel_singular_values", "hankel_svdvals", "hankel_nuclear_norm",
           "hankel_tail_norm", "singular_value_tail"]


def _rotation_gramian(rho: torch.Tensor, alpha: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_k A^k B Bᵀ (Aᵀ)^k for A = diag(ρ_i R(α_i)) by the closed-form solution of each 2×2 block equation.

    With λ_i = ρ_i e^{iα_i} and b̃_i = B_{2i} + i B_{2i+1}, the states are z_i = Re + i Im of a diagonal
    system, so M = Σ z z^H = b̃b̃^H ⊘ (1 − λλ̄ᵀ) and N = Σ z zᵀ = b̃b̃ᵀ ⊘ (1 − λλᵀ) give every 2×2 block:
    [[½Re(N+M), ½Im(N−M)], [½Im(N+M), ½Re(M−N)]]. O(n² m) work, elementwise, batched, differentiable.
    """
    lam = torch.polar(rho, alpha)
    bt = torch.complex(b[..., 0::2, :], b[..., 1::2, :])
    m = (bt @ bt.conj().transpose(-1, -2)) / (1 - lam[..., :, None] * lam.conj()[..., None, :])
    n = (bt @ bt.transpose(-1, -2)) / (1 - lam[..., :, None] * lam[..., None, :])
    blocks = torch.stack([torch.stack([(n + m).real, (n - m).imag], -1),
                          torch.stack([(n + m).imag, (m - n).real], -1)], -3)  # (..., q, 2, q, 2)
    return 0.5 * blocks.reshape(*blocks.shape[:-4], 2 * lam.shape[-1], 2 * lam.shape[-1])


def rotation_gramians(rho: torch.Tensor, alpha: torch.Tensor, b: torch.Tensor,
                      c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reachability and observability Gramians of the rotation-block system A = diag(ρ_i R(α_i)) in O(n²) work.

    The q² independent 2×2 Stein equations A_i X A_jᵀ − X = −B_i B_jᵀ are solved in closed form
    (differentiable). Q uses Aᵀ = diag(ρ_i R(−α_i)) and Cᵀ in place of B. Leading batch dimensions of all
    arguments are allowed (e.g. several equal-size layers at once).

    Parameters
    ----------
    rho : torch.Tensor
        Block radii (..., q), in (0, 1).
    alpha : torch.Tensor
        Block angles (..., q).
    b : torch.Tensor
        Input matrix (..., 2q, m).
    c : torch.Tensor
        Output matrix (..., p, 2q).

    Returns
    -------
    P, Q : torch.Tensor
        Gramians (..., 2q, 2q): P = Σ_k A^k B Bᵀ (Aᵀ)^k and Q = Σ_k (Aᵀ)^k Cᵀ C A^k.
    """
    return _rotation_gramian(rho, alpha, b), _rotation_gramian(rho, -alpha, c.transpose(-1, -2))


def dense_gramians(sys: StateSpace) -> tuple[torch.Tensor, torch.Tensor]:
    """Gramians of a dense stable discrete-time system from the Stein (discrete Lyapunov) equations
    A P Aᵀ − P + B Bᵀ = 0 and Aᵀ Q A − Q + Cᵀ C = 0, by scipy's ``solve_discrete_lyapunov`` (bilinear).

    Parameters
    ----------
    sys : StateSpace
        System (A, B, C, D) with all |eig(A)| < 1.

    Returns
    -------
    P, Q : torch.Tensor
        Reachability and observability Gramians (n, n), float64, symmetrised; not differentiable.

    Raises
    ------
    ValueError
        If A is not stable.
    """
    a, b, c = (t.detach().double().cpu().numpy() for t in (sys.a, sys.b, sys.c))
    if np.abs(np.linalg.eigvals(a)).max(initial=0.0) >= 1:
        raise ValueError("Gramians need a stable A (all |eig| < 1); this layer is unstable")
    p = scipy.linalg.solve_discrete_lyapunov(a, b @ b.T, method="bilinear")
    q = scipy.linalg.solve_discrete_lyapunov(a.T, c.T @ c, method="bilinear")
    sym = lambda x: torch.from_numpy(0.5 * (x + x.T))  # noqa: E731
    return sym(p), sym(q)


def hankel_singular_values(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Hankel singular values σ_i = sqrt(eig(PQ)) (Glover 1984), by the symmetric route
    σ² = eigvalsh(Lᵀ Q L) with P = L Lᵀ (eigh square root), stable when P or Q is only semidefinite.

    Parameters
    ----------
    p, q : torch.Tensor
        Reachability and observability Gramians (n, n), symmetric PSD.

    Returns
    -------
    torch.Tensor
        σ (n,), float64, descending, clipped at zero.
    """
    lp = psd_sqrt(p)
    m = lp.T @ q.double() @ lp
    lam = torch.linalg.eigvalsh(0.5 * (m + m.T))
    return lam.clamp_min(0).sqrt().flip(0)


def hankel_svdvals(p: torch.Tensor, q: torch.Tensor, jitter: float = 1e-9) -> torch.Tensor:
    """Hankel singular values σ = svdvals(L_Qᵀ L_P) from Cholesky factors P + εI = L_P L_Pᵀ, Q + εI = L_Q L_Qᵀ
    (Glover 1984: σ_i² = eig(PQ)), differentiable; ε is ``jitter`` times the mean diagonal (not differentiated).

    ``torch.linalg.svdvals`` back-propagates ḡ_σ as U diag(ḡ_σ) Vᵀ, with none of the 1/(σ_i² − σ_j²) terms
    of the singular vectors' gradient, so it is finite even for repeated σ.

    Parameters
    ----------
    p, q : torch.Tensor
        Gramians (..., n, n), symmetric PSD; leading batch dimensions allowed.
    jitter : float, optional
        Relative diagonal shift ε before the Cholesky factorisations.

    Returns
    -------
    torch.Tensor
        σ (..., n), descending, differentiable with respect to ``p`` and ``q``.
    """
    eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
    eps_p = jitter * p.diagonal(0, -2, -1).mean(-1)[..., None, None].detach()
    eps_q = jitter * q.diagonal(0, -2, -1).mean(-1)[..., None, None].detach()
    lp = torch.linalg.cholesky(p + eps_p * eye)
    lq = torch.linalg.cholesky(q + eps_q * eye)
    return torch.linalg.svdvals(lq.transpose(-1, -2) @ lp)


def hankel_nuclear_norm(p: torch.Tensor, q: torch.Tensor, jitter: float = 1e-9) -> torch.Tensor:
    """Hankel nuclear norm Σ_i σ_i = ‖L_Qᵀ L_P‖_*, the training regulariser of Schwerdtner et al., "Hankel singular
    value regularization for highly compressible state space models".

    Cholesky factors of P + εI and Q + εI make it differentiable (see :func:`hankel_svdvals`).

    Parameters
    ----------
    p, q : torch.Tensor
        Gramians (..., n, n), symmetric PSD; leading batch dimensions allowed.
    jitter : float, optional
        Relative diagonal shift ε before the Cholesky factorisations.

    Returns
    -------
    torch.Tensor
        Σ σ_i (...,), differentiable with respect to ``p`` and ``q``.
    """
    return hankel_svdvals(p, q, jitter).sum(-1)


def hankel_tail_norm(p: torch.Tensor, q: torch.Tensor, order: int, jitter: float = 1e-9,
                     relative: bool = False) -> torch.Tensor:
    """Truncated Hankel nuclear norm Σ_{i>r} σ_i, half the balanced-truncation bound 2 Σ_{i>r} σ_i (Enns 1984;
    Glover 1984), or with ``relative`` the tail energy Σ_{i>r} σ_i / Σ_i σ_i; the head σ_1..σ_r is not penalised.

    Differentiable by the route of :func:`hankel_svdvals`: the gradient with respect to M = L_Qᵀ L_P is
    U_tail V_tailᵀ, which does not depend on the basis chosen inside a group of equal σ (U_g V_gᵀ is invariant),
    so it is well defined whenever σ_r > σ_{r+1}; at a tie across the cut the function has a kink and the value
    returned is one of its one-sided gradients.

    Parameters
    ----------
    p, q : torch.Tensor
        Gramians (..., n, n), symmetric PSD; leading batch dimensions allowed.
    order : int
        Kept order r >= 0; r >= n gives 0, r = 0 the full nuclear norm (1 when ``relative``).
    jitter : float, optional
        Relative diagonal shift ε before the Cholesky factorisations.
    relative : bool, optional
        Divide by the full nuclear norm (scale-free tail energy in [0, 1]).

    Returns
    -------
    torch.Tensor
        Σ_{i>r} σ_i (or its ratio to Σ σ_i) (...,), differentiable with respect to ``p`` and ``q``.
    """
    return singular_value_tail(hankel_svdvals(p, q, jitter), order, relative)


def singular_value_tail(s: torch.Tensor, order: int, relative: bool = False) -> torch.Tensor:
    """Σ_{i>r} s_i of descending singular values ``s`` (..., n), or with ``relative`` Σ_{i>r} s_i / Σ_i s_i (0 for
    s = 0): the tail that truncation to order r drops (Eckart–Young; for HSVs, Enns 1984 / Glover 1984)."""
    if order < 0:
        raise ValueError(f"the kept order r must be >= 0, got {order}")
    tail = s[..., order:].sum(-1)
    return tail / s.sum(-1).clamp_min(torch.finfo(s.dtype).tiny) if relative else tail
