"""Dense linear algebra shared by the methods (float64, tensors in, tensors out).

References
----------
.. [1] Eckart & Young (1936): truncated SVD (:func:`truncated_svd_factors`).
.. [2] Moore 1981, "Principal component analysis in linear systems: controllability, observability, and model
       reduction", IEEE Trans. Automatic Control 26(1): balanced truncation (:func:`balanced_gramian`).
.. [3] Hoerl & Kennard 1970, eq. 2.2: ridge regression (:func:`ridge_lstsq`).
"""

from __future__ import annotations

import torch

__all__ = ["truncated_svd_factors", "energy_rank", "psd_sqrt", "sym_eig_desc", "eigh_desc", "balanced_gramian",
           "balanced_basis", "ridge_lstsq"]


def truncated_svd_factors(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best rank-``rank`` factors of a matrix (Eckart–Young 1936), split as W ≈ (U_r √S_r)(√S_r V_rᵀ).

    The balanced √S split keeps both factors at the same scale.

    Parameters
    ----------
    w : torch.Tensor
        Matrix of shape (o, d), any float dtype; computed in float64.
    rank : int
        Number of singular triplets kept, ``0 <= rank <= min(o, d)``.

    Returns
    -------
    first : torch.Tensor
        √S_r V_rᵀ, shape (rank, d), float64.
    second : torch.Tensor
        U_r √S_r, shape (o, rank), float64.
    s : torch.Tensor
        All singular values of ``w``, descending; ‖W − second·first‖_F² = Σ_{i>r} s_i².
    """
    u, s, vh = torch.linalg.svd(w.double(), full_matrices=False)
    root = s[:rank].sqrt()
    return root[:, None] * vh[:rank], u[:, :rank] * root[None, :], s


def energy_rank(eigenvalues: torch.Tensor, eps: float) -> int:
    """Smallest rank whose top eigenvalues keep at least ``1 − eps`` of the total (clipped at zero).

    Parameters
    ----------
    eigenvalues : torch.Tensor
        Eigenvalues (or squared singular values), any order; negatives are round-off and clipped to zero.
    eps : float
        Fraction of the total energy that may be left out, in [0, 1).

    Returns
    -------
    int
        r in [0, n]: 0 when the total is zero, else the smallest r with Σ_{i≤r} λ_i ≥ (1 − eps) Σ λ_i.
    """
    lam = eigenvalues.double().clamp_min(0).sort(descending=True).values
    total = lam.sum()
    if total <= 0:
        return 0
    kept = torch.cumsum(lam, 0) / total
    r = int(torch.searchsorted(kept, torch.tensor(1.0 - eps, dtype=kept.dtype)).item()) + 1
    return min(r, len(lam))  # round-off can leave the cumulative sum just below 1


def psd_sqrt(a: torch.Tensor) -> torch.Tensor:
    """Symmetric square root of a positive semi-definite matrix, A^½ = Q Λ^½ Qᵀ.

    Parameters
    ----------
    a : torch.Tensor
        Square matrix (n, n), symmetric up to round-off (it is symmetrised first).

    Returns
    -------
    torch.Tensor
        A^½ (n, n) in float64, negative round-off eigenvalues clipped to zero.
    """
    lam, q = sym_eig_desc(a)
    return (q * lam.sqrt()) @ q.T


def sym_eig_desc(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigen-decomposition of a symmetric PSD matrix, eigenvalues descending.

    Parameters
    ----------
    a : torch.Tensor
        Square matrix (n, n), symmetric up to round-off (it is symmetrised first).

    Returns
    -------
    lam : torch.Tensor
        Eigenvalues (n,) in float64, descending, clipped at zero.
    q : torch.Tensor
        Orthonormal eigenvectors as columns (n, n), in the order of ``lam``.
    """
    a = 0.5 * (a.double() + a.double().T)
    lam, q = torch.linalg.eigh(a)
    return lam.flip(0).clamp_min(0), q.flip(1)


def eigh_desc(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Eigen-decomposition of a symmetric matrix, eigenvalues descending, falling back to an SVD if eigh fails.

    Parameters
    ----------
    a : torch.Tensor
        Square matrix (n, n), symmetric up to round-off (it is symmetrised first); computed in its own dtype.

    Returns
    -------
    lam : torch.Tensor
        Eigenvalues (n,), descending, not clipped (the SVD route returns singular values, i.e. |λ|).
    q : torch.Tensor
        Orthonormal eigenvectors as columns (n, n).
    fell_back : bool
        True when ``torch.linalg.eigh`` failed to converge and the SVD route was used.
    """
    a = 0.5 * (a + a.T)
    try:
        lam, q = torch.linalg.eigh(a)
        return lam.flip(0), q.flip(1), False
    except RuntimeError:  # torch.linalg.LinAlgError subclasses RuntimeError
        u, s, _ = torch.linalg.svd(a)
        return s, u, True


def balanced_gramian(gc: torch.Tensor, go: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """C-balanced test matrix B = Gc^½ Go Gc^½, whose eigenvalues are the squared Hankel singular values
    (Moore 1981, "Principal component analysis in linear systems: controllability, observability, and model
    reduction", IEEE Trans. Automatic Control 26(1)).

    Parameters
    ----------
    gc : torch.Tensor
        Reachability (controllability) Gramian (d, d), symmetric PSD.
    go : torch.Tensor
        Observability Gramian (d, d), symmetric PSD.

    Returns
    -------
    b : torch.Tensor
        B (d, d) in float64, symmetrised.
    gc_root : torch.Tensor
        Gc^½ (d, d) in float64 (see :func:`psd_sqrt`), needed by :func:`balanced_basis`.
    """
    root = psd_sqrt(gc)
    b = root @ go.double() @ root
    return 0.5 * (b + b.T), root


def balanced_basis(gc_root: torch.Tensor, vb: torch.Tensor, rank: int) -> torch.Tensor:
    """Orthonormal basis U = orth(Gc^½ V_b[:, :r]) of the r dominant balanced directions (Moore 1981).

    Parameters
    ----------
    gc_root : torch.Tensor
        Gc^½ (d, d) from :func:`balanced_gramian`.
    vb : torch.Tensor
        Eigenvectors of B = Gc^½ Go Gc^½ (d, d), columns in descending eigenvalue order.
    rank : int
        Number of directions r, ``1 <= r <= d``.

    Returns
    -------
    torch.Tensor
        U (d, r) in float64 with orthonormal columns.
    """
    u, s, _ = torch.linalg.svd(gc_root.double() @ vb[:, :rank].double(), full_matrices=False)
    return u[:, :rank]


def ridge_lstsq(a: torch.Tensor, target: torch.Tensor, ridge: float, intercept: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Affine ridge least squares (Hoerl & Kennard 1970, eq. 2.2): ``min ‖[A, 1] θ − T‖² + λ‖θ‖²`` with
    ``θ = [Wᵀ; b]`` and ``λ = ridge·tr([A, 1]ᵀ[A, 1])/cols``; minimum norm when rank-deficient (dead neurons).
    Without ``intercept`` the map is linear (``[A]`` alone, for a layer without a bias): ``b`` is zero.

    Parameters
    ----------
    a : torch.Tensor
        Inputs, shape (n, d), float64.
    target : torch.Tensor
        Targets, shape (n, o), float64.
    ridge : float
        Relative ridge, >= 0 (0: plain least squares, the exact minimiser of the residual).

    Returns
    -------
    w, b : torch.Tensor
        Weight (o, d) and bias (o,) of the fitted affine map ``x ↦ W x + b``.
    """
    a1 = torch.cat([a, torch.ones(len(a), 1, dtype=a.dtype)], 1) if intercept else a
    lam = ridge * float(a1.pow(2).sum()) / a1.shape[1]
    if lam > 0:
        a1 = torch.cat([a1, lam ** 0.5 * torch.eye(a1.shape[1], dtype=a.dtype)])
        target = torch.cat([target, target.new_zeros(a1.shape[1], target.shape[1])])
    theta = torch.linalg.lstsq(a1, target, driver="gelsd").solution
    return (theta[:-1].T, theta[-1]) if intercept else (theta.T, theta.new_zeros(theta.shape[1]))
