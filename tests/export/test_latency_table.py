"""Per-layer latency tables and the factorize latency budget that reads them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from minreal.app.cli import cli
from minreal.compress import CompressionError, compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.lowrank import matrix_view
from minreal.compress.core.lowrank_plan import find_targets
from minreal.compress.methods.factorize import FactorizeConfig
from minreal.export.latency_table import build_latency_table, rank_grid

FACTORY = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
"""


def _target_names(model: nn.Module, x: torch.Tensor) -> set[str]:
    return {t.name for t in find_targets(model, x[:1])[0]}


@pytest.mark.parametrize("which", ["mlp", "cnn"])
def test_table_has_every_target_with_increasing_grid(which: str, tiny_mlp: nn.Module, tiny_cnn: nn.Module,
                                                     tmp_path: Path) -> None:
    model, x = (tiny_mlp, torch.randn(2, 12)) if which == "mlp" else (tiny_cnn, torch.randn(2, 3, 12, 12))
    out = tmp_path / "table.json"
    table = build_latency_table(model, x, "cpu", ranks_per_layer=4, out_path=out, threads=1)
    assert set(table["layers"]) == _target_names(model, x)
    modules = dict(model.named_modules())
    for name, entry in table["layers"].items():
        ranks = entry["ranks"]
        assert ranks == sorted(set(ranks)) and ranks[0] == 1
        assert ranks[-1] == matrix_view(modules[name]).max_rank
        assert len(entry["ms"]) == len(ranks)
        assert entry["keep_ms"] > 0 and min(entry["ms"]) > 0
    assert json.loads(out.read_text()) == table
    assert table["provider"] == "cpu"


def test_table_is_reused_for_same_model(tiny_mlp: nn.Module, tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    x = torch.randn(2, 12)
    first = build_latency_table(tiny_mlp, x, ranks_per_layer=3, out_path=out, threads=1)
    stamp = out.stat().st_mtime_ns
    assert build_latency_table(tiny_mlp, x, ranks_per_layer=3, out_path=out, threads=1) == first
    assert out.stat().st_mtime_ns == stamp


def test_rank_grid_respects_multiple() -> None:
    assert rank_grid(16, 6) == [1, 2, 3, 5, 9, 16]
    assert all(r % 4 == 0 for r in rank_grid(32, 6, 4))
    assert rank_grid(2, 6) == [1, 2]


def _synthetic_table(model: nn.Module, x: torch.Tensor, path: Path) -> dict:
    """Keep costs 1 ms per layer; the pair costs 0.1 ms at rank 1 rising linearly to 1.5 ms at full rank."""
    layers = {}
    for t in find_targets(model, x[:1])[0]:
        top = matrix_view(t.layer).max_rank
        layers[t.name] = {"keep_ms": 1.0, "ranks": [1, top], "ms": [0.1, 1.5]}
    table = {"provider": "cpu", "layers": layers}
    path.write_text(json.dumps(table))
    return table


def _table_ms(entry: dict, rank: int | None) -> float:
    return entry["keep_ms"] if rank is None else float(np.interp(rank, entry["ranks"], entry["ms"]))


def test_factorize_meets_latency_budget_of_table(tiny_cnn: nn.Module, image_data: Dataset, tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    table = _synthetic_table(tiny_cnn, image_data.x, path)
    new, report = compress(tiny_cnn, image_data, "factorize",
                           FactorizeConfig(layer_latency_ratio=0.6, latency_table=str(path)))
    rows = {lr.name: lr for lr in report.layers if lr.name in table["layers"]}
    assert set(rows) == set(table["layers"])
    assert any(lr.action == "factorized" for lr in rows.values())
    predicted = sum(_table_ms(table["layers"][n], lr.rank if lr.action == "factorized" else None)
                    for n, lr in rows.items())
    keep = sum(e["keep_ms"] for e in table["layers"].values())
    assert predicted <= 0.6 * keep + 1e-9
    assert report.predicted["factorizable_table_latency_ratio"] == pytest.approx(predicted / keep)
    assert torch.isfinite(new(image_data.x[:4])).all()


def test_latency_without_table_names_the_option(tiny_mlp: nn.Module, mlp_data: Dataset) -> None:
    with pytest.raises(CompressionError, match="--latency-table"):
        compress(tiny_mlp, mlp_data, "factorize", FactorizeConfig(layer_latency_ratio=0.5))


def test_latency_and_flops_together_rejected(tiny_mlp: nn.Module, mlp_data: Dataset, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    _synthetic_table(tiny_mlp, mlp_data.x, path)
    with pytest.raises(CompressionError, match="only one of"):
        compress(tiny_mlp, mlp_data, "factorize", FactorizeConfig(layer_latency_ratio=0.5, layer_mac_ratio=0.5,
                                                                  latency_table=str(path)))


def test_table_missing_a_layer_is_an_error(tiny_mlp: nn.Module, mlp_data: Dataset, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    table = _synthetic_table(tiny_mlp, mlp_data.x, path)
    table["layers"].pop(next(iter(table["layers"])))
    path.write_text(json.dumps(table))
    with pytest.raises(CompressionError, match="latency-table"):
        compress(tiny_mlp, mlp_data, "factorize", FactorizeConfig(layer_latency_ratio=0.5, latency_table=str(path)))


def test_cli_latency_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "net.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["latency-table", "net.py:make", "--input-shape", "12", "--out", "t.json",
                                      "--ranks-per-layer", "3", "-q"])
    assert result.exit_code == 0, result.output
    table = json.loads((tmp_path / "t.json").read_text())
    assert set(table["layers"]) == {"0", "2"}
