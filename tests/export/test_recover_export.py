"""A model recovered by distillation (minreal.compress.core.recover) keeps its architecture and exports with ORT
parity."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.smoke import digits_mlp, digits_subset
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.methods.svd import SVDConfig
from minreal.export.onnx_export import to_onnx
from minreal.export.verify import verify_parity


def test_recovered_svd_model_exports_with_parity(tmp_path: Path) -> None:
    teacher = digits_mlp()
    train(teacher, digits_subset(600), None, TrainConfig(epochs=4))
    data = Dataset(digits_subset(256).x)
    cfg = SVDConfig(mac_ratio=0.3, rank_multiple=1)
    zero_shot, _ = compress(teacher, data, "svd", cfg)
    small, report = compress(teacher, data, "svd", cfg, RecoveryConfig(epochs=2, alpha=0.0))
    assert report.recovery is not None and report.recovery["steps"] == 8
    assert [type(m) for m in small.modules()] == [type(m) for m in zero_shot.modules()]  # structure preserved
    assert any(not torch.equal(a, b) for a, b in zip(small.state_dict().values(), zero_shot.state_dict().values()))
    result = to_onnx(small, data.x[:2], tmp_path / "recovered.onnx")
    parity = verify_parity(small, result.path, [data.x[:1], data.x[:7]])
    assert parity.passed and parity.batch_sizes == [1, 7]
    assert parity.top1_agreement == {1: 1.0, 7: 1.0}


def test_recovery_on_a_model_the_method_returns_unchanged_trains_a_copy() -> None:
    """A method may hand back the model itself; recovery must never train the original."""
    from minreal.compress.core.report import CompressionReport
    from minreal.compress.registry import apply_recovery

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3)).eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    report = CompressionReport("none", {})
    out = apply_recovery(report, net, net, Dataset(torch.randn(32, 4)), RecoveryConfig(epochs=1))
    assert out is not net and all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    assert report.recovery is not None and "recovered" in report.measured
