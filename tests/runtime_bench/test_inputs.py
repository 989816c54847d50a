"""Timing inputs: from data (tiled) or random with the batch dimension set; shape errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from minreal.runtime_bench.errors import BenchInputError, ModelFileError
from minreal.runtime_bench.inputs import input_specs, timing_inputs


def test_specs_read_from_onnx(reference_model: Path, features) -> None:
    (spec,) = input_specs(reference_model)
    assert (spec.name, spec.dtype, spec.shape) == ("x", "float32", ("N", features))
    assert spec.fixed_batch() is None


def test_random_inputs_take_batch_size(reference_model: Path, features) -> None:
    feeds = timing_inputs(input_specs(reference_model), 5, None, seed=0, model="m")
    assert feeds["x"].shape == (5, features) and feeds["x"].dtype == np.float32
    again = timing_inputs(input_specs(reference_model), 5, None, seed=0, model="m")
    np.testing.assert_array_equal(feeds["x"], again["x"])


def test_data_rows_are_tiled_and_cast(reference_model: Path, features) -> None:
    x = np.arange(3 * features, dtype=np.float64).reshape(3, features)
    feeds = timing_inputs(input_specs(reference_model), 7, x, seed=0, model="m")
    assert feeds["x"].dtype == np.float32
    np.testing.assert_array_equal(feeds["x"], np.concatenate([x, x, x])[:7].astype(np.float32))
    first_two = timing_inputs(input_specs(reference_model), 2, x, seed=0, model="m")
    np.testing.assert_array_equal(first_two["x"], x[:2].astype(np.float32))


def test_symbolic_feature_dim_needs_data(tmp_path: Path, weights, features, make_linear) -> None:
    path = make_linear(tmp_path / "sym.onnx", *weights, rest="F")
    with pytest.raises(BenchInputError, match="symbolic dims.*pass data x"):
        timing_inputs(input_specs(path), 2, None, seed=0, model="sym")
    feeds = timing_inputs(input_specs(path), 2, np.ones((1, features)), seed=0, model="sym")
    assert feeds["x"].shape == (2, features)


def test_fixed_batch_mismatch_names_model(tmp_path: Path, weights, features, make_linear) -> None:
    path = make_linear(tmp_path / "fixed.onnx", *weights, batch=1)
    assert timing_inputs(input_specs(path), 1, None, seed=0, model="fixed")["x"].shape == (1, features)
    with pytest.raises(BenchInputError, match="'fixed'.*fixed batch size 1; cannot run batch 4"):
        timing_inputs(input_specs(path), 4, None, seed=0, model="fixed")


def test_wrong_feature_count_is_an_error(reference_model: Path, features) -> None:
    with pytest.raises(BenchInputError, match="do not fit model 'm'"):
        timing_inputs(input_specs(reference_model), 1, np.ones((2, features + 1)), seed=0, model="m")


def test_missing_and_corrupt_files(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="model file not found: .*absent.onnx$"):
        input_specs(tmp_path / "absent.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ModelFileError, match="cannot read ONNX model .*bad.onnx"):
        input_specs(bad)


@pytest.mark.parametrize("elem_type", [0, 99])
def test_an_input_of_no_onnx_type_is_refused_naming_the_file(tmp_path: Path, elem_type: int) -> None:
    """Element type 0 (UNDEFINED) or a number no ONNX type has, as a flipped bit leaves it (benchmarks/fuzz.py): one
    line naming the file and the input, not onnx's bare ``KeyError: 0``."""
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    x.type.tensor_type.elem_type = elem_type
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    path = tmp_path / "flipped.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(BenchInputError, match=rf"flipped\.onnx: input 'x' has element type {elem_type}"):
        input_specs(path)
