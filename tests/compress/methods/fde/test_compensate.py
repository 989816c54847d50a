"""Least-squares compensation of the consumers and its held-out check (compress.methods.fde.compensate)."""

from __future__ import annotations

import torch

from compress.core.chain import chain_forward
from compress.methods.fde import extract_chain
from compress.methods.fde.compensate import compensate, pre_activations, refit_bound, refit_consumers
from compress.methods.fde.partition import merge_to_widths
from compress.models import mlp


def _case():
    torch.manual_seed(2)
    original = extract_chain(mlp(4, [16], 2).eval())
    x = torch.randn(200, 4, generator=torch.Generator().manual_seed(3))
    return original, merge_to_widths(original, [5]).chain, x


def test_refit_lowers_the_calibration_output_error() -> None:
    # ridge 0: the least-squares solution is no worse on its own data than the weights it replaces
    original, merged, x = _case()
    refit = refit_consumers(original, merged, x, ridge=0.0)
    y = pre_activations(original, x)[-1]
    before = float((chain_forward(merged, x) - y).pow(2).sum())
    after = float((chain_forward(refit, x) - y).pow(2).sum())
    assert after < before


def test_heldout_check_rejects_a_refit_that_hurts() -> None:
    # nothing merged: the merged chain is exact, and a heavily ridged refit can only move away from it
    original, _, x = _case()
    result = compensate(original, original.copy(), x, ridge=10.0, holdout=0.25)
    assert not result.accepted and result.heldout_mse_refit > result.heldout_mse_merged == 0.0
    assert all(torch.equal(a, b) for a, b in zip(result.chain.weights, original.weights))


def test_heldout_check_accepts_a_refit_that_helps() -> None:
    original, merged, x = _case()
    result = compensate(original, merged, x, ridge=1e-6, holdout=0.25)
    assert result.accepted and result.heldout_mse_refit < result.heldout_mse_merged


def test_refit_bound_covers_the_refit_change() -> None:
    original, merged, x = _case()
    refit = refit_consumers(original, merged, x, ridge=1e-3)
    lo, hi = x.double().amin(0), x.double().amax(0)
    bound = refit_bound(merged, refit, lo, hi)
    probe = lo + torch.rand(2000, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * (hi - lo)
    assert torch.all((chain_forward(merged, probe) - chain_forward(refit, probe)).abs().amax(0) <= bound + 1e-9)
