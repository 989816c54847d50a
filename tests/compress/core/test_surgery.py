"""Module surgery: nested replacement names are refused, and a model that is one layer is replaced as a whole."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.lowrank import matrix_view
from minreal.compress.core.lowrank_plan import apply_factors, find_targets
from minreal.compress.core.report import CompressionReport
from minreal.compress.core.surgery import replace_modules
from minreal.compress.methods.factorize import FactorizeConfig, layer_bases
from minreal.compress.methods.factorize.method import _factors


@pytest.mark.parametrize("order", [("0", "0.1"), ("0.1", "0")])
@pytest.mark.parametrize("inplace", [False, True])
def test_nested_names_are_refused_and_leave_the_replacements_alone(order: tuple[str, str], inplace: bool) -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear(2, 2))
    outer = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    new = {"0": outer, "0.1": nn.Tanh()}
    with pytest.raises(ValueError, match="'0' and '0.1' nest"):
        replace_modules(model, {name: new[name] for name in order}, inplace=inplace)
    assert [type(m) for m in outer] == [nn.Linear, nn.Linear] and isinstance(model[0][1], nn.ReLU)


def test_the_root_name_replaces_the_model_itself() -> None:
    layer, new = nn.Linear(3, 3), nn.Sequential(nn.Linear(3, 1), nn.Linear(1, 3))
    out = replace_modules(layer, {"": new})
    assert out is new and list(new._modules) == ["0", "1"]  # no child named "" (a cycle when it is itself)
    with pytest.raises(ValueError, match="'' and '1' nest"):
        replace_modules(new, {"": nn.Identity(), "1": nn.Identity()})


def test_a_model_that_is_one_linear_factorises_at_full_rank_to_itself() -> None:
    torch.manual_seed(7)
    model = nn.Linear(10, 8).double().eval()
    data = Dataset(torch.randn(50, 10, dtype=torch.float64))
    targets, _, _ = find_targets(model, data.x[:4])
    assert [t.name for t in targets] == [""]
    bases = layer_bases(model, data, targets, FactorizeConfig(stats_dtype="float64"),
                        CompressionReport("factorize", {}))
    full = {"": matrix_view(model).max_rank}
    new = apply_factors(model, targets, _factors(targets, bases, full))
    assert isinstance(new, nn.Sequential) and new is not model
    assert torch.allclose(new(data.x), model(data.x), rtol=0, atol=1e-10)  # W = (W U) Uᵀ with U orthogonal
