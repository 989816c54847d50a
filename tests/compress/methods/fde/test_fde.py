"""ε-FDE merging: exact lumping at ε = 0, refinement across layers, the propagated bound, export."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from minreal.compress import RecoveryConfig, compress
from minreal.compress.core.data import Dataset
from minreal.compress.methods.fde import (
    FDEConfig,
    box_samples,
    build_sequential,
    chain_forward,
    extract_chain,
    input_box,
    leader_clusters,
    refine,
)
from minreal.compress.models import ACTIVATIONS, mlp, small_cnn


def _planted_relu() -> nn.Sequential:
    """6 → 20 → 16 → 3 ReLU MLP: neuron 4 ≡ neuron 1, neuron 9 = 3·neuron 2 (layer 1); rows 3 and 7 of layer 2
    differ but agree once layer 1's duplicate columns are summed (visible only after refinement)."""
    torch.manual_seed(11)
    m = mlp(6, [20, 16], 3).eval()
    with torch.no_grad():
        w1, b1, w2 = m[1].weight, m[1].bias, m[3].weight
        w1[4], b1[4] = w1[1], b1[1]
        w1[9], b1[9] = 3.0 * w1[2], 3.0 * b1[2]
        w2[7], m[3].bias[7] = w2[3], m[3].bias[3]
        w2[7, 1], w2[7, 4] = w2[3, 1] + w2[3, 4] - 0.25, 0.25
    return m


@pytest.fixture
def calib() -> Dataset:
    g = torch.Generator().manual_seed(3)
    return Dataset(torch.randn(256, 6, generator=g))


def test_eps0_merges_exactly_the_planted_neurons(calib: Dataset) -> None:
    model = _planted_relu()
    new, rep = compress(model, calib, "fde", FDEConfig(merge_eps=0.0, remove_dead=False))
    assert rep.predicted["hidden_widths"] == [18, 15]
    chain = extract_chain(model)
    merged = refine(chain, 0.0).chain
    assert sorted(g for g in merged.groups[0] if len(g) > 1) == [[1, 4], [2, 9]]
    assert [g for g in merged.groups[1] if len(g) > 1] == [[3, 7]]
    x = torch.randn(500, 6)
    with torch.no_grad():
        ref, out = model(x), new(x)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6)
    assert rep.params_after == sum(p.numel() for p in new.parameters()) < rep.params_before


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_no_duplicates_nothing_merged(activation: str, calib: Dataset) -> None:
    torch.manual_seed(5)
    model = mlp(6, [24, 24], 3, activation).eval()
    _, rep = compress(model, calib, "fde", FDEConfig(merge_eps=0.0, remove_dead=False))
    assert rep.predicted["hidden_widths"] == [24, 24]
    assert rep.predicted["output_deviation_bound"] == 0.0
    assert rep.params_after == rep.params_before


def test_identity_layer_sum_equivalence() -> None:
    """Identity layer: outgoing columns c_5 = −2·c_1 lump into one neuron with incoming v_1 − 2·v_5."""
    torch.manual_seed(7)
    model = mlp(5, [12, 10], 2, "identity").eval()
    with torch.no_grad():
        model[3].weight[:, 5] = -2.0 * model[3].weight[:, 1]
    merged = refine(extract_chain(model), 0.0)
    assert merged.chain.widths == [11, 10]
    assert [g for g in merged.chain.groups[0] if len(g) > 1] == [[1, 5]]
    assert any(s.kind == "sum" for s in merged.steps)
    x = torch.randn(64, 5, dtype=torch.float64)
    assert torch.allclose(chain_forward(merged.chain, x), chain_forward(extract_chain(model), x), atol=1e-5)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_measured_deviation_within_bound(activation: str) -> None:
    torch.manual_seed(13)
    model = mlp(3, [48, 32], 2, activation).eval()
    with torch.no_grad():
        model[1].bias[:8] = -5.0  # dead for ReLU on the box: removed by the constant-neuron step
    calib = Dataset(torch.rand(400, 3) * 2 - 1)
    _, rep = compress(model, calib, "fde", FDEConfig(merge_eps=0.35))
    assert sum(rep.predicted["hidden_widths"]) < 80, "the test needs some merging"
    chain0 = extract_chain(model)
    lo, hi = input_box(calib.x)
    x = box_samples(lo, hi, 3000, seed=99)
    bound = rep.predicted["output_deviation_bound"]
    new_chain = extract_chain(compress(model, calib, "fde", FDEConfig(merge_eps=0.35))[0])
    measured = float((chain_forward(chain0, x) - chain_forward(new_chain, x)).abs().max())
    assert 0.0 < measured <= bound + 1e-6 * max(bound, 1.0)
    assert rep.measured["max_output_deviation_box_float64"] <= bound + 1e-6 * max(bound, 1.0)


def test_mlp_defaults_are_the_measured_best(calib: Dataset) -> None:
    """On an MLP the defaults are the leader representative with the held-out-checked compensation (the best on
    average in benchmarks/fde_vs_pruning.json): the very network those options give when named."""
    torch.manual_seed(3)
    model = mlp(6, [40, 24], 3, "tanh").eval()
    data = Dataset(torch.rand(300, 6) * 2 - 1)
    auto, rep = compress(model, data, "fde", FDEConfig(param_ratio=0.5))
    named, _ = compress(model, data, "fde", FDEConfig(param_ratio=0.5, representative="leader", compensation=True))
    assert rep.predicted["representative"] == "leader" and rep.predicted["compensation_tried"] is True
    assert rep.config["compensation"] is True  # the report records what ran, not the unresolved default
    assert "compensation" in rep.predicted
    torch.testing.assert_close(auto(data.x), named(data.x), rtol=0, atol=0)
    _, classic = compress(model, data, "fde", FDEConfig(param_ratio=0.5, compensation=False))
    assert classic.predicted["compensation_tried"] is False and "compensation" not in classic.predicted


def test_leader_clusters_every_member_near_its_leader_no_chaining() -> None:
    line = np.array([[0.0], [0.6], [1.2], [1.8]])
    leader = leader_clusters(line, 1.0)
    assert np.abs(line - line[leader]).max() <= 1.0
    assert len(np.unique(leader)) == 2  # 0 and 1.2 are 1.2 apart: one block would need chaining
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (300, 5))
    leader = leader_clusters(x, 0.4)
    assert np.abs(x - x[leader]).max() <= 0.4
    leaders = np.unique(leader)
    d = np.abs(x[leaders][:, None] - x[leaders][None]).max(-1) + 2 * np.eye(len(leaders))
    assert (leader[leaders] == leaders).all() and d.min() > 0.0


def test_batchnorm_folded_before_merging(calib: Dataset) -> None:
    torch.manual_seed(17)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(),
                          nn.BatchNorm1d(8), nn.Linear(8, 2)).eval()
    with torch.no_grad():
        for bn in (model[1], model[5]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    x = torch.randn(50, 6)
    with torch.no_grad():
        ref = model(x).double()
    assert torch.allclose(chain_forward(extract_chain(model), x), ref, atol=1e-5)
    new, _ = compress(model, calib, "fde", FDEConfig(merge_eps=0.0, remove_dead=False))
    assert not any(isinstance(m, nn.BatchNorm1d) for m in new.modules())
    with torch.no_grad():
        assert torch.allclose(new(x).double(), ref, atol=1e-5)


def test_merged_network_is_plain_linear_stack_and_exports(tmp_path, calib: Dataset) -> None:
    from minreal.export.onnx_export import to_onnx
    from minreal.export.verify import verify_parity

    new, rep = compress(_planted_relu(), calib, "fde", FDEConfig(merge_eps=0.0, remove_dead=False))
    kinds = {type(m) for m in new.modules()} - {nn.Sequential}
    assert kinds == {nn.Flatten, nn.Linear, nn.ReLU}
    linears = [m for m in new.modules() if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears[:-1]] == rep.predicted["hidden_widths"]
    assert [lr.rank for lr in rep.layers[:-1]] == rep.predicted["hidden_widths"]
    path = tmp_path / "fde.onnx"
    to_onnx(new, calib.x[:2], path)
    res = verify_parity(new, path, [calib.x[:1], calib.x[:37]], rtol=1e-4, atol=1e-5)
    assert res.passed and res.max_abs_err <= 1e-5


def test_dead_neurons_removed_exactly_on_calibration_data(calib: Dataset) -> None:
    torch.manual_seed(19)
    model = mlp(6, [32, 16], 3).eval()
    with torch.no_grad():
        model[1].bias[:10] = -100.0  # never active on the data
    new, rep = compress(model, calib, "fde", FDEConfig(merge_eps=0.0))
    assert rep.layers[0].details["dead_removed"] == 10
    assert rep.predicted["hidden_widths"][0] == 22
    assert rep.predicted["dead_removed"] == sum(lr.details["dead_removed"] for lr in rep.layers[:-1])
    assert rep.measured["max_output_deviation_data_float64"] <= 1e-12


def test_build_sequential_roundtrip() -> None:
    torch.manual_seed(23)
    model = mlp(4, [8, 8], 2, "leaky_relu").eval()
    rebuilt = build_sequential(extract_chain(model))
    x = torch.randn(10, 4)
    with torch.no_grad():
        assert torch.allclose(rebuilt(x), model(x), atol=1e-6)


def test_label_recovery_after_merging_lowers_mse() -> None:
    torch.manual_seed(29)
    g = torch.Generator().manual_seed(29)
    x = torch.rand(300, 3, generator=g)
    data = Dataset(x, torch.sin(3 * x).sum(1, keepdim=True))
    model = mlp(3, [64], 1).eval()
    _, rep = compress(model, data, "fde", FDEConfig(merge_eps=0.5),
                      RecoveryConfig(epochs=10, lr=3e-3, alpha=1.0))
    assert rep.recovery is not None and rep.recovery["before"]["mse"] > rep.recovery["after"]["mse"]
    assert rep.measured["recovered"]["mse_compressed"] < rep.measured["mse_compressed"]


def _randomise_bn(model: nn.Module) -> None:
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.5)


def _cnn() -> nn.Sequential:
    """3×8×8 → conv 8 (BN, ReLU, MaxPool) → conv 10 (BN, ReLU, AvgPool) → Flatten(10·2·2) → 16 → ReLU → 4."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 10, 3, padding=1, bias=False), nn.BatchNorm2d(10), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Flatten(), nn.Linear(40, 16), nn.ReLU(), nn.Linear(16, 4))


def _planted_cnn() -> nn.Sequential:
    """Conv 1: channel 4 ≡ channel 1, channel 6 = 2.5·channel 2 after BN folding; conv 2: channel 7 ≡ channel 0."""
    torch.manual_seed(31)
    m = _cnn().eval()
    _randomise_bn(m)
    with torch.no_grad():
        c1, bn1, c2, bn2 = m[0], m[1], m[4], m[5]
        c1.weight[4], c1.bias[4] = c1.weight[1], c1.bias[1]
        c1.weight[6], c1.bias[6] = c1.weight[2], c1.bias[2]
        for p in (bn1.running_mean, bn1.running_var, bn1.weight, bn1.bias):
            p[4], p[6] = p[1], p[2]
        bn1.weight[6], bn1.bias[6] = 2.5 * bn1.weight[2], 2.5 * bn1.bias[2]  # s₆ = 2.5 s₂, t₆ = 2.5 t₂
        c2.weight[7] = c2.weight[0]
        for p in (bn2.running_mean, bn2.running_var, bn2.weight, bn2.bias):
            p[7] = p[0]
    return m


@pytest.fixture
def images() -> Dataset:
    g = torch.Generator().manual_seed(37)
    return Dataset(torch.randn(64, 3, 8, 8, generator=g))


def test_cnn_eps0_merges_exactly_the_planted_channels(images: Dataset) -> None:
    model = _planted_cnn()
    new, rep = compress(model, images, "fde", FDEConfig(merge_eps=0.0, remove_dead=False))
    assert rep.predicted["hidden_widths_before"] == [8, 10, 16]
    assert rep.predicted["hidden_widths"] == [6, 9, 16]
    assert rep.layers[0].details["merged_blocks"] == [[1, 4], [2, 6]]
    assert rep.layers[1].details["merged_blocks"] == [[0, 7]]
    assert rep.predicted["output_deviation_bound"] is None and any("MLP-only" in n for n in rep.notes)
    x = torch.randn(100, 3, 8, 8)
    with torch.no_grad():
        ref, out = model(x), new(x)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    # the scaled pair is equal only up to float32 rounding of 2.5·γ (ε = 0 means 4 units of roundoff)
    assert rep.measured["max_output_deviation_data_float64"] <= 1e-6
    assert rep.params_after == sum(p.numel() for p in new.parameters()) < rep.params_before


def test_cnn_no_duplicates_nothing_merged(images: Dataset) -> None:
    torch.manual_seed(41)
    model = small_cnn(3, (8, 12, 16), 5).eval()
    _randomise_bn(model)
    new, rep = compress(model, images, "fde", FDEConfig(merge_eps=0.0, remove_dead=False))
    assert rep.predicted["hidden_widths"] == [8, 12, 16]
    assert all(lr.action == "kept" for lr in rep.layers)
    with torch.no_grad():
        assert torch.allclose(new(images.x), model(images.x), rtol=1e-5, atol=1e-5)


def test_cnn_global_pool_head_sums_columns(images: Dataset) -> None:
    """After AdaptiveAvgPool2d(1) + Flatten the head's columns of a duplicate channel are summed."""
    torch.manual_seed(43)
    model = small_cnn(3, (8, 12, 16), 5).eval()
    _randomise_bn(model)
    with torch.no_grad():
        conv, bn = model[6], model[7]
        conv.weight[9] = conv.weight[3]
        for p in (bn.running_mean, bn.running_var, bn.weight, bn.bias):
            p[9] = p[3]
    new, rep = compress(model, images, "fde", FDEConfig(merge_eps=0.0, remove_dead=False))
    assert rep.predicted["hidden_widths"] == [8, 12, 15]
    assert new[-1].in_features == 15
    with torch.no_grad():
        assert torch.allclose(new(images.x), model(images.x), rtol=1e-5, atol=1e-5)


def test_cnn_dead_channels_removed_exactly(images: Dataset) -> None:
    torch.manual_seed(47)
    model = _cnn().eval()
    _randomise_bn(model)
    with torch.no_grad():
        model[1].bias[[0, 5]] = -100.0  # BN shift: never active after the ReLU
    new, rep = compress(model, images, "fde", FDEConfig(merge_eps=0.0))
    assert rep.layers[0].details["dead_removed"] == 2
    assert rep.predicted["hidden_widths"][0] == 6
    assert rep.measured["max_output_deviation_data_float64"] <= 1e-12


def test_merged_cnn_is_plain_and_exports(tmp_path, images: Dataset) -> None:
    from minreal.export.onnx_export import to_onnx
    from minreal.export.verify import verify_parity

    new, rep = compress(_planted_cnn(), images, "fde", FDEConfig(merge_eps=0.0, remove_dead=False))
    kinds = {type(m) for m in new.modules()} - {nn.Sequential}
    assert isinstance(new, nn.Sequential)  # BatchNorm stays, cut with its conv (the width core's surgery)
    assert kinds == {nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.Flatten, nn.Linear}
    layers = [m for m in new.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    widths = [m.out_channels if isinstance(m, nn.Conv2d) else m.out_features for m in layers[:-1]]
    assert widths == rep.predicted["hidden_widths"] == [lr.rank for lr in rep.layers]  # one per channel group
    path = tmp_path / "fde_cnn.onnx"
    to_onnx(new, images.x[:2], path)
    res = verify_parity(new, path, [images.x[:1], images.x[:37]], rtol=1e-4, atol=1e-5)
    assert res.passed and res.max_abs_err <= 1e-5
