"""Whitened low-rank maths: predicted tail = measured distortion, optimal, never worse than plain SVD."""

import pytest
import torch

from minreal.compress.core.linalg import eigh_desc, psd_sqrt, truncated_svd_factors
from minreal.compress.methods.factorize.whiten import (
    activation_distortion,
    output_gram_basis,
    projected_factors,
    whitened_output_basis,
)


def _problem(o: int, d: int, n: int = 400, duplicate: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64)
    if duplicate:  # rank-deficient inputs: second half of the channels copies the first half
        x[:, d // 2: 2 * (d // 2)] = x[:, : d // 2]
    w = torch.randn(o, d, generator=g, dtype=torch.float64)
    return w, x, x.T @ x / n


@pytest.mark.parametrize("o,d", [(6, 15), (15, 6), (9, 9)])  # both routes: output (o < d) and whiten
@pytest.mark.parametrize("duplicate", [False, True])
def test_predicted_tail_equals_measured_distortion_and_is_optimal(o: int, d: int, duplicate: bool) -> None:
    w, x, m = _problem(o, d, duplicate=duplicate)
    wb = whitened_output_basis(w, m)
    assert wb.route == ("output" if o < d else "whiten")
    assert torch.isfinite(wb.basis).all() and torch.isfinite(wb.sq_values).all()
    # Eckart–Young on A = W M^½ computed independently: the optimum for every rank.
    optimal = torch.linalg.svdvals(w @ psd_sqrt(m)) ** 2
    for r in range(1, min(o, d) + 1):
        first, second = projected_factors(w, wb.basis, r)
        w_hat = second @ first
        measured = float(((x @ (w - w_hat).T) ** 2).sum(1).mean())
        predicted = float(wb.sq_values[r:].sum())
        best = float(optimal[r:].sum())
        scale = float(wb.sq_values.sum())
        assert measured == pytest.approx(predicted, rel=1e-7, abs=1e-10 * scale)
        assert measured == pytest.approx(best, rel=1e-6, abs=1e-9 * scale)
        assert measured == pytest.approx(activation_distortion(w, w_hat, m), rel=1e-7, abs=1e-10 * scale)


@pytest.mark.parametrize("o,d", [(6, 15), (15, 6)])
def test_activation_aware_never_worse_than_plain_svd(o: int, d: int) -> None:
    w, _, m = _problem(o, d, seed=3)
    wb = whitened_output_basis(w, m)
    for r in range(1, min(o, d) + 1):
        f, s = projected_factors(w, wb.basis, r)
        a, b, _ = truncated_svd_factors(w, r)
        assert activation_distortion(w, s @ f, m) <= activation_distortion(w, b @ a, m) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("o,d,duplicate", [(6, 15, False), (15, 6, False), (15, 6, True)])
def test_full_rank_reproduces_the_weight_and_basis_is_orthonormal(o: int, d: int, duplicate: bool) -> None:
    w, _, m = _problem(o, d, duplicate=duplicate)
    wb = whitened_output_basis(w, m)
    k = min(o, d)
    assert wb.basis.shape == (o, k)
    torch.testing.assert_close(wb.basis.T @ wb.basis, torch.eye(k, dtype=torch.float64), atol=1e-10, rtol=0)
    first, second = projected_factors(w, wb.basis, k)
    torch.testing.assert_close(second @ first, w, atol=1e-10, rtol=0)


def test_zero_and_singular_moments_give_no_nan() -> None:
    w = torch.randn(8, 5, dtype=torch.float64)
    for m in (torch.zeros(5, 5, dtype=torch.float64), torch.ones(5, 5, dtype=torch.float64)):
        wb = whitened_output_basis(w, m)
        assert torch.isfinite(wb.basis).all() and torch.isfinite(wb.sq_values).all()
        assert (wb.sq_values >= 0).all()


@pytest.mark.parametrize("o,d,duplicate", [(15, 6, False), (9, 9, False), (40, 12, True), (12, 12, True)])
def test_wide_route_is_the_svd_of_the_whitened_weight(o: int, d: int, duplicate: bool) -> None:
    """o ≥ d: the squared singular values and every rank's projector U_r U_rᵀ of A = W M^½ (computed here by an SVD
    of A), from one d×d eigh and no SVD at all (issue 44: an eigh and an SVD of d×d cost about three eighs)."""
    import minreal.compress.methods.factorize.whiten as whiten

    w, _, m = _problem(o, d, duplicate=duplicate)
    u_ref, sig, _ = torch.linalg.svd(w @ psd_sqrt(m), full_matrices=False)
    calls = []

    def counted(a: torch.Tensor):
        calls.append(a.shape)
        return eigh_desc(a)

    def no_svd(*args, **kwargs):
        raise AssertionError("the wide route takes no SVD")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(whiten, "eigh_desc", counted)
        mp.setattr(torch.linalg, "svd", no_svd)
        wb = whitened_output_basis(w, m)
    assert calls == [(d, d)] and wb.route == "whiten"
    scale = float(sig[0] ** 2)
    torch.testing.assert_close(wb.sq_values[: sig.numel()], sig**2, atol=1e-10 * scale, rtol=1e-9)
    gaps = [r for r in range(1, d) if sig[r - 1] ** 2 - sig[r] ** 2 > 1e-6 * scale]  # a unique rank-r subspace
    assert gaps
    for r in gaps:
        torch.testing.assert_close(wb.basis[:, :r] @ wb.basis[:, :r].T, u_ref[:, :r] @ u_ref[:, :r].T,
                                   atol=1e-8, rtol=0)


def test_a_singular_square_weight_is_reproduced_at_full_rank_and_its_tail_is_measured() -> None:
    """A square W of rank 4 (its basis spans all of R^o, the directions outside W's columns with zero values)."""
    _, x, m = _problem(9, 9, duplicate=True)
    g = torch.Generator().manual_seed(5)
    w = torch.randn(9, 4, generator=g, dtype=torch.float64) @ torch.randn(4, 9, generator=g, dtype=torch.float64)
    wb = whitened_output_basis(w, m)
    torch.testing.assert_close(wb.basis.T @ wb.basis, torch.eye(9, dtype=torch.float64), atol=1e-10, rtol=0)
    assert (wb.sq_values[4:] == 0).all()
    scale = float(wb.sq_values.sum())
    for r in range(1, 10):
        first, second = projected_factors(w, wb.basis, r)
        measured = float(((x @ (w - second @ first).T) ** 2).sum(1).mean())
        assert measured == pytest.approx(float(wb.sq_values[r:].sum()), rel=1e-7, abs=1e-10 * scale)
    first, second = projected_factors(w, wb.basis, 9)
    torch.testing.assert_close(second @ first, w, atol=1e-10, rtol=0)


@pytest.mark.parametrize("n,duplicate", [(400, False), (400, True), (5, False)])  # full, singular M, rank 5 < o
def test_output_gram_gives_the_output_route_basis(n: int, duplicate: bool, projectors_agree) -> None:
    """The basis and spectrum from G = E[y₀y₀ᵀ] of the outputs y₀ = W x equal whitened_output_basis(W, E[xxᵀ]) for
    o < d: the same matrix W M Wᵀ summed in another order, and the same threshold (zeros where M is singular)."""
    w, x, m = _problem(9, 20, n=n, duplicate=duplicate, seed=5)
    y0 = x @ w.T
    ref = whitened_output_basis(w, m)
    exact = output_gram_basis(w @ m @ w.T)
    assert exact.route == ref.route == "output"
    assert torch.equal(exact.basis, ref.basis) and torch.equal(exact.sq_values, ref.sq_values)
    got = output_gram_basis(y0.T @ y0 / n)
    assert got.route == "output" and got.basis.shape == ref.basis.shape == (9, 9)
    scale = float(ref.sq_values[0])
    torch.testing.assert_close(got.sq_values, ref.sq_values, rtol=0, atol=1e-11 * scale)
    assert torch.equal(got.sq_values > 0, ref.sq_values > 0)
    projectors_agree(got.basis, ref.basis, ref.sq_values, 1e-8)
