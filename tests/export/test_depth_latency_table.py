"""Depth latency tables (``minreal latency-table --kind depth``): one whole-model variant per residual block, reused
for the same model, and the budget ``depth --latency-ratio`` meets from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import minreal.export.latency_table as lt
from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.methods.depth import DepthConfig
from minreal.compress.models import CifarResNet


def _resnet() -> CifarResNet:
    torch.manual_seed(0)
    return CifarResNet(blocks_per_stage=2, in_channels=1).eval()


def test_depth_table_times_each_identity_block_and_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    model, x = _resnet(), torch.rand(4, 1, 8, 8)
    table = lt.build_depth_latency_table(model, x, "cpu", out_path=tmp_path / "t.json")
    assert table["kind"] == "depth" and table["batch"] == 4 and table["input_shape"] == [1, 8, 8]
    # every block, the option-A ones too (depth removes one whose branch is zero on the data)
    assert sorted(table["blocks"]) == ["layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1"]
    assert table["model_ms"] > 0 and all(b["ms"] > 0 for b in table["blocks"].values())
    assert all(b["saving_ms"] == pytest.approx(table["model_ms"] - b["ms"]) for b in table["blocks"].values())
    monkeypatch.setattr(lt, "_time_files", lambda *a, **k: pytest.fail("a reusable table was measured again"))
    assert lt.build_depth_latency_table(model, x, "cpu", out_path=tmp_path / "t.json") == table
    # the budget reads the savings (here made up: timings of a tiny model are noise) and the whole model's time
    table = {**table, "model_ms": 10.0, "blocks": {n: {"ms": 9.0, "saving_ms": 1.0} for n in table["blocks"]}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    data = Dataset(torch.rand(32, 1, 8, 8))
    cfg = DepthConfig(criterion="energy", latency_ratio=0.9, latency_table=str(tmp_path / "t.json"))
    _, report = compress(model, data, "depth", cfg)
    assert report.predicted["whole_model_latency_ratio"] == pytest.approx(0.9)  # one block of 1 ms in 10
    assert report.predicted["budget"] == {"kind": "latency_ratio", "requested": 0.9,
                                          "achieved": report.predicted["whole_model_latency_ratio"]}


class _SizeChecked(torch.nn.Module):
    """Two residual blocks behind a check of a size in Python: plain torch.fx keeps this module whole."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3, self.fc4 = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 8:
            raise ValueError("expects 8 features")
        x = x + self.fc2(torch.relu(self.fc1(x)))
        return x + self.fc4(torch.relu(self.fc3(x)))


def test_a_depth_table_finds_the_blocks_depth_finds_by_a_trace_carrying_values(tmp_path: Path) -> None:
    """Review: depth traces a model again carrying example values where plain torch.fx keeps whole the modules that
    hold every block; the depth table traced it plainly and found no block ("nothing for a depth latency table to
    time") where depth would remove some. It now finds the same blocks, and depth meets a latency budget from it."""
    from minreal.compress.methods.depth.method import depth_prepare

    torch.manual_seed(0)
    model = torch.nn.Sequential(_SizeChecked(), torch.nn.Linear(8, 4)).eval()
    data = Dataset(torch.randn(32, 8))
    table = lt.build_depth_latency_table(model, data.x[:4], "cpu", out_path=tmp_path / "t.json")
    prep = depth_prepare(model, data, DepthConfig(criterion="energy"))
    assert prep.traced_values and sorted(table["blocks"]) == sorted(b.name for b in prep.blocks)
    assert len(table["blocks"]) == 2
    table = {**table, "model_ms": 10.0, "blocks": {n: {"ms": 9.0, "saving_ms": 1.0} for n in table["blocks"]}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    cfg = DepthConfig(criterion="energy", latency_ratio=0.9, latency_table=str(tmp_path / "t.json"))
    _, report = compress(model, data, "depth", cfg)
    assert report.predicted["whole_model_latency_ratio"] == pytest.approx(0.9)


class _ValueGated(torch.nn.Module):
    """Residual blocks behind a branch on a tensor's values: kept whole even when traced carrying values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > -1e9:
            x = x + self.fc2(torch.relu(self.fc1(x)))
        return x


def test_a_depth_table_refusal_names_the_layers_traced_whole_as_depth_does() -> None:
    """Review: the table said only "has no residual block" where depth names the layer traced whole that holds the
    blocks; it now says what depth says."""
    from minreal.compress.core.errors import CompressionError

    model = torch.nn.Sequential(_ValueGated(), torch.nn.Linear(8, 4)).eval()
    with pytest.raises(CompressionError) as info:
        lt.build_depth_latency_table(model, torch.randn(4, 8), "cpu")
    assert str(info.value).startswith("a depth latency table: Sequential has no removable residual block")
    assert "(_ValueGated is traced as one layer, its residual sums inside it" in str(info.value)
