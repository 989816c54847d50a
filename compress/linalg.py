"""Dense linear algebra shared by the methods (float64, tensors in, tensors out)."""

from __future__ import annotations

import torch

__all__ = ["truncated_svd_factors", "energy_rank", "psd_sqrt"]


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
    return int(torch.searchsorted(kept, torch.tensor(1.0 - eps, dtype=kept.dtype)).item()) + 1


def psd_sqrt(a: torch.Tensor) -> torch.Tensor:
    """Symmetric PSD square root via eigh, negative round-off eigenvalues clipped to zero."""
    a = 0.5 * (a.double() + a.double().T)
    lam, q = torch.linalg.eigh(a)
    return (q * lam.clamp_min(0).sqrt()) @ q.T
