"""Reachability / observability Gramians against closed forms and sample statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.methods.cbalanced.empirical_gramians import (
    collect_gramians,
    collect_states,
    default_state_points,
    observability_gramians,
    reachability_gramians,
)
from minreal.compress.models import mlp


def _linear_net(widths: list[int], out: int = 3) -> nn.Sequential:
    torch.manual_seed(7)
    return mlp(6, widths, out, activation="identity").double().eval()


def test_default_state_points_are_hidden_activations(tiny_mlp, tiny_cnn) -> None:
    assert default_state_points(tiny_mlp) == ["2", "4"]
    assert default_state_points(tiny_cnn) == ["2", "5", "8"]
    assert default_state_points(_linear_net([5, 4])) == ["2", "4"]


def test_gc_equals_sample_covariance(tiny_mlp, mlp_data) -> None:
    # float64 model and data: the states come from batches of 17 here and one batch of 96 in collect_states;
    # float32 kernels round differently per batch shape (~1e-7 relative), float64 ones ~1e-16, far below rtol.
    model, data = tiny_mlp.double(), Dataset(mlp_data.x.double())
    points = default_state_points(model)
    states = collect_states(model, data, points)
    gram = reachability_gramians(model, data, points, batch_size=17)  # streaming over uneven batches
    for p in points:
        h = states[p].numpy()
        mean, gc = gram[p]
        np.testing.assert_allclose(gc.numpy(), np.cov(h, rowvar=False), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(mean.numpy(), h.mean(0), rtol=1e-9, atol=1e-12)


def test_gc_of_feature_maps_is_covariance_of_pooled_states(tiny_cnn, image_data) -> None:
    feats = {}
    tiny_cnn[5].register_forward_hook(lambda m, i, o: feats.setdefault("h", o))
    with torch.no_grad():
        tiny_cnn(image_data.x)
    pooled = feats["h"].mean((2, 3)).double().numpy()
    _, gc = reachability_gramians(tiny_cnn, image_data, ["5"])["5"]
    np.testing.assert_allclose(gc.numpy(), np.cov(pooled, rowvar=False), rtol=1e-6, atol=1e-9)


def test_go_of_deep_linear_network_is_the_analytic_product() -> None:
    """z = W_L … W_{l+1} h_l + c, so Go_l = (W_L…W_{l+1})ᵀ (W_L…W_{l+1}) for every sample."""
    net = _linear_net([5, 4, 7])
    data = Dataset(torch.randn(40, 6, dtype=torch.float64))
    points = default_state_points(net)
    go, method = observability_gramians(net, data, points, batch_size=16)
    assert method == "exact"
    weights = [m.weight.detach() for m in net if isinstance(m, nn.Linear)]
    for l, p in enumerate(points):
        prod = torch.eye(weights[l + 1].shape[1], dtype=torch.float64)
        for w in weights[l + 1:]:
            prod = w @ prod
        torch.testing.assert_close(go[p], prod.T @ prod, rtol=1e-10, atol=1e-12)


def test_go_of_pooled_last_stage_is_head_gram(tiny_cnn, image_data) -> None:
    """After global average pooling z = W mean(h) + b: a channel-uniform shift gives J = W, so Go = WᵀW."""
    go, _ = observability_gramians(tiny_cnn, image_data, ["8"])
    w = tiny_cnn[-1].weight.detach().double()
    torch.testing.assert_close(go["8"], w.T @ w, rtol=1e-5, atol=1e-6)


def test_random_projection_estimate_converges_to_exact_go(tiny_mlp, mlp_data) -> None:
    points = default_state_points(tiny_mlp)
    exact, _ = observability_gramians(tiny_mlp, mlp_data, points)
    errors = []
    for k in (2, 64, 1024):
        est, method = observability_gramians(tiny_mlp, mlp_data, points, max_exact_outputs=0, probes=k, seed=3)
        assert method == f"probes:{k}"
        errors.append(max(float((est[p] - exact[p]).norm() / exact[p].norm()) for p in points))
    assert errors[2] < errors[1] < errors[0]
    assert errors[2] < 0.05  # relative error ~ 1/sqrt(k·N): about 0.01 here


def test_collect_gramians_uses_go_subsample(tiny_mlp, mlp_data) -> None:
    grams = collect_gramians(tiny_mlp, mlp_data, go_samples=30)
    g = grams["2"]
    assert (g.samples_gc, g.samples_go, g.dim) == (96, 30, 32)
    direct, _ = observability_gramians(tiny_mlp, mlp_data.take(30), ["2"])
    torch.testing.assert_close(g.go, direct["2"])


def test_unknown_state_point_is_an_error(tiny_mlp, mlp_data) -> None:
    with pytest.raises(ValueError, match="not found"):
        collect_gramians(tiny_mlp, mlp_data, ["nope"])
