"""Whitened low-rank maths: predicted tail = measured distortion, optimal, never worse than plain SVD."""

import pytest
import torch

from minreal.compress.core.linalg import psd_sqrt, truncated_svd_factors
from minreal.compress.methods.factorize.whiten import activation_distortion, projected_factors, whitened_output_basis


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
