"""Checks every registered compression method must pass: output shape preserved, fewer parameters, finite
outputs, only plain module kinds in the result, and ONNX export with ORT parity at two batch sizes.

Parametrised over ``compress.method_names()``: a newly registered method is covered automatically, and one
without an entry in :data:`CASES` fails (add a tiny seeded model, data and a small config there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

from compress import compress, method_names
from compress.core.data import Dataset
from compress.datasets import digits
from compress.methods.cbalanced import CBalancedConfig
from compress.methods.factorize import FactorizeConfig
from compress.methods.fde import FDEConfig
from compress.methods.magnitude import MagnitudeConfig
from compress.methods.wanda import WandaConfig
from compress.methods.ssm import SSMConfig
from compress.methods.svd import SVDConfig
from compress.models import mlp
from compress.methods.ssm import SSMClassifier
from compress.methods.ssm.layers import DenseSSM, DiagonalSSM, ModalSSM, RotationSSM, SchurSSM
from compress.methods.ssm.classifier import SSMBlock
from export.onnx_export import to_onnx
from export.verify import verify_parity

RTOL, ATOL = 1e-3, 1e-4
PARITY_BATCHES = (3, 7)

PLAIN_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardswish, nn.ELU,
    nn.Sequential, nn.Flatten, nn.Identity, nn.Dropout,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    RotationSSM, ModalSSM, DiagonalSSM, DenseSSM, SchurSSM, SSMBlock, SSMClassifier,
)
"""Module kinds a compressed model may contain (exact types, no subclasses): torch's plain layers and the
project's own small SSM layers and models."""


def _digits_subset(n: int = 240) -> Dataset:
    train, _ = digits(seed=0, as_images=False)
    return train.take(n)


def _digits_mlp() -> nn.Module:
    torch.manual_seed(10)
    return mlp(64, [48, 32], 10).eval()


def _duplicated_mlp() -> nn.Module:
    """64 → 48 → 10 ReLU MLP whose hidden layer is a 24-neuron layer with every neuron doubled (second copy
    perturbed by 1e-3, outgoing weights split), so ε-merging halves it with a tiny output change."""
    torch.manual_seed(11)
    base = mlp(64, [24], 10).eval()
    model = mlp(64, [48], 10).eval()
    g = torch.Generator().manual_seed(12)
    with torch.no_grad():
        w, b = base[1].weight, base[1].bias
        model[1].weight.copy_(torch.cat([w, w + 1e-3 * torch.randn(w.shape, generator=g)]))
        model[1].bias.copy_(torch.cat([b, b]))
        model[3].weight.copy_(torch.cat([base[3].weight, base[3].weight], 1) / 2)
        model[3].bias.copy_(base[3].bias)
    return model


def _ssm_model() -> nn.Module:
    torch.manual_seed(13)
    return SSMClassifier(2, 6, 8, 1, 3).eval()


def _ssm_data() -> Dataset:
    g = torch.Generator().manual_seed(14)
    return Dataset(torch.randn(24, 16, 2, generator=g), torch.randint(0, 3, (24,), generator=g))


@dataclass(frozen=True)
class Case:
    """A tiny seeded model, data suited to the method, a small config, and extra dynamic ONNX input axes."""

    model: Callable[[], nn.Module]
    data: Callable[[], Dataset]
    config: Any
    dynamic_dims: dict[int, str] = field(default_factory=dict)


CASES: dict[str, Case] = {
    "svd": Case(_digits_mlp, _digits_subset, SVDConfig(params=0.5)),
    "factorize": Case(_digits_mlp, _digits_subset, FactorizeConfig(params=0.5)),
    "magnitude": Case(_digits_mlp, _digits_subset, MagnitudeConfig(params=0.5)),
    "wanda": Case(_digits_mlp, _digits_subset, WandaConfig(params=0.5)),
    "fde": Case(_duplicated_mlp, _digits_subset, FDEConfig(eps=0.05)),
    "cbalanced": Case(_digits_mlp, _digits_subset,
                      CBalancedConfig(eps=1e-2, epochs=2, controls=False, val_fraction=0.2, calib_samples=200,
                                      go_samples=100)),
    "ssm": Case(_ssm_model, _ssm_data, SSMConfig(trunc=0.5, calib_samples=16), {1: "seq"}),
}


@dataclass
class Compressed:
    """The original model, its data and the method's result."""

    original: nn.Module
    data: Dataset
    new: nn.Module
    case: Case


@pytest.fixture(scope="module")
def results() -> dict[str, Compressed]:
    """Compressed models, computed once per method for the whole module."""
    return {}


def _compressed(method: str, results: dict[str, Compressed]) -> Compressed:
    if method not in CASES:
        pytest.fail(f"registered method {method!r} has no entry in CASES of tests/compress/test_methods_common.py; "
                    "add one (a tiny seeded model, data suited to it and a small config)", pytrace=False)
    if method not in results:
        case = CASES[method]
        original, data = case.model(), case.data()
        new, _ = compress(original, data, method, case.config)
        results[method] = Compressed(original, data, new.eval(), case)
    return results[method]


def _numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


METHODS = method_names()


def test_every_case_names_a_registered_method() -> None:
    stale = sorted(set(CASES) - set(METHODS))
    assert not stale, f"CASES has entries for unregistered methods {stale}; remove them"


@pytest.mark.parametrize("method", METHODS)
def test_output_shape_preserved_and_finite(method: str, results: dict[str, Compressed]) -> None:
    c = _compressed(method, results)
    with torch.no_grad():
        ref, out = c.original(c.data.x), c.new(c.data.x)
    assert out.shape == ref.shape
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("method", METHODS)
def test_fewer_parameters(method: str, results: dict[str, Compressed]) -> None:
    c = _compressed(method, results)
    assert _numel(c.new) < _numel(c.original)


@pytest.mark.parametrize("method", METHODS)
def test_only_plain_modules(method: str, results: dict[str, Compressed]) -> None:
    c = _compressed(method, results)
    odd = sorted({type(m).__name__ for m in c.new.modules() if type(m) not in PLAIN_MODULES})
    assert not odd, f"{method} left non-plain modules {odd}"


@pytest.mark.parametrize("method", METHODS)
def test_exports_with_ort_parity(method: str, results: dict[str, Compressed], tmp_path: Path) -> None:
    c = _compressed(method, results)
    path = tmp_path / f"{method}.onnx"
    to_onnx(c.new, c.data.x[:2], path, dynamic_batch=True, dynamic_dims=c.case.dynamic_dims or None)
    inputs = [c.data.x[:n] for n in PARITY_BATCHES]
    parity = verify_parity(c.new, path, inputs, rtol=RTOL, atol=ATOL)
    assert parity.passed and parity.batch_sizes == list(PARITY_BATCHES)
