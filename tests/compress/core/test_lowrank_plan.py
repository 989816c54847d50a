"""Low-rank planning: whole-model targets (never a minimum above 1), unreachable factorisable-layer budgets naming
their flag, and the latency ratio a latency table predicts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.allocate import options_from_spectrum
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.lowrank_plan import find_targets, layer_target, predicted_latency_ratio
from minreal.compress.methods.svd import SVDConfig


def _options(keeps: list[float]) -> list:
    sq = np.array([4.0, 2.0, 1.0, 0.5])
    return [options_from_spectrum(f"l{i}", sq, lambda r, k=k: k * r / 8, keep_cost=k) for i, k in enumerate(keeps)]


def test_layers_summing_past_the_whole_never_give_a_minimum_above_1(caplog: pytest.LogCaptureFixture) -> None:
    options = _options([3.0, 2.0])  # 5 ms of layers measured one at a time, 2 ms for the whole model
    with caplog.at_level(logging.WARNING, logger="minreal.compress.core.lowrank_plan"):
        assert layer_target(options, 2.0, 1.0, "--latency-ratio") == pytest.approx(5.0)
    assert "more than the whole model" in caplog.text and "--latency-ratio" in caplog.text
    with pytest.raises(CompressionError) as err:
        layer_target(options, 2.0, 0.01, "--latency-ratio")
    smallest = float(str(err.value).split("can reach is ")[1].split()[0])
    assert 0.0 < smallest <= 1.0


def test_predicted_latency_ratio_counts_the_rest_unchanged() -> None:
    options = _options([3.0, 2.0])
    assert predicted_latency_ratio(options, {"l0": -1, "l1": -1}, 10.0) == pytest.approx(1.0)
    halved = predicted_latency_ratio(options, {"l0": 4, "l1": 4}, 10.0)  # each layer at half its keep cost
    assert halved == pytest.approx((5.0 + 2.5) / 10.0)


def _latency_table(model: nn.Module, data: Dataset, path: Path) -> None:
    targets, _, _ = find_targets(model, data.x[:8], ())
    layers = {t.name: {"keep_ms": 1.0, "ranks": [1, 64], "ms": [0.1, 2.0]} for t in targets}
    path.write_text(json.dumps({"provider": "cpu", "model_ms": 4.0, "layers": layers}))


def test_latency_budget_reports_the_achieved_ratio(tiny_mlp: nn.Module, mlp_data: Dataset, tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    _latency_table(tiny_mlp, mlp_data, path)
    _, report = compress(tiny_mlp, mlp_data, "svd", SVDConfig(latency_ratio=0.9, latency_table=str(path),
                                                                rank_multiple=1))
    budget = report.predicted["budget"]
    assert budget["kind"] == "latency_ratio" and budget["achieved"] is not None
    assert budget["achieved"] == report.predicted["whole_model_latency_ratio"] <= 0.9 + 1e-9


@pytest.mark.parametrize("given, flag", [({"layer_mac_ratio": 0.01}, "--layer-mac-ratio 0.01"),
                                         ({"layer_param_ratio": 0.01}, "--layer-param-ratio 0.01")])
def test_unreachable_layer_budget_names_its_flag(tiny_mlp: nn.Module, mlp_data: Dataset, given: dict,
                                                  flag: str) -> None:
    with pytest.raises(CompressionError, match=f"^{flag} cannot be reached") as err:
        compress(tiny_mlp, mlp_data, "svd", SVDConfig(rank_multiple=1, **given))
    assert "rank-multiple" not in str(err.value)
    with pytest.raises(CompressionError, match="--rank-multiple 16") as err:
        compress(tiny_mlp, mlp_data, "svd", SVDConfig(rank_multiple=16, **given))
    assert str(err.value).startswith(f"{flag} cannot be reached")


@pytest.mark.parametrize("method", ["svd", "factorize"])
def test_a_torch_export_program_is_refused_as_such_not_as_a_model_without_layers(method: str) -> None:
    """A .pt2 program's layers are ATen calls on weight tensors: the rank methods said "model has no Linear/Conv
    layer that can be factorised" of a model with two Linears; they name the program now, as the width methods do."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (torch.randn(2, 16),), dynamic_shapes=({0: batch},)).module()
    for switch in ("train", "eval"):  # as the CLI loads a .pt2: the flag cannot change the graph
        program.__dict__.pop(switch, None)
    with pytest.raises(CompressionError, match=r"^rank methods need the model's Python modules .*: a torch.export "
                                               r"program \(.pt2\) holds ATen operations, whose layers cannot be split"):
        compress(program, Dataset(torch.randn(32, 16)), method)
