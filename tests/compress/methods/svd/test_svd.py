"""Plain truncated-SVD baseline: exactness at full rank, Eckart–Young tail, budgets and reporting."""

import math

import pytest
import torch
from torch import nn

from minreal.compress import compress, count_costs, method_names
from minreal.compress.core.data import Dataset
from minreal.compress.core.linalg import truncated_svd_factors
from minreal.compress.core.lowrank import build_pair, grouped_weight, matrix_view
from minreal.compress.methods.svd import SVDConfig


def _full_rank_pair(layer: nn.Module) -> nn.Sequential:
    w = grouped_weight(layer)
    r = matrix_view(layer).max_rank
    parts = [truncated_svd_factors(w[g], r)[:2] for g in range(w.shape[0])]
    return build_pair(layer, torch.stack([p[0] for p in parts]).float(), torch.stack([p[1] for p in parts]).float())


@pytest.mark.parametrize("layer, x", [
    (nn.Linear(12, 7), torch.randn(5, 3, 12)),
    (nn.Conv1d(4, 6, 3, stride=2, padding=1), torch.randn(2, 4, 11)),
    (nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2), torch.randn(2, 4, 9, 9)),
    (nn.Conv2d(8, 12, 3, padding=1, groups=4), torch.randn(2, 8, 7, 7)),
    (nn.Conv3d(2, 4, 2), torch.randn(1, 2, 4, 4, 4)),
])
def test_full_rank_pair_reproduces_layer(layer: nn.Module, x: torch.Tensor) -> None:
    pair = _full_rank_pair(layer)
    torch.testing.assert_close(pair(x), layer(x), rtol=1e-5, atol=1e-5)


def test_truncation_error_equals_tail_singular_values() -> None:
    w = torch.randn(20, 30, dtype=torch.float64)
    s = torch.linalg.svdvals(w)
    for r in (1, 5, 19):
        first, second, _ = truncated_svd_factors(w, r)
        err = torch.linalg.matrix_norm(w - second @ first)  # Frobenius
        assert math.isclose(float(err), float(s[r:].square().sum().sqrt()), rel_tol=1e-10)
        spectral = torch.linalg.matrix_norm(w - second @ first, ord=2)
        assert math.isclose(float(spectral), float(s[r]), rel_tol=1e-10)


def test_svd_registered() -> None:
    assert "svd" in method_names()


def test_svd_meets_flop_budget_and_reports(tiny_cnn: nn.Module, image_data: Dataset) -> None:
    model, report = compress(tiny_cnn, image_data, "svd", SVDConfig(layer_mac_ratio=0.5))
    assert report.predicted["factorizable_mac_ratio"] <= 0.5 + 1e-9
    costs = count_costs(model, image_data.x[:4])
    assert costs.macs == report.macs_after
    assert report.macs_after < report.macs_before
    assert model(image_data.x).shape == tiny_cnn(image_data.x).shape
    assert all(isinstance(m, (nn.Conv2d, nn.Linear, nn.BatchNorm2d, nn.ReLU, nn.Sequential, nn.Flatten,
                              nn.AdaptiveAvgPool2d)) for m in model.modules())
    assert "1" in report.not_counted  # BatchNorm has parameters but no MAC rule


def test_params_budget(tiny_mlp: nn.Module, mlp_data: Dataset) -> None:
    model, report = compress(tiny_mlp, mlp_data, "svd", SVDConfig(layer_param_ratio=0.6))
    assert report.predicted["factorizable_param_ratio"] <= 0.6 + 1e-9
    assert sum(p.numel() for p in model.parameters()) == report.params_after


def test_full_fraction_keeps_every_layer(tiny_cnn: nn.Module, image_data: Dataset) -> None:
    model, report = compress(tiny_cnn, image_data, "svd", SVDConfig(rank_fraction=1.0))
    assert {lr.action for lr in report.layers} <= {"kept", "skipped"}
    torch.testing.assert_close(model(image_data.x), tiny_cnn(image_data.x))


def test_depthwise_skipped_with_reason(grouped_cnn: nn.Module, image_data: Dataset) -> None:
    _, report = compress(grouped_cnn, image_data, "svd", SVDConfig(layer_mac_ratio=0.7))
    depthwise = next(lr for lr in report.layers if lr.name == "5")
    assert depthwise.action == "skipped" and "depthwise" in depthwise.reason


def test_layer_kept_when_factorising_does_not_pay() -> None:
    square = nn.Sequential(nn.Linear(4, 4))
    _, report = compress(square, Dataset(torch.randn(8, 4)), "svd", SVDConfig(rank_fraction=0.9))
    assert report.layers[0].action == "kept"


def test_conflicting_budgets_rejected(tiny_mlp: nn.Module, mlp_data: Dataset) -> None:
    with pytest.raises(ValueError, match="only one of"):
        compress(tiny_mlp, mlp_data, "svd", SVDConfig(layer_mac_ratio=0.5, layer_param_ratio=0.5))
    with pytest.raises(ValueError, match="--layer-mac-ratio"):
        compress(tiny_mlp, mlp_data, "svd", SVDConfig(layer_mac_ratio=1.5))


def test_multihead_out_proj_skipped() -> None:
    """An attention layer that cannot be unfused exactly (add_bias_kv) keeps its out_proj, read by the parent."""
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(16, 2, batch_first=True, add_bias_kv=True)
            self.head = nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.mha(x, x, x, need_weights=False)[0]).mean(1)

    _, report = compress(Attn().eval(), Dataset(torch.randn(4, 5, 16)), "svd", SVDConfig(layer_mac_ratio=0.5))
    skipped = {lr.name: lr.reason for lr in report.layers if lr.action == "skipped"}
    assert "mha.out_proj" in skipped and "MultiheadAttention" in skipped["mha.out_proj"]
    assert any("'mha' left fused" in n and "add_bias_kv" in n for n in report.notes)
