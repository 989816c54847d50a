"""ONNX Runtime parity of width-cut models (minreal.compress.core.width): every model of the width tests' zoo, every
cuttable group cut by at least a quarter, exported with :func:`minreal.export.onnx_export.to_onnx` and checked with
:func:`minreal.export.verify.verify_parity` on two batch sizes.

Tolerance from float32 rounding: E = max |torch float32 − torch float64| of the cut model on the same inputs is
the forward rounding error of one float32 evaluation. ORT's kernels round differently (BatchNorm folded into
convolutions, fused activations, other GEMM blocking); we allow ORT's own error up to 7 E, so
|ORT − torch| ≤ |ORT − exact| + |torch − exact| ≤ 8 E, plus one rounding of the output (u·max|y|).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from minreal.compress.core.width import analyse, apply_cuts
from minreal.export.onnx_export import to_onnx
from minreal.export.verify import verify_parity

if "minreal_width_zoo" not in sys.modules:  # the width tests' model zoo, loaded by path (tests are no package)
    _spec = importlib.util.spec_from_file_location(
        "minreal_width_zoo", Path(__file__).resolve().parents[1] / "compress" / "core" / "width" / "zoo.py")
    sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_spec.name])

import minreal_width_zoo as zoo

MODELS = [pytest.param(name, marks=pytest.mark.slow) if name in zoo.BIG else name for name in zoo.MODELS]


@pytest.mark.parametrize("name", MODELS)
def test_cut_model_matches_onnx_runtime(name: str, tmp_path: Path) -> None:
    model, x = zoo.build(name), zoo.example(name)
    wg = analyse(model, x)
    cuts = zoo.cuts_of(wg)
    cut = apply_cuts(wg, cuts)
    assert all(len(c.keep) <= 0.75 * wg.group(g).size for g, c in cuts.items())
    assert zoo.parameter_count(cut) < zoo.parameter_count(model)
    exported = to_onnx(cut, x, tmp_path / f"{name}.onnx")
    inputs = [zoo.example(name, batch=1, seed=1), zoo.example(name, batch=3, seed=2)]
    with torch.no_grad():
        assert cut(inputs[1]).shape == model(inputs[1]).shape
        scale = max(float(cut(b).abs().max()) for b in inputs)
    atol = 8 * zoo.float32_error(cut, *inputs) + zoo.UNIT_ROUNDOFF * scale
    result = verify_parity(cut, exported.path, inputs, rtol=0.0, atol=atol)
    assert result.passed and result.batch_sizes == [1, 3]
