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
from minreal.compress.core.lowrank_plan import find_targets, layer_target, predicted_latency_ratio, transposed_linears
from minreal.compress.methods.factorize import FactorizeConfig
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


class Conv1D(nn.Module):
    """transformers' Conv1D as GPT-2 uses it (its forward as in transformers.pytorch_utils): a Linear whose weight
    is stored in × out (y = x @ W + b)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf))
        self.bias = nn.Parameter(torch.randn(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class ScaledConv1D(Conv1D):
    """A layer of the same name and weight layout that computes something else (2 x W x, no bias)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * (x @ self.weight)


ScaledConv1D.__name__ = "Conv1D"


def test_conv1d_layers_become_the_linears_they_are_and_the_model_is_untouched() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Conv1D(8, 12), nn.ReLU(), Conv1D(5, 8))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    linears = transposed_linears(model)
    assert sorted(linears) == ["0", "2"]
    x = torch.randn(4, 7, 12)
    for name, linear in linears.items():
        layer = model.get_submodule(name)
        assert isinstance(linear, nn.Linear) and linear.weight.shape == layer.weight.T.shape
        inputs = x if name == "0" else torch.relu(model[0](x))
        with torch.no_grad():
            torch.testing.assert_close(linear(inputs), layer(inputs), rtol=1e-5, atol=1e-5)
    assert all(type(m).__name__ != "Linear" for m in model)  # the layers themselves are not replaced
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert transposed_linears(nn.Sequential(ScaledConv1D(5, 8))) == {}


def test_factorize_compresses_a_model_of_conv1d_layers_and_says_so() -> None:
    """GPT-2's projections are transformers' Conv1D: factorize reads them as the Linears they are, meets the budget
    and writes plain nn.Linear pairs (the zoo's hf:gpt2 was refused before)."""
    torch.manual_seed(0)
    model = nn.Sequential(Conv1D(64, 48), nn.ReLU(), Conv1D(32, 64)).eval()
    data = Dataset(torch.randn(64, 48))
    new, report = compress(model, data, "factorize", FactorizeConfig(mac_ratio=0.7, rank_multiple=1))
    assert not any(type(m).__name__ == "Conv1D" for m in new.modules())
    assert report.mac_ratio <= 0.7 + 1e-9
    assert any(n.startswith("2 Conv1D layer(s)") and n.endswith(": 0, 2") for n in report.notes)
    assert {lr.name for lr in report.layers} == {"0", "2"}
    with torch.no_grad():
        assert new(data.x).shape == model(data.x).shape


def test_a_layer_named_conv1d_that_computes_something_else_is_refused_by_name() -> None:
    model = nn.Sequential(ScaledConv1D(8, 12), nn.ReLU(), ScaledConv1D(5, 8))
    data = Dataset(torch.randn(16, 12))
    with pytest.raises(CompressionError, match=r"it has 2 layer\(s\) named Conv1D that do not compute x @ W \+ b"):
        compress(model, data, "factorize", FactorizeConfig())
