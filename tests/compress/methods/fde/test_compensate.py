"""Least-squares compensation of the consumers and its held-out check (minreal.compress.methods.fde.compensate)."""

from __future__ import annotations

import torch

from minreal.compress.core.chain import chain_forward
from minreal.compress.core.prune import prune_chain
from minreal.compress.methods.fde import extract_chain
from minreal.compress.methods.fde.compensate import (
    compensate,
    member_targets,
    pre_activations,
    refit_bound,
    refit_consumers,
)
from minreal.compress.methods.fde.partition import merge_to_widths
from minreal.compress.models import mlp


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


def test_refit_of_a_hidden_layer_targets_the_kept_neurons() -> None:
    # two hidden layers, the second pruned to its odd neurons (groups name the original indices): the first is
    # untouched, so the ridge-free refit of the second reproduces the kept neurons' original pre-activations —
    # with groups [[0], [1], …] it would chase neurons 0, 1, … instead
    torch.manual_seed(6)
    original = extract_chain(mlp(4, [12, 10], 2).eval())
    x = torch.randn(80, 4, generator=torch.Generator().manual_seed(7))
    kept = torch.arange(1, 10, 2)
    score = torch.zeros(10, dtype=torch.float64).index_fill_(0, kept, 1.0)
    pruned = prune_chain(original, [torch.ones(12, dtype=torch.float64), score], [12, 5])
    assert pruned.groups[1] == [[int(i)] for i in kept]
    refit = refit_consumers(original, pruned, x, ridge=0.0)
    assert torch.allclose(pre_activations(refit, x)[1], pre_activations(original, x)[1][:, kept], atol=1e-8)


def test_refit_of_two_merged_hidden_layers_lowers_the_output_error() -> None:
    torch.manual_seed(8)
    original = extract_chain(mlp(4, [16, 14], 2).eval())
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(9))
    merged = merge_to_widths(original, [6, 5]).chain
    refit = refit_consumers(original, merged, x, ridge=0.0)
    assert not torch.equal(refit.weights[1], merged.weights[1])
    y = pre_activations(original, x)[-1]
    assert float((chain_forward(refit, x) - y).pow(2).sum()) < float((chain_forward(merged, x) - y).pow(2).sum())


def test_member_targets_with_vanishing_or_negative_correlation() -> None:
    g = torch.Generator().manual_seed(10)
    zk = torch.randn(50, generator=g, dtype=torch.float64)
    noise = torch.randn(50, generator=g, dtype=torch.float64)
    ortho = noise - (noise @ zk) / (zk @ zk) * zk + 1e-9 * zk  # ρ ≈ 1e-9: z/ρ would be ~1e9
    z_orig = torch.stack([ortho, 3 * ortho - zk, 2 * zk], 1)
    z_merged = torch.stack([zk, zk], 1)
    t = member_targets(z_orig, z_merged, [[0], [1, 2]])
    assert torch.equal(t[:, 0], zk)  # no member is a rescaling: target unchanged
    assert torch.allclose(t[:, 1], zk)  # the negative member is dropped: t = 2 zk · 2 / 4
    assert bool(torch.isfinite(t).all()) and float(t.abs().max()) <= float(zk.abs().max())
