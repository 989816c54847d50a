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
