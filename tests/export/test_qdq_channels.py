"""minreal.export.qdq_channels: convolutions widened to input channels on a multiple of 4 compute the same outputs, and
in an x86 INT8 file the widened stem runs as an integer kernel on 4 channels with nothing left in float."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from minreal.export.int8 import QuantConfig, quantize_int8
from minreal.export.qdq_channels import align_conv_inputs, channel_pads, narrow_convs
from minreal.runtime_bench.model_info import float_roundtrips, optimized_graph


def _conv_graph(shared: bool = False, opset: int = 18, stem_out: int = 16) -> onnx.ModelProto:
    """x (N, 3, 8, 8) → Conv 3→``stem_out`` (3×3) → Relu → Conv (1×1) → depthwise Conv (3×3) → y; ``shared``: a
    second stem Conv on x with the same weight, added to the first's output."""
    rng = np.random.default_rng(0)
    c = stem_out
    inits = [numpy_helper.from_array(rng.standard_normal((c, 3, 3, 3)).astype(np.float32), "stem.weight"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "stem.bias"),
             numpy_helper.from_array(rng.standard_normal((c, c, 1, 1)).astype(np.float32), "mix.weight"),
             numpy_helper.from_array(rng.standard_normal((c, 1, 3, 3)).astype(np.float32), "dw.weight")]
    nodes = [helper.make_node("Conv", ["x", "stem.weight", "stem.bias"], ["h"], name="stem", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "mix.weight"], ["m"], name="mix"),
             helper.make_node("Conv", ["m", "dw.weight"], ["y"], name="dw", group=c, pads=[1, 1, 1, 1])]
    if shared:
        nodes[-1].output[0] = "d"
        nodes += [helper.make_node("Conv", ["x", "stem.weight"], ["t"], name="twin", pads=[1, 1, 1, 1]),
                  helper.make_node("Add", ["d", "t"], ["y"], name="sum")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_widened_convolutions_compute_the_same_outputs() -> None:
    model, x = _conv_graph(), np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    before = _run(model, x)
    assert align_conv_inputs(model) == ["stem"]  # 8 channels and the depthwise conv are left as they are
    onnx.checker.check_model(model)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert weights["stem.weight"].shape == (16, 4, 3, 3) and not weights["stem.weight"][:, 3].any()
    pad, stem = model.graph.node[0], model.graph.node[1]
    assert (pad.op_type, pad.input[0], stem.name, stem.input[0]) == ("Pad", "x", "stem", pad.output[0])
    assert weights[pad.input[1]].tolist() == [0, 0, 0, 0, 0, 1, 0, 0]  # one zero channel after the last
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-5, atol=1e-5)
    assert align_conv_inputs(model) == []  # idempotent


def test_a_weight_shared_with_another_node_is_copied_not_changed() -> None:
    model, x = _conv_graph(shared=True), np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    before = _run(model, x)
    assert align_conv_inputs(model) == ["stem", "twin"]
    onnx.checker.check_model(model)
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    assert "stem.weight" not in shapes  # both readers now read widened copies
    stems = [n for n in model.graph.node if n.name in ("stem", "twin")]
    assert len({n.input[1] for n in stems}) == 2 and all(shapes[n.input[1]] == (16, 4, 3, 3) for n in stems)
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-5, atol=1e-5)


def test_int8_stem_runs_on_four_channels_with_the_same_outputs(tmp_path: Path) -> None:
    """On this machine's CPU target the stem is widened before quantising: in ONNX Runtime's optimised graph it is a
    QLinearConv with 4 input channels, its pad runs on the quantised input (no float round trip), and the outputs are
    the unwidened file's exactly (the same integer sums; the CPU target never saturates its int16 step). Calibrating
    once and quantising with that calibration sees the same widened graph."""
    from minreal.export.int8 import calibrate

    src = tmp_path / "fp32.onnx"
    onnx.save(_conv_graph(), str(src))
    rng = np.random.default_rng(3)
    calib = rng.standard_normal((32, 3, 8, 8)).astype(np.float32)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    wide = quantize_int8(src, tmp_path / "wide.onnx", calib, QuantConfig(target="cpu"))
    narrow = quantize_int8(src, tmp_path / "narrow.onnx", calib, QuantConfig(target="cpu", align_channels=False))
    graph = optimized_graph(Path(wide.out_path))
    values = {t.name: tuple(t.dims) for t in graph.initializer}
    weights = sorted(values.get(n.input[3]) for n in graph.node if n.op_type == "QLinearConv")
    assert weights == [(16, 1, 3, 3), (16, 4, 3, 3), (16, 16, 1, 1)]  # the stem on 4 channels; the others as they were
    assert not float_roundtrips(graph)
    assert wide.integer_kernels == narrow.integer_kernels == 3 and wide.float_kernels == 0
    assert not [n for n in onnx.load(str(narrow.out_path)).graph.node if n.op_type == "Pad"]
    a = ort.InferenceSession(str(wide.out_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    b = ort.InferenceSession(str(narrow.out_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(a, b)
    again = quantize_int8(src, tmp_path / "again.onnx", None, QuantConfig(target="cpu"),
                          calibration=calibrate(src, calib, QuantConfig(target="cpu")))
    c = ort.InferenceSession(str(again.out_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(c, a)


def test_an_excluded_stem_runs_in_float_on_its_own_three_channels(tmp_path: Path) -> None:
    """A stem left in float (accuracy control's first suspect) gets its zero channel and its Pad back out: in float
    they only cost (a third more of its MACs and a copy of the input). The file is then the unwidened quantisation's,
    outputs to the bit, also from a calibration of the widened graph made once for many exclusions."""
    from minreal.export.int8 import calibrate

    src = tmp_path / "fp32.onnx"
    onnx.save(_conv_graph(), str(src))
    rng = np.random.default_rng(5)
    calib = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    cpu = QuantConfig(target="cpu")
    result = quantize_int8(src, tmp_path / "q.onnx", calib, cpu, exclude=["stem"])
    plain = quantize_int8(src, tmp_path / "plain.onnx", calib, QuantConfig(target="cpu", align_channels=False),
                          exclude=["stem"])
    once = quantize_int8(src, tmp_path / "once.onnx", None, cpu, exclude=["stem"],
                         calibration=calibrate(src, calib, cpu))
    model = onnx.load(str(result.out_path))
    assert not [n for n in model.graph.node if n.op_type == "Pad"]
    (stem,) = [n for n in model.graph.node if n.name == "stem"]
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    assert stem.input[0] == "x" and weights[stem.input[1]] == (16, 3, 3, 3)  # in float, on the graph input
    assert result.float_kernels == 1 and result.integer_kernels == 2 and result.excluded_nodes == ["stem"]
    outputs = [ort.InferenceSession(str(r.out_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
               for r in (result, plain, once)]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[2], outputs[1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp32.onnx", "once.onnx", "plain.onnx", "q.onnx"]


def test_narrowing_undoes_widening_exactly_and_only_for_the_named_convolutions() -> None:
    """align then narrow gives the original graph's weights and outputs back; a shared weight's widened copy is
    narrowed for its own convolution only."""
    model = _conv_graph(shared=True)
    x = np.random.default_rng(6).standard_normal((2, 3, 8, 8)).astype(np.float32)
    before = _run(model, x)
    assert align_conv_inputs(model) == ["stem", "twin"]
    assert narrow_convs(model, ["twin", "mix", "nowhere"]) == (["twin"], ["x_aligned_1"])
    onnx.checker.check_model(model)
    (twin,) = [n for n in model.graph.node if n.name == "twin"]
    (pad,) = [n for n in model.graph.node if n.op_type == "Pad"]  # the stem's stays
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    original = numpy_helper.to_array(_conv_graph().graph.initializer[0])
    assert twin.input[0] == "x" and np.array_equal(weights[twin.input[1]], original)
    assert pad.output[0] == next(n for n in model.graph.node if n.name == "stem").input[0]
    assert len([t for t in model.graph.initializer if "channel_pads" in t.name]) == 1
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-5, atol=1e-5)
    assert narrow_convs(model, ["stem"]) == (["stem"], ["x_aligned"]) and narrow_convs(model, ["stem"]) == ([], [])
    assert not [n for n in model.graph.node if n.op_type == "Pad"]
    assert not [t for t in model.graph.initializer if "channel_pads" in t.name]
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-5, atol=1e-5)


def test_a_widened_weight_another_node_reads_is_narrowed_in_a_copy() -> None:
    """narrow_convs is public: where something besides the widened convolution reads its weight, that reader keeps
    the widened weight and the convolution reads a narrowed copy."""
    model = _conv_graph()
    align_conv_inputs(model)
    model.graph.node.append(helper.make_node("Identity", ["stem.weight"], ["w_out"], name="peek"))
    model.graph.output.append(helper.make_tensor_value_info("w_out", TensorProto.FLOAT, [16, 4, 3, 3]))
    x = np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert narrow_convs(model, ["stem"]) == (["stem"], ["x_aligned"])
    onnx.checker.check_model(model)
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    (stem,) = [n for n in model.graph.node if n.name == "stem"]
    assert weights["stem.weight"] == (16, 4, 3, 3) and weights[stem.input[1]] == (16, 3, 3, 3)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y, w = session.run(None, {"x": x})
    np.testing.assert_allclose(y, _run(_conv_graph(), x), rtol=1e-5, atol=1e-5)
    assert w.shape == (16, 4, 3, 3)


def test_an_excluded_widened_stem_with_trained_ranges_quantises(tmp_path: Path) -> None:
    """Trained ranges (quantisation-aware recovery) place the stem's input range on the Pad's output too; with the
    stem left in float the Pad is gone, and its tensor's range with it (ONNX Runtime refused an override of a tensor
    not in the graph). The stem is narrowed; the file is the unwidened one's."""
    src = tmp_path / "fp32.onnx"
    onnx.save(_conv_graph(), str(src))
    rng = np.random.default_rng(7)
    calib = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    cpu = QuantConfig(target="cpu").resolved()
    act, symmetric = cpu.activation()
    trained = {"scale": 0.05, "zero_point": 0 if symmetric else 128, "dtype": act, "symmetric": symmetric}
    ranges = {"stem": trained, "mix": trained}  # the stem's on its input: the graph's, and the Pad's output
    wide = quantize_int8(src, tmp_path / "wide.onnx", calib, cpu, activation_ranges=ranges, exclude=["stem"])
    plain = quantize_int8(src, tmp_path / "plain.onnx", calib, replace(cpu, align_channels=False),
                          activation_ranges=ranges, exclude=["stem"])
    assert wide.range_source == plain.range_source == "trained" and wide.trained_ranges == plain.trained_ranges
    assert not [n for n in onnx.load(str(wide.out_path)).graph.node if n.op_type == "Pad"]
    outputs = [ort.InferenceSession(str(r.out_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
               for r in (wide, plain)]
    np.testing.assert_array_equal(outputs[0], outputs[1])


@pytest.mark.parametrize("user_pad", ["reflect", "spatial", "nonzero_weight", "other_name"])
def test_a_pad_align_did_not_write_is_never_removed(user_pad: str) -> None:
    """Only the Pad align_conv_inputs wrote goes: a user's Pad named like one (reflect, spatial, before a weight
    that is not zero on the padded channels, or named after another convolution) stays, and so does its weight."""
    rng = np.random.default_rng(8)
    cin = 3 if user_pad in ("reflect", "spatial") else 4
    weight = rng.standard_normal((16, cin, 3, 3)).astype(np.float32)
    pads = np.zeros(8, np.int64)
    if user_pad in ("reflect", "spatial"):
        pads[[2, 3, 6, 7]] = 1
    else:
        pads[5] = 1  # one channel after the last, as align writes, but the weight reads it or the name differs
        if user_pad == "other_name":
            weight[:, 3] = 0
    name = "other_channel_pad" if user_pad == "other_name" else "stem_channel_pad"
    nodes = [helper.make_node("Pad", ["x", "p"], ["xp"], name=name,
                              mode="reflect" if user_pad == "reflect" else "constant"),
             helper.make_node("Conv", ["xp", "w"], ["y"], name="stem")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(pads, "p")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    before = _run(model, x)
    assert channel_pads(model) == {} and narrow_convs(model, ["stem"]) == ([], [])
    assert [n.op_type for n in model.graph.node] == ["Pad", "Conv"]
    np.testing.assert_array_equal(_run(model, x), before)


@pytest.mark.parametrize(("opset", "stem_out"), [(10, 16), (18, 8), (18, 20)])
def test_no_widening_where_the_pad_buys_nothing_or_cannot_be_written(opset: int, stem_out: int) -> None:
    """Below opset 11 Pad takes its pads as an attribute; below 16 output channels, or off a multiple of 8 of them,
    MLAS's symmetric kernel would not take the widened convolution either."""
    model = _conv_graph(opset=opset, stem_out=stem_out)
    assert align_conv_inputs(model) == []
    assert [tuple(t.dims) for t in model.graph.initializer if t.name == "stem.weight"] == [(stem_out, 3, 3, 3)]


@pytest.mark.parametrize("target", ["tensorrt", "arm64"])
def test_targets_other_than_x86_cpus_are_not_widened(target: str, tmp_path: Path) -> None:
    src = tmp_path / "fp32.onnx"
    onnx.save(_conv_graph(), str(src))
    calib = np.random.default_rng(4).standard_normal((16, 3, 8, 8)).astype(np.float32)
    result = quantize_int8(src, tmp_path / "q.onnx", calib, QuantConfig(target=target))
    model = onnx.load(str(result.out_path))
    assert not [n for n in model.graph.node if n.op_type == "Pad"]


def test_a_weight_listed_as_a_graph_input_keeps_a_consistent_shape() -> None:
    """Older exports list initializers among the graph's inputs, with their shapes: a weight widened in place gets its
    listed shape widened too, or shape inference refuses the graph."""
    model = _conv_graph()
    model.graph.input.append(helper.make_tensor_value_info("stem.weight", TensorProto.FLOAT, [16, 3, 3, 3]))
    align_conv_inputs(model)
    listed = next(i for i in model.graph.input if i.name == "stem.weight")
    assert [d.dim_value for d in listed.type.tensor_type.shape.dim] == [16, 4, 3, 3]
    onnx.shape_inference.infer_shapes(model, strict_mode=True)


@pytest.mark.parametrize("align", [True, False])
def test_a_trained_range_on_a_widened_stem_counts_as_applied(tmp_path: Path, align: bool,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The stem's channel Pad moves onto the quantised input (integer_pads), so the stem's own input is no longer
    quantised: the trained range is still in the file, on ``x``, and must not be reported as calibrated instead."""
    path = tmp_path / "net.onnx"
    onnx.save(_conv_graph(), str(path))
    x = np.random.default_rng(1).standard_normal((8, 3, 8, 8)).astype(np.float32)
    ranges = {"stem": {"scale": 0.05, "zero_point": 128, "dtype": "uint8", "symmetric": False, "weight_qmax": 64}}
    with caplog.at_level("WARNING"):
        result = quantize_int8(path, tmp_path / "net.int8.onnx", x,
                               QuantConfig(target="cpu-avx2", align_channels=align), activation_ranges=ranges)
    assert (result.trained_ranges, result.untrained_modules) == (1, [])
    assert "calibrated instead" not in caplog.text
    written = onnx.load(str(tmp_path / "net.int8.onnx"))
    values = {t.name: numpy_helper.to_array(t) for t in written.graph.initializer}
    (q,) = [n for n in written.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x"]
    assert (float(values[q.input[1]]), int(values[q.input[2]])) == (float(np.float32(0.05)), 128)
