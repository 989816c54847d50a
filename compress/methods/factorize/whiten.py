"""Activation-aware (whitened) low-rank maths: the output basis that minimises E‖(W − Ŵ)x‖² and its factors.

Pure linear algebra in float64: tensors in, tensors out.

References
----------
.. [1] Wang et al. 2024, SVD-LLM, eq. 3–5: truncation-aware whitening, the basis of :func:`whitened_output_basis` (from
       the Gram matrix WMWᵀ of the whitened weight instead of a Cholesky factor of M).
.. [2] Eckart & Young (1936): the truncated SVD of the whitened matrix ``WS`` is the optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.linalg import eigh_desc

__all__ = ["WhitenedBasis", "whitened_output_basis", "output_gram_basis", "projected_factors",
           "activation_distortion"]


@dataclass(frozen=True)
class WhitenedBasis:
    """Output basis U (o × q, orthonormal columns), squared whitened singular values, route and fallback."""

    basis: torch.Tensor
    sq_values: torch.Tensor
    route: str
    eigh_fell_back: bool


def whitened_output_basis(w: torch.Tensor, moment: torch.Tensor, rel_threshold: float = 1e-10
                          ) -> WhitenedBasis:
    """Activation-aware low-rank basis of one weight matrix (SVD-LLM, Wang et al. 2024, eq. 3–5, from the Gram
    matrix WMWᵀ of the whitened weight instead of a Cholesky factor of M).

    Minimising E‖(W − Ŵ)x‖² = ‖(W − Ŵ)S‖²_F over rank-r Ŵ, with M = E[xxᵀ] = SSᵀ, is Eckart–Young on
    A = WS = UΣVᵀ: the optimum is Ŵ = U_r U_rᵀ W (no inverse needed) and the distortion is Σ_{i>r} σ_i².
    ``A`` is formed from whichever side is smaller: o < d uses AAᵀ = WMWᵀ (o×o eigh), otherwise W = Q_w R_w
    (Q_w = I for a square W) and AAᵀ = Q_w (R_w M R_wᵀ) Q_wᵀ, so U = Q_w U' with U' from the d×d eigh of
    R_w M R_wᵀ: one eigh of the smaller side either way (no square root of M, no SVD: an eigh and an SVD of d×d
    cost about three times one eigh), exact for rank-deficient M (no diagonal shift), and the basis lies in W's
    column space (all of R^o for a square W), so full rank reproduces W even where M is singular. Eigenvalues
    below ``rel_threshold``·λ_max are treated as zero.

    Parameters
    ----------
    w : torch.Tensor
        Weight (o, d) of one group of the layer.
    moment : torch.Tensor
        Uncentred second moment M = E[xxᵀ] (d, d) of the layer's input rows.
    rel_threshold : float, optional
        Eigenvalues of M (or of WMWᵀ) below this fraction of the largest are treated as zero.

    Returns
    -------
    WhitenedBasis
        ``basis`` (o, min(o, d)) with orthonormal columns, ``sq_values`` (min(o, d),) the squared whitened
        singular values descending (the distortion of rank r is their tail sum), ``route`` (``"output"`` or
        ``"whiten"``) and ``eigh_fell_back``.
    """
    w, m = w.double(), moment.double()
    o, d = w.shape
    if o < d:
        return output_gram_basis(w @ m @ w.T, rel_threshold)
    # AAᵀ = Q_w (R_w M R_wᵀ) Q_wᵀ: a d×d eigh, and U stays inside W's column space; a square W is its own R_w
    # (Q_w = I: U spans all of R^o, and the directions outside W's column space get zero eigenvalues)
    q_w, r_w = (None, w) if o == d else torch.linalg.qr(w)
    lam, u, fell_back = eigh_desc(r_w @ m @ r_w.T)
    sq = torch.where(lam > rel_threshold * lam[0].clamp_min(0), lam, torch.zeros_like(lam))
    return WhitenedBasis(u if q_w is None else q_w @ u, sq, "whiten", fell_back)


def output_gram_basis(gram: torch.Tensor, rel_threshold: float = 1e-10) -> WhitenedBasis:
    """Activation-aware low-rank basis from the output Gram G = E[y₀y₀ᵀ] = W M Wᵀ (y₀ = W x, the bias-free output)
    directly: the route "output" of :func:`whitened_output_basis` (SVD-LLM, Wang et al. 2024, eq. 3–5), whose o × o
    eigh is of exactly this matrix, so a Gram summed from a layer's outputs gives its basis without M (d × d).

    Parameters
    ----------
    gram : torch.Tensor
        Output Gram G (o, o) of one group of the layer, for o < d (otherwise use :func:`whitened_output_basis`).
    rel_threshold : float, optional
        Eigenvalues of G below this fraction of the largest are treated as zero.

    Returns
    -------
    WhitenedBasis
        ``basis`` (o, o) with orthonormal columns, ``sq_values`` (o,) the eigenvalues of G descending (the squared
        whitened singular values), ``route`` ``"output"`` and ``eigh_fell_back``.
    """
    lam, u, fell_back = eigh_desc(gram.double())
    sq = torch.where(lam > rel_threshold * lam[0].clamp_min(0), lam, torch.zeros_like(lam))
    return WhitenedBasis(u, sq, "output", fell_back)


def projected_factors(w: torch.Tensor, basis: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors of Ŵ = U_r U_rᵀ W, the projection onto the whitened output basis (SVD-LLM, Wang et al. 2024).

    The split puts the orthonormal basis second, so no singular value is ever divided by; W's component on
    inputs never seen in calibration is kept rather than zeroed.

    Parameters
    ----------
    w : torch.Tensor
        Weight (o, d).
    basis : torch.Tensor
        Output basis U (o, q) with orthonormal columns, from :func:`whitened_output_basis`.
    rank : int
        Rank r kept, ``r <= q``.

    Returns
    -------
    first : torch.Tensor
        U_rᵀ W, shape (r, d), float64.
    second : torch.Tensor
        U_r, shape (o, r), float64.
    """
    u = basis[:, :rank].double()
    return u.T @ w.double(), u


def activation_distortion(w: torch.Tensor, w_hat: torch.Tensor, moment: torch.Tensor) -> float:
    """Expected output distortion E‖(W − Ŵ)x‖² = tr((W − Ŵ) M (W − Ŵ)ᵀ) for M = E[xxᵀ].

    Parameters
    ----------
    w, w_hat : torch.Tensor
        Original and approximated weights (o, d).
    moment : torch.Tensor
        Uncentred second moment M (d, d) of the inputs.

    Returns
    -------
    float
        The distortion, computed in float64.
    """
    e = w.double() - w_hat.double()
    return float(torch.einsum("od,de,oe->", e, moment.double(), e))
