"""Tests for minreal.export.qdq_pads: constant zero pads of a QDQ graph moved onto the quantised tensors, exactly."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from minreal.export.qdq_pads import integer_pads

_PADS = np.array([0, 2, 0, 0, 0, 1, 0, 0], np.int64)  # two zero channels before, one after (option A)


def _qdq_pad(zero_point: int = 3, out_scale: float = 0.5, value: float | None = None, mode: str = "constant",
             extra_reader: bool = False) -> onnx.ModelProto:
    """x (float) → Q → DQ → Pad → Q → DQ → y, scale 0.5 and ``zero_point`` around the pad (``out_scale`` after
    it); ``extra_reader``: the dequantised tensor is a graph output too."""
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             numpy_helper.from_array(np.array(zero_point, np.uint8), "z"),
             numpy_helper.from_array(np.array(out_scale, np.float32), "s2"),
             numpy_helper.from_array(_PADS, "pads")]
    pad_inputs = ["xd", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "value"))
        pad_inputs.append("value")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"),
             helper.make_node("Pad", pad_inputs, ["p"], name="pad", mode=mode),
             helper.make_node("QuantizeLinear", ["p", "s2", "z"], ["pq"], name="q_pad"),
             helper.make_node("DequantizeLinear", ["pq", "s2", "z"], ["y"], name="dq_out")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 4, 4])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("xd", TensorProto.FLOAT, [2, 3, 4, 4]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(0).uniform(-2, 60, (2, 3, 4, 4)).astype(np.float32)


@pytest.mark.parametrize("value", [None, 0.0])
def test_zero_pad_runs_on_the_quantised_tensor_and_gives_the_same_values(value: float | None, x: np.ndarray) -> None:
    model = _qdq_pad(out_scale=0.5, value=value)
    before = _run(model, x)
    assert integer_pads(model) == ["pad"]
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["QuantizeLinear", "Pad", "DequantizeLinear"]  # no float between a dequantise and a quantise
    pad = model.graph.node[1]
    fill = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}[pad.input[2]]
    assert pad.input[0] == "xq" and fill.dtype == np.uint8 and int(fill) == 3  # padded with the zero point
    after = _run(model, x)
    assert np.array_equal(after[0], before[0])
    assert np.all(after[0][:, :2] == 0) and np.all(after[0][:, -1:] == 0)  # the new channels are zeros


@pytest.mark.parametrize("kwargs", [{"out_scale": 0.25}, {"value": 1.0}, {"mode": "edge"}],
                         ids=["other scale after the pad", "non-zero pad value", "edge mode"])
def test_pads_that_change_values_stay_as_they_are(kwargs: dict) -> None:
    model = _qdq_pad(**kwargs)
    before = model.SerializeToString()
    assert integer_pads(model) == []
    assert model.SerializeToString() == before


def test_a_dequantise_read_elsewhere_is_kept(x: np.ndarray) -> None:
    model = _qdq_pad(extra_reader=True)
    before = _run(model, x)
    assert integer_pads(model) == ["pad"]
    assert [n.op_type for n in model.graph.node] == ["QuantizeLinear", "DequantizeLinear", "Pad", "DequantizeLinear"]
    after = _run(model, x)
    assert all(np.array_equal(a, b) for a, b in zip(after, before))
