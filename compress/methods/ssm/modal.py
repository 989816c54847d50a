"""Real modal (block-diagonal) form of a reduced system, with a conditioning check and a Schur fallback.

Eigen-decomposition A = V Λ V⁻¹; a conjugate pair λ = ρe^{iα}, v = v_r + i v_i (α > 0) becomes the real
2×2 block ρR(α) on the columns [v_r, −v_i]; a real eigenvalue a 1×1 block on its real eigenvector.
When the real eigenvector matrix T is ill-conditioned (cond(T) > max_cond) the orthogonal real Schur
form is used instead (Golub & Van Loan, Matrix Computations, Sec. 7.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch

from .layers import block_diagonal
from .system import StateSpace

__all__ = ["ModalForm", "real_modal_form", "real_schur_form"]


@dataclass(frozen=True)
class ModalForm:
    """Real modal system (float64): pairs (ρ, α) with α ∈ (0, π), real modes λ, and B, C, D in that basis.

    ``cond`` is the 2-norm condition number of the real basis T; ``residual`` is ‖T⁻¹AT − blockdiag‖/‖A‖.
    """

    rho: torch.Tensor
    alpha: torch.Tensor
    lam: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor
    cond: float
    residual: float


def _real_basis(a: torch.Tensor, imag_tol: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(T, λ pairs with Im > 0, real λ) or None when eigenvalues cannot be paired cleanly."""
    ev, vec = torch.linalg.eig(a)
    tol = imag_tol * ev.abs().clamp_min(1.0)
    upper, lower, real = ev.imag > tol, ev.imag < -tol, ev.imag.abs() <= tol
    if int(upper.sum()) != int(lower.sum()):
        return None
    pairs, vp = ev[upper], vec[:, upper]
    # Rotate each complex eigenvector by a phase making v_r ⊥ v_i (angle of vᵀv removed): best-conditioned pair.
    vp = vp * torch.exp(-0.5j * (vp * vp).sum(0).angle())[None]
    reals, vr = ev[real].real, vec[:, real]
    # A real eigenvector comes back with an arbitrary complex phase: rotate its largest entry to be real.
    idx = vr.abs().argmax(0)
    phase = vr.gather(0, idx[None]) / vr.gather(0, idx[None]).abs()
    vr = (vr / phase).real
    cols = torch.stack([vp.real, -vp.imag], 2).reshape(a.shape[0], -1)
    return torch.cat([cols, vr], 1), pairs, reals


def real_modal_form(sys: StateSpace, imag_tol: float = 1e-10) -> ModalForm | None:
    """The real modal form of ``sys`` (float64), or None when its eigenvalues cannot be paired."""
    sys = sys.double()
    basis = _real_basis(sys.a, imag_tol)
    if basis is None:
        return None
    t, pairs, reals = basis
    rho, alpha = pairs.abs(), pairs.angle()
    a_modal = torch.linalg.solve(t, sys.a @ t)
    target = block_diagonal(rho, alpha, reals)
    residual = float((a_modal - target).norm() / sys.a.norm().clamp_min(1e-300))
    return ModalForm(rho, alpha, reals, torch.linalg.solve(t, sys.b), sys.c @ t, sys.d,
                     float(torch.linalg.cond(t)), residual)


def real_schur_form(sys: StateSpace) -> StateSpace:
    """(Zᵀ A Z, Zᵀ B, C Z, D) with A = Z S Zᵀ the real Schur form (S quasi-upper-triangular, Z orthogonal)."""
    sys = sys.double()
    s, z = scipy.linalg.schur(sys.a.numpy(), output="real")
    zt = torch.from_numpy(np.ascontiguousarray(z))
    return StateSpace(torch.from_numpy(s), zt.T @ sys.b, sys.c @ zt, sys.d)
