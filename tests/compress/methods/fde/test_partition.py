"""Representatives of a lossy block and count-targeted partitions (minreal.compress.methods.fde.partition)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minreal.compress.methods.fde import extract_chain
from minreal.compress.methods.fde.partition import (
    block_error,
    block_representatives,
    blocks_to_count,
    input_blocks,
    layer_io,
    outgoing_weights,
)
from minreal.compress.models import mlp


def _lossy_block() -> tuple:
    """Layer 1 of a seeded ReLU MLP (second hidden layer, so its inputs are hidden activations) with 12 rows
    grouped into 3 lossy blocks of 4 (leaders 0, 4, 8), value merges (ρ = 1)."""
    torch.manual_seed(5)
    chain = extract_chain(mlp(5, [10, 12], 3).eval())
    x = torch.randn(64, 5, generator=torch.Generator().manual_seed(6))
    w = chain.weights[1]
    v = torch.cat([w, chain.biases[1][:, None]], 1)
    leader = np.repeat([0, 4, 8], 4)
    rho = torch.ones(12, dtype=torch.float64)
    h, z = layer_io(chain, 1, x)
    return v, leader, rho, h, z, outgoing_weights(input_blocks(chain.weights[2], 12))


def test_lstsq_representative_is_optimal_in_the_weighted_block_error() -> None:
    v, leader, rho, h, z, wts = _lossy_block()
    err = {k: block_error(h, z, leader, rho, wts, block_representatives(v, leader, rho, k, h, z, wts))
           for k in ("leader", "mean", "lstsq")}
    assert err["lstsq"] <= err["mean"] * (1 + 1e-9) and err["lstsq"] <= err["leader"] * (1 + 1e-9)
    assert err["lstsq"] < err["leader"]


def test_mean_representative_beats_leader_unweighted() -> None:
    # Σ_i ‖[H, 1](r − v_i)‖² is minimised by the block mean for any inputs H.
    v, leader, rho, h, z, _ = _lossy_block()
    ones = torch.ones(12, dtype=torch.float64)
    err = {k: block_error(h, z, leader, rho, ones, block_representatives(v, leader, rho, k))
           for k in ("leader", "mean")}
    assert err["mean"] < err["leader"]


def test_leader_representative_is_the_leader_row() -> None:
    v, leader, rho, *_ = _lossy_block()
    assert torch.equal(block_representatives(v, leader, rho, "leader"), v[[0, 4, 8]])


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("k", [1, 7, 19, 40])
def test_blocks_to_count_gives_exactly_k_blocks_within_tolerance(k: int, scaled: bool) -> None:
    v = torch.randn(40, 6, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    leader, rho, tol = blocks_to_count(v, k, scaled, False)
    assert len(np.unique(leader)) == k
    assert np.all(leader[leader] == leader)  # every leader leads itself: no chaining
    scale = 1.0 if scaled else float(v.abs().max())
    ref = v / v.abs().amax(1, keepdim=True) if scaled else v
    assert float((ref - ref[torch.from_numpy(leader)]).abs().amax()) <= tol * scale + 1e-12


def test_lstsq_keeps_singletons_and_unseen_directions() -> None:
    # 8 calibration samples of 12 inputs: the data sees only part of the row space. Singletons keep their row
    # exactly, and the lossy block's representative differs from its leader only inside the row space of [H, 1].
    g = torch.Generator().manual_seed(11)
    v = torch.randn(6, 13, generator=g, dtype=torch.float64)
    h = torch.randn(8, 12, generator=g, dtype=torch.float64)
    z = h @ v[:, :-1].T + v[:, -1]
    leader, rho = np.array([0, 0, 0, 3, 4, 5]), torch.ones(6, dtype=torch.float64)
    rep = block_representatives(v, leader, rho, "lstsq", h, z, torch.ones(6, dtype=torch.float64))
    assert torch.equal(rep[1:], v[3:])
    a1 = torch.cat([h, torch.ones(8, 1, dtype=torch.float64)], 1)
    null = torch.linalg.svd(a1, full_matrices=True).Vh[9:]  # rank 9: the directions the data does not see
    assert torch.allclose(null @ rep[0], null @ v[0], atol=1e-10)


def test_lstsq_keeps_blocks_equal_within_rounding() -> None:
    g = torch.Generator().manual_seed(12)
    v = torch.randn(4, 9, generator=g, dtype=torch.float64)
    v = torch.cat([v, v * (1 + 1e-9)])
    h = torch.randn(5, 8, generator=g, dtype=torch.float64)
    z = h @ v[:, :-1].T + v[:, -1]
    leader, rho = np.array([0, 1, 2, 3, 0, 1, 2, 3]), torch.ones(8, dtype=torch.float64)
    rep = block_representatives(v, leader, rho, "lstsq", h, z, torch.ones(8, dtype=torch.float64), exact_tol=1e-6)
    assert torch.equal(rep, v[:4])


def test_blocks_to_count_merges_zero_rows_to_meet_k() -> None:
    v = torch.randn(20, 6, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    v[::5] = 0.0
    v[1::5] = 0.0
    leader, rho, _ = blocks_to_count(v, 3, True, False)
    assert len(np.unique(leader)) == 3
    zero = (v.abs().amax(1) == 0).numpy()
    assert len(np.unique(leader[zero])) == 1 and torch.all(rho[torch.from_numpy(zero)] == 1.0)
    assert not np.any(zero[leader[~zero]])  # no live row is led by a zero row
