"""Shared checks of factorize's tests."""

from collections.abc import Callable

import pytest
import torch


def _projectors_agree(u: torch.Tensor, v: torch.Tensor, sq: torch.Tensor, tol: float) -> None:
    """U_r U_rᵀ = V_r V_rᵀ (orthonormal columns) at every rank r that ends on a gap of the spectrum ``sq``
    (descending): a basis is unique only up to signs and rotations inside equal eigenvalues."""
    for r in range(1, len(sq) + 1):
        if r < len(sq) and sq[r - 1] - sq[r] <= 1e-6 * sq[0]:
            continue
        torch.testing.assert_close(u[:, :r] @ u[:, :r].T, v[:, :r] @ v[:, :r].T, rtol=0, atol=tol)


@pytest.fixture
def projectors_agree() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], None]:
    """Asserts that two output bases give the same projectors U_r U_rᵀ at every rank with a spectral gap."""
    return _projectors_agree
