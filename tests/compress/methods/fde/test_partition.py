"""Representatives of a lossy block and count-targeted partitions (compress.methods.fde.partition)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compress.methods.fde import extract_chain
from compress.methods.fde.partition import (block_error, block_representatives, blocks_to_count, input_blocks,
                                            layer_io, outgoing_weights)
from compress.models import mlp


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
