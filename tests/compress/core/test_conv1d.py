"""transformers' Conv1D read as the nn.Linear it is: the probe's error bound in every float dtype, copies not views,
layers of that name computing something else left with the reason, a parent reading the weights itself caught on
the example, and factorize through such a model (full rank reproduces it; a budget is met)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.conv1d import conv1d_refusal, rewrite_conv1d, transposed_linears
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.lowrank import matrix_view
from minreal.compress.core.lowrank_plan import apply_factors, factorisable_model, find_targets
from minreal.compress.core.report import CompressionReport
from minreal.compress.methods.factorize import FactorizeConfig, layer_bases
from minreal.compress.methods.factorize.method import _factors
from minreal.compress.methods.svd import SVDConfig


class Conv1D(nn.Module):
    """transformers' Conv1D as GPT-2 uses it (its forward as in transformers.pytorch_utils): a Linear whose weight
    is stored in × out, ``y = x @ W + b``; biases non-zero, as after training."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) / nx**0.5)
        self.bias = nn.Parameter(torch.randn(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class ScaledConv1D(Conv1D):
    """A layer of the same name and weight layout that computes something else (2 x W x, no bias)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * (x @ self.weight)


class TrueConv1D(nn.Conv1d):
    """A real one-dimensional convolution of that name (a 3-D weight)."""


ScaledConv1D.__name__ = TrueConv1D.__name__ = "Conv1D"


class ReadsWeight(nn.Module):
    """A parent that reads its Conv1D's weight itself (a tied output head): the layer is square, so a rewrite to
    nn.Linear (weight transposed) still runs but computes something else."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = Conv1D(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) @ self.proj.weight


def _model(dtype: torch.dtype = torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(Conv1D(40, 48), nn.ReLU(), Conv1D(24, 40)).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_a_conv1d_with_a_bias_is_a_transposed_linear_in_every_float_dtype(dtype: torch.dtype) -> None:
    """transformers computes addmm(b, x, W), rounding once; the check's reference is float64 and its bound the
    inner product's (a fixed 1e-4 refused every half-precision GPT-2 layer with a bias)."""
    assert conv1d_refusal(_model(dtype)[0]) is None


def test_conv1d_layers_become_copies_computing_the_same_function_and_the_model_is_untouched() -> None:
    model = _model(torch.float64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    linears, left = transposed_linears(model)
    assert list(linears) == ["0", "2"] and left == {}
    x = torch.randn(4, 7, 48, dtype=torch.float64)
    for name, inputs in (("0", x), ("2", torch.relu(model[0](x)))):
        layer, linear = model.get_submodule(name), linears[name]
        assert isinstance(linear, nn.Linear) and linear.weight.shape == layer.weight.T.shape
        assert linear.weight.data_ptr() != layer.weight.data_ptr() and linear.bias.data_ptr() != layer.bias.data_ptr()
        with torch.no_grad():
            torch.testing.assert_close(linear(inputs), layer(inputs), rtol=1e-12, atol=1e-12)
    assert [type(m).__name__ for m in model] == ["Conv1D", "ReLU", "Conv1D"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_layers_of_that_name_computing_anything_else_are_left_with_the_reason() -> None:
    linears, left = transposed_linears(nn.Sequential(ScaledConv1D(8, 8), TrueConv1D(2, 4, 3)))
    assert linears == {}
    assert left == {"0": "on a probe input it does not compute x @ W + b with W stored in × out",
                    "1": "its weight is not a 2-D floating-point tensor"}


def test_a_parent_reading_the_weights_itself_keeps_its_conv1d_and_says_why() -> None:
    torch.manual_seed(0)
    model = ReadsWeight().eval()
    x = torch.randn(5, 6)
    kept, rewritten, left = rewrite_conv1d(model, x)
    assert kept is model and rewritten == []
    assert list(left) == ["proj"] and left["proj"].startswith("once its Conv1D layers are nn.Linear the model's "
                                                              "output 0 moves by")
    with pytest.raises(CompressionError, match=r"its 1 layer\(s\) named Conv1D \(proj\) were not read as a Linear: "
                                               r"once its Conv1D layers are nn\.Linear"):
        compress(model, Dataset(x), "svd", SVDConfig(mac_ratio=0.7))


def test_factorize_at_full_rank_reproduces_a_conv1d_model() -> None:
    """The rewrite and the factorisation together are exact at full rank (float64: the identity holds to 1e-10)."""
    model = _model(torch.float64)
    data = Dataset(torch.randn(64, 48, dtype=torch.float64))
    unfused = factorisable_model(model, data.x[:4])
    assert unfused.conv1d == ["0", "2"] and unfused.model is not model
    targets, _, _ = find_targets(unfused.model, data.x[:4])
    assert [t.name for t in targets] == ["0", "2"]
    bases = layer_bases(unfused.model, data, targets, FactorizeConfig(stats_dtype="float64"),
                        CompressionReport("factorize", {}))
    new = apply_factors(unfused.model, targets, _factors(targets, bases, {t.name: matrix_view(t.layer).max_rank
                                                                          for t in targets}))
    with torch.no_grad():
        torch.testing.assert_close(new(data.x), model(data.x), rtol=1e-10, atol=1e-10)


def test_factorize_meets_a_budget_on_conv1d_layers_and_says_so() -> None:
    model = _model()
    data = Dataset(torch.randn(64, 48))
    new, report = compress(model, data, "factorize", FactorizeConfig(mac_ratio=0.7, rank_multiple=1))
    assert not any(type(m).__name__ == "Conv1D" for m in new.modules())
    assert report.mac_ratio <= 0.7 + 1e-9
    assert any(n.startswith("2 Conv1D layer(s)") and n.endswith(": 0, 2") for n in report.notes)
    assert {lr.name for lr in report.layers} == {"0", "2"}


def test_a_model_of_conv1d_layers_none_of_them_a_linear_is_refused_naming_them() -> None:
    model = nn.Sequential(*[ScaledConv1D(8, 8) for _ in range(5)])
    with pytest.raises(CompressionError, match=r"its 5 layer\(s\) named Conv1D \(0, 1, 2 and 2 more\) were not read "
                                               r"as a Linear: on a probe input it does not compute x @ W \+ b"):
        compress(model, Dataset(torch.randn(16, 8)), "factorize", FactorizeConfig())
