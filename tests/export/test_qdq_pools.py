"""Tests for minreal.export.qdq_pools: a mean over every spatial axis, axes kept, becomes GlobalAveragePool, same
values."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from minreal.export.qdq_pools import global_average_pools


def _mean(axes: list[int], keepdims: int = 1, rank_known: bool = True, opset: int = 18) -> onnx.ModelProto:
    """x (2, 3, 4, 5) → ReduceMean(axes) → y; the axes as an input (opset 18) or an attribute (opset 13)."""
    shape = [2, 3, 4, 5] if rank_known else None
    out = list(np.zeros((2, 3, 4, 5)).mean(axis=tuple(axes), keepdims=bool(keepdims)).shape)
    if opset >= 18:
        inits = [numpy_helper.from_array(np.array(axes, np.int64), "axes")]
        node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], name="mean", keepdims=keepdims)
    else:
        inits, node = [], helper.make_node("ReduceMean", ["x"], ["y"], name="mean", axes=axes, keepdims=keepdims)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize(("axes", "opset"), [([2, 3], 18), ([-1, -2], 18), ([2, 3], 13)])
def test_spatial_mean_becomes_global_average_pool(axes: list[int], opset: int) -> None:
    model = _mean(axes, opset=opset)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    before = _run(model, x)
    assert global_average_pools(model) == ["mean"]
    (node,) = model.graph.node
    assert (node.op_type, list(node.input), list(node.attribute)) == ("GlobalAveragePool", ["x"], [])
    assert not model.graph.initializer  # the axes are read by no other node
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kwargs", [{"axes": [2, 3], "keepdims": 0}, {"axes": [1, 2, 3]}, {"axes": [3]},
                                    {"axes": [2, 3], "rank_known": False}],
                         ids=["axes dropped", "channels too", "one spatial axis", "rank unknown"])
def test_other_means_stay(kwargs: dict) -> None:
    model = _mean(**kwargs)
    before = model.SerializeToString()
    assert global_average_pools(model) == []
    assert model.SerializeToString() == before


def _rank3_mean(producer: str) -> onnx.ModelProto:
    """x (2, 3, 8) → producer (Conv1d; Conv1d, SiLU and a residual sum with x; or Pow as an RMSNorm's x²) → Relu →
    ReduceMean(axis 2, kept) → y."""
    inits = [numpy_helper.from_array(np.array([2], np.int64), "axes")]
    if producer in ("Conv", "SiLU residual"):
        inits.append(numpy_helper.from_array(np.ones((3, 3, 1), np.float32), "w"))
        first = helper.make_node("Conv", ["x", "w"], ["h" if producer == "Conv" else "c"], name="conv")
    else:
        inits.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
        first = helper.make_node("Pow", ["x", "two"], ["h"], name="square")
    silu = [helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),  # SiLU, then a residual sum with x
            helper.make_node("Mul", ["c", "s"], ["m"], name="silu"),
            helper.make_node("Add", ["x", "m"], ["h"], name="residual")] if producer == "SiLU residual" else []
    nodes = [first, *silu, helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r", "axes"], ["y"], name="mean", keepdims=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("producer", ["Conv", "SiLU residual"])
def test_a_rank_3_mean_is_a_pool_only_after_a_convolution(producer: str) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    conv = _rank3_mean(producer)
    before = _run(conv, x)
    assert global_average_pools(conv) == ["mean"]  # a 1-D CNN's length axis
    np.testing.assert_allclose(_run(conv, x), before, rtol=1e-6, atol=1e-7)
    features = _rank3_mean("Pow")  # (N, S, D): a mean over the features, as in an RMSNorm
    assert global_average_pools(features) == [] and features.graph.node[-1].op_type == "ReduceMean"
