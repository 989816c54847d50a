"""Dense linear algebra shared by the methods (float64, tensors in, tensors out)."""

from __future__ import annotations

import torch

__all__ = ["truncated_svd_factors", "energy_rank", "psd_sqrt", "sym_eig_desc", "balanced_gramian",
           "balanced_basis"]


def truncated_svd_factors(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eckart–Young: W ≈ (U_r √S_r)(√S_r V_rᵀ). Returns (first = √S_r V_rᵀ, second = U_r √S_r, S).

    The balanced √S split keeps both factors at the same scale. Computed in float64.
    """
    u, s, vh = torch.linalg.svd(w.double(), full_matrices=False)
    root = s[:rank].sqrt()
    return root[:, None] * vh[:rank], u[:, :rank] * root[None, :], s


def energy_rank(eigenvalues: torch.Tensor, eps: float) -> int:
    """Smallest r whose top-r eigenvalues keep at least 1 − eps of the (clipped, non-negative) total."""
    lam = eigenvalues.double().clamp_min(0).sort(descending=True).values
    total = lam.sum()
    if total <= 0:
        return 0
    kept = torch.cumsum(lam, 0) / total
    r = int(torch.searchsorted(kept, torch.tensor(1.0 - eps, dtype=kept.dtype)).item()) + 1
    return min(r, len(lam))  # round-off can leave the cumulative sum just below 1


def psd_sqrt(a: torch.Tensor) -> torch.Tensor:
    """Symmetric PSD square root via eigh, negative round-off eigenvalues clipped to zero."""
    a = 0.5 * (a.double() + a.double().T)
    lam, q = torch.linalg.eigh(a)
    return (q * lam.clamp_min(0).sqrt()) @ q.T


def sym_eig_desc(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigen-decomposition of a symmetric matrix in float64, eigenvalues descending (clipped at zero)."""
    a = 0.5 * (a.double() + a.double().T)
    lam, q = torch.linalg.eigh(a)
    return lam.flip(0).clamp_min(0), q.flip(1)


def balanced_gramian(gc: torch.Tensor, go: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """C-balanced test matrix B = Gc^½ Go Gc^½ (eigenvalues = squared Hankel singular values, Moore 1981).

    Returns ``(B, Gc^½)`` in float64.
    """
    root = psd_sqrt(gc)
    b = root @ go.double() @ root
    return 0.5 * (b + b.T), root


def balanced_basis(gc_root: torch.Tensor, vb: torch.Tensor, rank: int) -> torch.Tensor:
    """Orthonormal basis U = orth(Gc^½ V_b[:, :r]) of the r dominant balanced directions (d × r, float64)."""
    u, s, _ = torch.linalg.svd(gc_root.double() @ vb[:, :rank].double(), full_matrices=False)
    return u[:, :rank]
