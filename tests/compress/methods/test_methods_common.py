"""Checks every registered compression method must pass: output shape preserved, fewer parameters, finite
outputs, only plain module kinds in the result, and ONNX export with ORT parity at two batch sizes.

Parametrised over ``minreal.compress.method_names()``; each method's case (a tiny seeded model, data suited to it and a
small config) is its spec's ``smoke_case``, so a newly registered method is covered with no edit here, and one
without a ``smoke_case`` fails.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import fx, nn

import minreal.compress.registry as registry
from minreal.compress import MethodSpec, compress, get_method, method_names
from minreal.compress.core.data import Dataset
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.smoke import SmokeCase
from minreal.compress.methods.ssm import SSMClassifier
from minreal.compress.methods.ssm.classifier import SSMBlock
from minreal.compress.methods.ssm.layers import DenseSSM, DiagonalSSM, ModalSSM, RotationSSM, SchurSSM
from minreal.export.onnx_export import to_onnx
from minreal.export.verify import verify_parity

RTOL, ATOL = 1e-3, 1e-4
PARITY_BATCHES = (3, 7)

PLAIN_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardswish, nn.ELU,
    nn.Sequential, nn.Flatten, nn.Identity, nn.Dropout,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    RotationSSM, ModalSSM, DiagonalSSM, DenseSSM, SchurSSM, SSMBlock, SSMClassifier,
    nn.LayerNorm, nn.MultiheadAttention, nn.Module,
)
"""Module kinds a compressed model may contain (exact types, no subclasses): torch's plain layers, the project's own
small SSM layers and models, and what a surgery on the traced graph leaves (width and depth: a
:class:`torch.fx.GraphModule`, a class of its own per instance, whose layers hang under bare ``nn.Module``
containers)."""


@dataclass
class Compressed:
    """The original model, its data and the method's result."""

    original: nn.Module
    data: Dataset
    new: nn.Module
    case: SmokeCase


@pytest.fixture(scope="module")
def results() -> dict[str, Compressed]:
    """Compressed models, computed once per method for the whole module."""
    return {}


def _compress_case(spec: MethodSpec) -> Compressed:
    if spec.smoke_case is None:
        pytest.fail(f"registered method {spec.name!r} has no smoke_case in its MethodSpec; give it one (a tiny "
                    "seeded model, data suited to it and a small config: minreal.compress.core.smoke.SmokeCase)",
                    pytrace=False)
    case = spec.smoke_case()
    new, _ = compress(case.model, case.data, spec.name, case.config)
    return Compressed(case.model, case.data, new.eval(), case)


def _compressed(method: str, results: dict[str, Compressed]) -> Compressed:
    if method not in results:
        results[method] = _compress_case(get_method(method))
    return results[method]


def _numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


METHODS = method_names()


@pytest.mark.parametrize("method", METHODS)
def test_output_shape_preserved_and_finite(method: str, results: dict[str, Compressed]) -> None:
    _check_shape_and_finite(_compressed(method, results))


def _check_shape_and_finite(c: Compressed) -> None:
    with torch.no_grad():
        ref, out = c.original(c.data.x), c.new(c.data.x)
    assert out.shape == ref.shape
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("method", METHODS)
def test_fewer_parameters(method: str, results: dict[str, Compressed]) -> None:
    _check_fewer_parameters(_compressed(method, results))


def _check_fewer_parameters(c: Compressed) -> None:
    assert _numel(c.new) < _numel(c.original)


@pytest.mark.parametrize("method", METHODS)
def test_only_plain_modules(method: str, results: dict[str, Compressed]) -> None:
    _check_only_plain_modules(_compressed(method, results))


def _check_only_plain_modules(c: Compressed) -> None:
    odd = sorted({type(m).__name__ for m in c.new.modules()
                  if type(m) not in PLAIN_MODULES and not isinstance(m, fx.GraphModule)})
    assert not odd, f"left non-plain modules {odd}"


def _kind(m: nn.Module) -> type:
    """A module's class (fx.GraphModule for a traced result: each instance has a class of its own)."""
    return fx.GraphModule if isinstance(m, fx.GraphModule) else type(m)


@pytest.mark.parametrize("method", METHODS)
def test_exports_with_ort_parity(method: str, results: dict[str, Compressed], tmp_path: Path) -> None:
    _check_export_parity(_compressed(method, results), tmp_path / f"{method}.onnx")


def _check_export_parity(c: Compressed, path: Path) -> None:
    to_onnx(c.new, c.data.x[:2], path, dynamic_batch=True, dynamic_dims=c.case.dynamic_dims or None)
    inputs = [c.data.x[:n] for n in PARITY_BATCHES]
    parity = verify_parity(c.new, path, inputs, rtol=RTOL, atol=ATOL)
    assert parity.passed and parity.batch_sizes == list(PARITY_BATCHES)


@pytest.mark.parametrize("method", METHODS)
def test_recovery_keeps_structure_and_exports_with_ort_parity(method: str, results: dict[str, Compressed],
                                                               tmp_path: Path) -> None:
    """Recovery (a few distillation steps, features matched at the method's own state points) never changes the
    architecture: same module kinds in the same places, same state-dict shapes, ORT parity as before (the weights
    exported are the best ones: trained, or the zero-shot ones when no epoch beat them)."""
    zero = _compressed(method, results)
    new, report = compress(zero.original, zero.data, method, zero.case.config,
                           RecoveryConfig(steps=3, warmup=0.0, val_fraction=0.0, features=("auto",)))
    assert report.recovery is not None and report.recovery["steps"] == 3
    assert [(n, _kind(m)) for n, m in new.named_modules()] == [(n, _kind(m)) for n, m in zero.new.named_modules()]
    shapes = {k: v.shape for k, v in zero.new.state_dict().items()}
    assert {k: v.shape for k, v in new.state_dict().items()} == shapes
    _check_export_parity(Compressed(zero.original, zero.data, new.eval(), zero.case), tmp_path / f"{method}.onnx")


THROWAWAY = '''
from dataclasses import dataclass

import torch
from torch import nn

from minreal.compress.core.report import CompressionReport
from minreal.compress.core.smoke import SmokeCase, digits_mlp, digits_subset
from minreal.compress.core.spec import MethodSpec


@dataclass
class Config:
    """The throwaway method has no options."""


def run(model, data, config):
    """Replace the model by the least-squares linear map from its inputs to its outputs."""
    x = data.x.flatten(1)
    with torch.no_grad():
        y = model(data.x)
    sol = torch.linalg.lstsq(torch.cat([x, torch.ones(len(x), 1)], 1), y).solution
    new = nn.Sequential(nn.Flatten(), nn.Linear(x.shape[1], y.shape[1]))
    with torch.no_grad():
        new[1].weight.copy_(sol[:-1].T)
        new[1].bias.copy_(sol[-1])
    return new, CompressionReport("throwaway", {})


def smoke_case():
    return SmokeCase(digits_mlp(), digits_subset(), Config())


SPEC = MethodSpec("throwaway", "linear least-squares surrogate (test)", Config, run, smoke_case=smoke_case)
'''


class _EntryPoint:
    name, value = "throwaway", "minreal_throwaway_common:SPEC"

    def __init__(self, spec: MethodSpec) -> None:
        self.spec = spec

    def load(self) -> MethodSpec:
        return self.spec


def test_a_new_method_package_gets_every_shared_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A method package written outside the repository, registered through an entry point, runs every check
    above from its own ``smoke_case``: nothing in this file names it."""
    pkg = tmp_path / "minreal_throwaway_common"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(THROWAWAY)
    spec = importlib.util.spec_from_file_location(pkg.name, pkg / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, pkg.name, module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(registry, "entry_points", lambda *, group: [_EntryPoint(module.SPEC)])
    monkeypatch.setattr(registry, "_REGISTRY", registry.MethodRegistry())
    assert "throwaway" in method_names() and set(METHODS) < set(method_names())
    c = _compress_case(get_method("throwaway"))
    _check_shape_and_finite(c)
    _check_fewer_parameters(c)
    _check_only_plain_modules(c)
    _check_export_parity(c, tmp_path / "throwaway.onnx")
