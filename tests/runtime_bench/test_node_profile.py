"""minreal.runtime_bench.node_profile: kernel times from onnxruntime's profile, with MACs for integer kernels too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minreal.runtime_bench.node_profile import kernel_macs, op_totals, parse_kernel_times, profile_kernels


def _event(node: str, op: str, dur: float, inputs=None, outputs=None) -> dict:
    args = {"op_name": op, "provider": "CPUExecutionProvider"}
    if inputs is not None:
        args["input_type_shape"] = [{"float": list(s)} for s in inputs]
        args["output_type_shape"] = [{"float": list(s)} for s in outputs]
    return {"cat": "Node", "name": f"{node}_kernel_time", "dur": dur, "args": args}


def test_parse_keeps_each_kernels_median_after_the_warmup_in_first_run_order() -> None:
    events = [{"cat": "Session", "name": "model_run", "dur": 99}]
    for durs in ([100, 7], [1, 3], [1, 5], [1, 4]):  # run 0 is the warm-up: 100 and 7 must not count
        events += [_event("b", "Relu", durs[0], [(1, 4)], [(1, 4)]), _event("a", "Conv", durs[1])]
    kernels = parse_kernel_times(events, skip=1)
    assert [k.name for k in kernels] == ["b", "a"]
    assert [k.median_us for k in kernels] == [1.0, 4.0] and all(k.runs == 3 for k in kernels)
    assert kernels[0].macs == 0 and kernels[1].macs is None  # a Relu has none; a Conv without shapes: unknown
    assert parse_kernel_times(events[:3], skip=5)[0].median_us == 100.0  # fewer runs than skip: all of them


@pytest.mark.parametrize(("op", "inputs", "outputs", "macs"), [
    # QLinearConv: x, x_scale, x_zp, w, ... -> prod(Y) * Cin/group * kh * kw
    ("QLinearConv", [(2, 8, 6, 6), (), (), (16, 8, 3, 3)], [(2, 16, 6, 6)], 2 * 16 * 36 * 8 * 9),
    ("ConvInteger", [(1, 4, 5, 5), (8, 4, 1, 1)], [(1, 8, 5, 5)], 8 * 25 * 4),
    ("QLinearMatMul", [(3, 5, 7), (), (), (7, 2)], [(3, 5, 2)], 3 * 5 * 2 * 7),
    ("QGemm", [(4, 10), (), (), (10, 6)], [(4, 6)], 4 * 6 * 10),
    ("QGemm", [(4, 10), (), (), (6, 10)], [(4, 6)], 4 * 6 * 10),  # transB: K still from the activation
    ("QGemm", [(10, 4), (), (), (10, 6)], [(4, 6)], 4 * 6 * 10),  # transA
    ("MatMulInteger", [(2, 5, 7), (7, 3)], [(2, 5, 3)], 2 * 5 * 3 * 7),
    ("DynamicQuantizeMatMul", [(2, 5, 7), (7, 3)], [(2, 5, 3)], 2 * 5 * 3 * 7),
    ("Conv", [(1, 3, 4, 4), (5, 3, 3, 3)], [(1, 5, 4, 4)], 5 * 16 * 27),
    ("QLinearConv", [(2, 8, 6, 6), (), ()], [(2, 16, 6, 6)], None),  # no weight shape
])
def test_integer_kernels_count_their_macs_from_their_own_weight_input(op, inputs, outputs, macs) -> None:
    assert kernel_macs(op, inputs, outputs) == macs


def _qlinear_conv_model(path: Path, cin: int, cout: int, hw: int) -> None:
    """x (float) -> QuantizeLinear -> QLinearConv 3x3 (symmetric int8 weights) -> DequantizeLinear."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
             numpy_helper.from_array(np.array(128, np.uint8), "xz"),
             numpy_helper.from_array(rng.integers(-100, 100, (cout, cin, 3, 3)).astype(np.int8), "w"),
             numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
             numpy_helper.from_array(np.array(0, np.int8), "wz"),
             numpy_helper.from_array(np.array(0.5, np.float32), "ys"),
             numpy_helper.from_array(np.array(128, np.uint8), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="quant"),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"],
                              name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="dequant")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, cin, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, cout, hw, hw])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_profile_of_an_int8_convolution_times_every_run_and_counts_its_exact_macs(tmp_path: Path) -> None:
    path = tmp_path / "qconv.onnx"
    _qlinear_conv_model(path, cin=8, cout=16, hw=10)
    x = np.random.default_rng(1).standard_normal((3, 8, 10, 10)).astype(np.float32)
    kernels = profile_kernels(path, "CPUExecutionProvider", 1, {"x": x}, runs=4, warmup=2)
    conv = [k for k in kernels if k.op_type == "QLinearConv"]
    assert len(conv) == 1 and conv[0].runs == 4 and conv[0].median_us > 0
    assert conv[0].macs == 3 * 16 * 10 * 10 * 8 * 9  # whatever layout ONNX Runtime chose for the activations
    totals = op_totals(kernels)
    assert totals["QLinearConv"]["macs"] == conv[0].macs
    assert sum(row["share"] for row in totals.values()) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError, match="runs >= 1"):
        profile_kernels(path, "CPUExecutionProvider", 1, {"x": x}, runs=0)


def test_constant_shapes_from_the_graph_replace_what_prepacking_recorded() -> None:
    """A per-channel QLinearConv's pre-packed weight is recorded as ``(C_out,)``, a per-tensor one as ``()``: the
    optimised graph's initializer shapes replace them; inputs the graph does not know keep the recorded shape."""
    from minreal.runtime_bench.node_profile import _merged

    recorded = ((2, 8, 6, 6), (), (), (16,), (16,), (16,))
    graph = (None, (), (), (16, 8, 3, 3), (16,), (16,))
    assert _merged(recorded, graph) == ((2, 8, 6, 6), (), (), (16, 8, 3, 3), (16,), (16,))
    assert _merged(recorded, ()) == recorded
    assert _merged(((2, 8),), (None, (8, 4))) == ((2, 8), (8, 4))  # a constant the profile left out
    assert kernel_macs("QLinearConv", _merged(recorded, graph), ((2, 16, 6, 6),)) == 2 * 16 * 36 * 8 * 9
