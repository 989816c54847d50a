"""Tests for minreal.export.int8: calibration rules, QDQ per target, integer kernels, accuracy, dynamic mode."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import minreal.export.int8.calibration as int8_calibration
import minreal.runtime_bench.cpu as cpu_facts
from minreal.export.errors import CalibrationError, QuantizationError, SameFileError
from minreal.export.int8 import (
    ArrayCalibrationReader,
    QuantConfig,
    calibrate,
    optimized_op_counts,
    quantizable_nodes,
    quantize_int8,
    resolve_target,
)
from minreal.export.int8.preprocess import ort_quantization
from minreal.export.onnx_export import ExportResult
from minreal.runtime_bench.cpu import CpuIsa


def _run(path: str | Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _input_zero_point(path: str | Path) -> np.ndarray:
    """Zero point of the QuantizeLinear that quantises the graph input."""
    model = onnx.load(str(path))
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    graph_input = model.graph.input[0].name
    (node,) = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == graph_input]
    return initializers[node.input[2]]


@pytest.fixture(scope="module")
def cpu_int8(convnet_onnx: ExportResult, calib_images: np.ndarray, tmp_path_factory: pytest.TempPathFactory):
    return quantize_int8(convnet_onnx.path, tmp_path_factory.mktemp("q") / "cpu.int8.onnx", calib_images)


def test_refuses_without_calibration_data(convnet_onnx: ExportResult, tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=r"needs calibration data.*allow_random_calibration=True"):
        quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", None)
    assert list(tmp_path.iterdir()) == []


def test_random_calibration_only_when_allowed(convnet_onnx: ExportResult, tmp_path: Path) -> None:
    config = QuantConfig(allow_random_calibration=True, random_samples=8)
    result = quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", None, config)
    assert result.random_calibration and result.calibration_samples == 8


def test_cpu_target_is_qdq_with_uint8_activations_and_integer_kernels(cpu_int8, convnet_onnx: ExportResult) -> None:
    assert (cpu_int8.mode, cpu_int8.quant_format, cpu_int8.requested_target) == ("static", "QDQ", "cpu")
    assert cpu_int8.target == resolve_target("cpu") and not cpu_int8.saturates_here
    assert cpu_int8.node_counts["QuantizeLinear"] > 0 and cpu_int8.node_counts["DequantizeLinear"] > 0
    assert cpu_int8.node_counts["Conv"] == 2  # QDQ keeps float ops between Q/DQ pairs
    arm = cpu_int8.target == "arm64"  # cpu on an ARM64 CPU: ARM's S8S8 format
    assert (cpu_int8.activation_type, cpu_int8.activation_symmetric) == (("int8", True) if arm else ("uint8", False))
    assert _input_zero_point(cpu_int8.out_path).dtype == np.uint8
    assert cpu_int8.calibration_samples == 64 and not cpu_int8.random_calibration
    # Both convolutions and the classifier run as integer kernels in ORT's CPU graph.
    assert cpu_int8.integer_kernels == 3 and cpu_int8.float_kernels == 0
    ops = cpu_int8.optimized_ops
    assert ops.get("com.microsoft:QLinearConv", 0) + ops.get("QLinearConv", 0) == 2
    assert cpu_int8.size_fp32_bytes == Path(convnet_onnx.path).stat().st_size


def test_tensorrt_target_uses_symmetric_int8_and_float_bias(
    convnet_onnx: ExportResult, calib_images: np.ndarray, tmp_path: Path
) -> None:
    result = quantize_int8(convnet_onnx.path, tmp_path / "trt.onnx", calib_images, QuantConfig(target="tensorrt"))
    assert (result.activation_type, result.activation_symmetric, result.quantized_bias) == ("int8", True, False)
    zero_point = _input_zero_point(result.out_path)
    assert zero_point.dtype == np.int8 and np.all(zero_point == 0)
    initializers = onnx.load(result.out_path).graph.initializer
    assert not [t.name for t in initializers if t.data_type == onnx.TensorProto.INT32]


def test_activation_type_can_be_overridden(
    convnet_onnx: ExportResult, calib_images: np.ndarray, tmp_path: Path
) -> None:
    config = QuantConfig(target="cpu", activation_type="int8", activation_symmetric=True)
    result = quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", calib_images, config)
    assert result.activation_type == "int8" and _input_zero_point(result.out_path).dtype == np.int8


@pytest.mark.parametrize("int8_file", ["cpu_int8", "arm64_int8"])
def test_int8_agrees_with_fp32(
    int8_file: str, convnet_onnx: ExportResult, make_images: Callable[[int, int], torch.Tensor],
    request: pytest.FixtureRequest
) -> None:
    held_out = make_images(128, 99).numpy()
    result = request.getfixturevalue(int8_file)
    fp32, int8 = _run(convnet_onnx.path, held_out), _run(result.out_path, held_out)
    agreement = np.mean(fp32.argmax(1) == int8.argmax(1))
    relative_error = np.linalg.norm(int8 - fp32) / np.linalg.norm(fp32)
    assert agreement >= 0.85, agreement
    if result.saturates_here:
        # ARM's 8-bit S8S8 file run on an x86 CPU whose u8·s8 kernel adds pairs in int16 (AVX2 without VNNI): the
        # sums can saturate, so no error bound holds here (0.27 measured on an AMD EPYC with AVX2 only); the product
        # must say so, and `cpu` never writes such a file for this CPU (test_cpu_target_is_qdq_...)
        assert int8_file == "arm64_int8" and cpu_facts.kernel_saturates()
        return
    assert relative_error < 0.1, relative_error


def test_dynamic_mode(
    convnet_onnx: ExportResult, make_images: Callable[[int, int], torch.Tensor], tmp_path: Path
) -> None:
    result = quantize_int8(convnet_onnx.path, tmp_path / "dyn.onnx", None, QuantConfig(mode="dynamic"))
    assert (result.quant_format, result.calibration_samples, result.calibration_digest) == ("QOperator", 0, "")
    assert result.node_counts.get("ConvInteger") == 2 and "DynamicQuantizeLinear" in result.node_counts
    assert result.integer_kernels == 3 and result.float_kernels == 0
    x = make_images(3, 7).numpy()
    fp32, int8 = _run(convnet_onnx.path, x), _run(result.out_path, x)
    assert int8.shape == (3, 5)
    assert np.linalg.norm(int8 - fp32) / np.linalg.norm(fp32) < 0.1


def test_a_fused_attention_kernel_counts_as_a_float_kernel() -> None:
    """A fused attention (com.microsoft's, as the simplifier could write it, or ONNX's) runs its products in float
    after INT8: an INT8 report must not say ``float_kernels: 0`` while one runs."""
    from minreal.export.int8.ops import kernel_counts

    counts = {"com.microsoft:QLinearConv": 3, "MatMulInteger": 1, "com.microsoft:Attention": 2, "Attention": 1,
              "com.microsoft:MultiHeadAttention": 1, "FusedMatMul": 1, "Softmax": 4}
    assert kernel_counts(counts) == (4, 5)


def test_fp32_graph_counts_only_float_kernels(convnet_onnx: ExportResult) -> None:
    counts = optimized_op_counts(convnet_onnx.path)
    assert sum(n for op, n in counts.items() if op.rsplit(":", 1)[-1] in ("Conv", "Gemm", "FusedConv")) == 3
    assert not any("QLinear" in op or "Integer" in op for op in counts)


def test_calibration_shape_must_fit(convnet_onnx: ExportResult, tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=r"shape \(4, 3, 8, 8\) does not fit input 'input'") as info:
        quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", np.zeros((4, 3, 8, 8), np.float32))
    assert str(info.value).startswith(f"{Path(convnet_onnx.path).name}: ")  # the file whose input it does not fit


def test_refuses_to_overwrite_input(convnet_onnx: ExportResult, calib_images: np.ndarray) -> None:
    with pytest.raises(SameFileError):
        quantize_int8(convnet_onnx.path, convnet_onnx.path, calib_images)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "qat"}, "mode='qat'"),
        ({"target": "npu"}, "target='npu'"),
        ({"activation_type": "int4"}, "activation_type='int4'"),
        ({"mode": "dynamic", "target": "tensorrt"}, "use mode='static' for tensorrt"),
        ({"batch_size": 0}, "must be positive"),
    ],
)
def test_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QuantConfig(**kwargs)


def test_calibration_reader_batches_and_rewinds() -> None:
    data = np.arange(10, dtype=np.float32).reshape(10, 1)
    ids = np.arange(10, dtype=np.int64).reshape(10, 1)
    reader = ArrayCalibrationReader({"x": data, "ids": ids}, batch_size=4)
    batches = list(iter(reader.get_next, None))
    assert [len(batch["x"]) for batch in batches] == [4, 4, 2]
    assert all(np.array_equal(b["x"].astype(np.int64), b["ids"]) for b in batches)  # rows stay aligned
    reader.rewind()
    assert reader.get_next()["x"][0, 0] == 0.0
    fixed = ArrayCalibrationReader({"x": data, "ids": ids}, batch_size=4, full_batches=True)  # a static batch axis
    batches = list(iter(fixed.get_next, None))
    assert [b["x"][:, 0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]  # every row seen
    assert all(np.array_equal(b["x"].astype(np.int64), b["ids"]) for b in batches)


def test_minmax_calibration_batches_hold_at_most_16_imagenet_images_of_input() -> None:
    """At most 16 × 3×224×224 input elements a batch: 16 samples of 3×12×12 or 3×224×224, 8 of Inception's
    3×299×299 (2408448 // 268203), 2 of a segmentation input of 3×520×520 (// 811200), 1 of a 16-frame clip; every
    input of a sample counts; a smaller batch asked for is kept, and the histogram methods keep theirs."""

    def batch(*shapes: tuple[int, ...], **config: Any) -> int:
        data = {f"x{k}": np.zeros((1, *shape), np.float32) for k, shape in enumerate(shapes)}
        return int8_calibration.calibration_batch(data, QuantConfig(**config))

    assert batch((3, 12, 12)) == batch((3, 224, 224)) == 16
    assert batch((3, 299, 299)) == 8 and batch((3, 520, 520)) == 2 and batch((3, 16, 224, 224)) == 1
    assert batch((3, 224, 224), (3, 224, 224)) == 8
    assert batch((3, 12, 12), batch_size=4) == 4 and batch((3, 520, 520), batch_size=1) == 1
    assert batch((3, 520, 520), calibration_method="entropy") == batch((3, 520, 520), calibration_method="percentile")
    assert batch((3, 520, 520), calibration_method="entropy") == 16


def test_minmax_ranges_and_file_do_not_depend_on_the_calibration_batch(convnet_onnx: ExportResult,
                                                                      calib_images: np.ndarray, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The minimum and maximum over batches of one sample are those over batches of 16: the same ranges, and the same
    file when the batch is bounded to one sample's elements."""
    whole = calibrate(convnet_onnx.path, calib_images)
    single = calibrate(convnet_onnx.path, calib_images, QuantConfig(batch_size=1))
    assert sorted(whole.ranges.keys()) == sorted(single.ranges.keys()) and len(whole.ranges.keys()) > 3
    for name in whole.ranges.keys():
        for a, b in zip(whole.ranges[name].range_value, single.ranges[name].range_value, strict=True):
            assert np.array_equal(a, b), name
    quantize_int8(convnet_onnx.path, tmp_path / "whole.onnx", calib_images)
    readers: list[ArrayCalibrationReader] = []
    monkeypatch.setattr(int8_calibration, "CALIBRATION_BATCH_ELEMENTS", calib_images[0].size)
    monkeypatch.setattr(int8_calibration, "ArrayCalibrationReader",
                        lambda *a, **k: readers.append(ArrayCalibrationReader(*a, **k)) or readers[-1])
    quantize_int8(convnet_onnx.path, tmp_path / "split.onnx", calib_images)
    assert [r.batch_size for r in readers] == [1]
    assert (tmp_path / "split.onnx").read_bytes() == (tmp_path / "whole.onnx").read_bytes()


def _kernel_order(session_options: ort.SessionOptions, model: Path, x: np.ndarray, tmp_path: Path) -> list[str]:
    """Names of the nodes in the order ONNX Runtime ran them once on ``x`` (its profile, kernel events)."""
    session_options.enable_profiling = True
    session_options.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(str(model), session_options, providers=["CPUExecutionProvider"])
    session.run(None, {session.get_inputs()[0].name: x})
    events = json.loads(Path(session.end_profiling()).read_text())
    suffix = "_kernel_time"
    return [e["name"][: -len(suffix)] for e in events if e.get("cat") == "Node" and e["name"].endswith(suffix)]


def test_calibration_reduces_each_tensor_before_the_next_layer_with_the_ranges_of_the_default_order(
    convnet_onnx: ExportResult, calib_images: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibration session runs each tensor's ReduceMin and ReduceMax before the next node of the network (so the
    tensor is freed there, not kept to the end of the batch as in ONNX Runtime's default order), and the ranges are
    those of ONNX Runtime's own calibration session, to the bit."""
    sessions: list[Any] = []
    augmented = tmp_path / "augmented.onnx"
    real_session = int8_calibration.calibration_session

    def kept(path: Path, providers: list[str]) -> Any:  # the augmented file lives in a folder removed at the end
        shutil.copyfile(path, augmented)
        sessions.append(real_session(path, providers))
        return sessions[-1]

    monkeypatch.setattr(int8_calibration, "calibration_session", kept)
    ours = calibrate(convnet_onnx.path, calib_images)
    (session,) = sessions
    monkeypatch.setattr(int8_calibration, "calibration_session",
                        lambda path, providers: ort.InferenceSession(str(path), providers=providers,
                                                                     sess_options=_no_optimisation()))
    default = calibrate(convnet_onnx.path, calib_images)
    assert sorted(ours.ranges.keys()) == sorted(default.ranges.keys()) and len(ours.ranges.keys()) > 3
    for name in ours.ranges.keys():
        for a, b in zip(ours.ranges[name].range_value, default.ranges[name].range_value, strict=True):
            assert np.array_equal(a, b), name
    order = _kernel_order(session.get_session_options(), augmented, calib_images[:1], tmp_path)
    network = [n for n in order if not n.endswith(("_ReduceMin", "_ReduceMax", "_Reshape"))]
    produced = {o: n.name for n in onnx.load(augmented).graph.node for o in n.output}
    reduced = [n for n in order if n.endswith(("_ReduceMin", "_ReduceMax"))]
    assert len(reduced) == 2 * len(ours.ranges.keys())
    for reduction in reduced:
        tensor = reduction.rpartition("_")[0]
        ran_before = [n for n in network if order.index(n) < order.index(reduction)]
        assert ran_before[-1:] == ([produced[tensor]] if tensor in produced else []), reduction
    default_order = _kernel_order(_no_optimisation(), augmented, calib_images[:1], tmp_path)
    assert order.index(reduced[0]) < order.index(network[-1])
    assert all(default_order.index(r) > default_order.index(network[-1]) for r in reduced)  # the default: at the end


def _no_optimisation() -> ort.SessionOptions:
    """ONNX Runtime's own calibration session options (``CalibraterBase.create_inference_session``)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_histogram_calibration_called_one_batch_at_a_time_counts_every_value_once(
    method: str, convnet_onnx: ExportResult, calib_images: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The histogram methods read one batch per ``collect_data`` call (4 calls for 64 images in batches of 16), so
    ONNX Runtime holds one batch's tensors, not the calibration set's. Against one call over every batch (ONNX
    Runtime's own way), each tensor's histogram has the same minimum and maximum and reaches at least as far (its
    bins, set by the first batch, are extended by whole bins); entropy's counts every value, percentile's (of |x|,
    whose bins start at the first batch's smallest |x| and are extended upwards only) leaves out the later values
    below that start, exactly those; on one batch of data the two give the same histograms and ranges."""
    config = QuantConfig(calibration_method=method)
    q = ort_quantization()
    made: list[Any] = []
    real_create = q.create_calibrator
    monkeypatch.setattr(q, "create_calibrator", lambda *a, **k: made.append(real_create(*a, **k)) or made[-1])
    calls: list[int] = []
    real_calls = int8_calibration.calibration_calls
    monkeypatch.setattr(int8_calibration, "calibration_calls",
                        lambda *a: [calls.append(p.rows) or p for p in real_calls(*a)])
    chunked = [calibrate(convnet_onnx.path, x, config) for x in (calib_images, calib_images[:16])]
    assert calls == [16, 16, 16, 16, 16]
    monkeypatch.setattr(int8_calibration, "calibration_calls", lambda reader, _: [reader])
    whole = [calibrate(convnet_onnx.path, x, config) for x in (calib_images, calib_images[:16])]
    histograms = [c.collector.histogram_dict for c in made]  # tensor → (counts, edges, min, max[, threshold])
    assert sorted(histograms[0]) == sorted(histograms[2]) and len(histograms[0]) > 3
    for name, (counts, edges, low, high, *_) in histograms[0].items():
        counts_all, edges_all, low_all, high_all, *_ = histograms[2][name]
        assert (low, high) == (low_all, high_all) and edges[-1] >= edges_all[-1] > 0, name
        if method == "entropy":
            assert counts.sum() == counts_all.sum() and edges[0] <= edges_all[0], name
        else:
            assert counts.sum() <= counts_all.sum() and edges[0] >= edges_all[0], name
        one, one_all = histograms[1][name], histograms[3][name]
        assert all(np.array_equal(a, b) for a, b in zip(one, one_all, strict=True)), name
    graph = onnx.load(convnet_onnx.path).graph
    for name, values in ((graph.input[0].name, calib_images), (graph.output[0].name, _run(convnet_onnx.path,
                                                                                          calib_images))):
        counts, edges = histograms[0][name][:2]
        left_out = int(np.sum(np.abs(values[16:]) < edges[0])) if method == "percentile" else 0
        assert counts.sum() == values.size - left_out, name
        assert left_out > 0 or method == "entropy" or name == graph.input[0].name  # the outputs' smallest |x| moves
    for a, b in zip(chunked[1].ranges.values(), whole[1].ranges.values(), strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a.range_value, b.range_value, strict=True))


def _static_batch_matmul(path: Path) -> Path:
    """y = x @ W with a static batch of 2 in the input's shape."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "w")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "static",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
        initializer=[weight],
    )  # fmt: skip
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]), path)
    return path


def test_static_batch_axis_sets_calibration_batches(tmp_path: Path) -> None:
    source = _static_batch_matmul(tmp_path / "static.onnx")
    calib = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    result = quantize_int8(source, tmp_path / "static.int8.onnx", calib)
    assert result.calibration_samples == 5 and result.integer_kernels == 1
    with pytest.raises(CalibrationError, match="1 calibration samples < static batch 2 of input 'x'"):
        quantize_int8(source, tmp_path / "other.onnx", calib[:1])


def test_convolution_with_generated_weights_stays_float(tmp_path: Path) -> None:
    """A Conv whose kernel is computed in the graph (as in the SSM modal layer) is left in float."""
    import torch
    from torch import nn

    from minreal.export.int8 import dynamic_weight_nodes
    from minreal.export.onnx_export import to_onnx

    class GeneratedKernel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rate = nn.Parameter(torch.tensor([0.5, 0.8]))
            self.head = nn.Linear(2, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            length = x.shape[-1]
            steps = torch.arange(length, dtype=x.dtype).flip(0)
            kernel = (self.rate[:, None] ** steps[None, :]).unsqueeze(1)  # (2, 1, L): depends on the input length
            y = nn.functional.conv1d(nn.functional.pad(x, (length - 1, 0)), kernel, groups=2)
            return self.head(y.mean(-1))

    model = GeneratedKernel().eval()
    x = torch.randn(16, 2, 6)
    to_onnx(model, x[:2], tmp_path / "g.onnx", dynamic_dims={2: "seq"})
    fp32 = onnx.load(str(tmp_path / "g.onnx"))
    conv = [n.name for n in fp32.graph.node if n.op_type == "Conv"]
    gemm = [n.name for n in fp32.graph.node if n.op_type in ("Gemm", "MatMul")]
    excluded = dynamic_weight_nodes(fp32)
    assert conv and set(conv) <= set(excluded)  # computed kernel → the Conv stays float
    assert not set(gemm) & set(excluded)  # the head's stored weights are quantised
    assert any(n.op_type == "Pow" and n.name in excluded for n in fp32.graph.node)  # kernel generation stays float
    result = quantize_int8(tmp_path / "g.onnx", tmp_path / "g.int8.onnx", x.numpy(), QuantConfig())
    assert not result.saturates_here  # `cpu` picks a format this CPU's int8 kernels cannot saturate
    assert set(conv) <= set(result.excluded_nodes)
    assert result.integer_kernels >= 1  # the Linear head is still quantised
    q = _run(result.out_path, x.numpy())
    ref = model(x).detach().numpy()
    assert np.linalg.norm(q - ref) / np.linalg.norm(ref) < 0.05


def test_float_roundtrips_are_left_in_float(tmp_path: Path) -> None:
    """An edge Pad and a Conv with a computed kernel between two stored-weight Linears: quantised as they come, ORT
    runs them in float between a DequantizeLinear and a QuantizeLinear; by default they are left in float instead.
    (A constant zero Pad would run on the quantised tensor: test_qdq_pads.)"""
    from torch import nn

    from minreal.export.onnx_export import to_onnx
    from minreal.runtime_bench.model_info import float_roundtrip_nodes, optimized_graph

    class FloatChain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rate = nn.Parameter(torch.tensor([0.5, 0.7, 0.8, 0.9]))
            self.inp, self.out = nn.Linear(3, 4), nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, length, 3)
            v = self.inp(x).transpose(1, 2)
            length = v.shape[-1]
            kernel = (self.rate[:, None] ** torch.arange(length, dtype=x.dtype).flip(0)[None, :]).unsqueeze(1)
            y = nn.functional.conv1d(nn.functional.pad(v, (length - 1, 0), mode="replicate"), kernel, groups=4)
            return self.out(y.transpose(1, 2))

    torch.manual_seed(0)
    model, x = FloatChain().eval(), torch.randn(32, 8, 3)
    to_onnx(model, x[:2], tmp_path / "c.onnx", dynamic_dims={1: "seq"})
    kept = quantize_int8(tmp_path / "c.onnx", tmp_path / "kept.onnx", x.numpy(), QuantConfig(drop_roundtrips=False))
    dropped = quantize_int8(tmp_path / "c.onnx", tmp_path / "dropped.onnx", x.numpy())
    assert {"Pad", "Conv"} <= set(kept.float_roundtrips) and kept.roundtrip_nodes == []
    assert not {"Pad", "Conv"} & set(dropped.float_roundtrips)
    still = {n.name for n in float_roundtrip_nodes(optimized_graph(Path(dropped.out_path), "cpu"))}
    assert dropped.roundtrip_nodes and not set(dropped.roundtrip_nodes) & still  # each one's round trip is gone
    assert set(dropped.roundtrip_nodes) <= set(dropped.excluded_nodes)
    assert dropped.integer_kernels == kept.integer_kernels == 2  # both Linears stay integer
    assert not kept.saturates_here and not dropped.saturates_here  # `cpu`: a format this CPU cannot saturate
    ref = model(x).detach().numpy()
    for result in (kept, dropped):
        assert np.linalg.norm(_run(result.out_path, x.numpy()) - ref) / np.linalg.norm(ref) < 0.05


def test_roundtrips_a_quantised_neighbour_keeps_are_not_dropped(tmp_path: Path) -> None:
    """Linear → LayerNorm → Linear: both Linears quantise the LayerNorm's tensors, so leaving it in float removes no
    Q/DQ pair; the first quantisation is kept and nothing is reported as dropped."""
    from torch import nn

    from minreal.export.onnx_export import to_onnx

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3)).eval(), torch.randn(32, 6)
    to_onnx(model, x[:2], tmp_path / "ln.onnx")
    kept = quantize_int8(tmp_path / "ln.onnx", tmp_path / "kept.onnx", x.numpy(), QuantConfig(drop_roundtrips=False))
    dropped = quantize_int8(tmp_path / "ln.onnx", tmp_path / "dropped.onnx", x.numpy())
    assert kept.float_roundtrips  # the LayerNorm runs in float between a dequantise and a re-quantise
    assert dropped.roundtrip_nodes == [] and dropped.float_roundtrips == kept.float_roundtrips
    assert dropped.excluded_nodes == kept.excluded_nodes
    assert np.array_equal(_run(dropped.out_path, x.numpy()), _run(kept.out_path, x.numpy()))


def _weight_tensors(path: str | Path) -> list[np.ndarray]:
    """The int8 weight initializers of a QDQ file (inputs of the DequantizeLinear nodes that feed Conv/Gemm)."""
    model = onnx.load(str(path))
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return [values[n.input[0]] for n in model.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in values and values[n.input[0]].dtype == np.int8
            and values[n.input[0]].ndim > 1]


def test_avx2_target_writes_weights_that_cannot_saturate(convnet_onnx: ExportResult, calib_images: np.ndarray,
                                                         tmp_path: Path) -> None:
    """cpu-avx2: uint8 activations and 7-bit weights, so a pair of products in ORT's int16 step (VPMADDUBSW) is at
    most 2·255·64 = 32640 <= 32767 (no saturation on any x86 CPU); cpu-vnni keeps the full [-127, 127]."""
    avx2 = quantize_int8(convnet_onnx.path, tmp_path / "avx2.onnx", calib_images, QuantConfig(target="cpu-avx2"))
    vnni = quantize_int8(convnet_onnx.path, tmp_path / "vnni.onnx", calib_images, QuantConfig(target="cpu-vnni"))
    assert (avx2.target, avx2.weight_bits, avx2.activation_type) == ("cpu-avx2", 7, "uint8")
    assert (vnni.target, vnni.weight_bits) == ("cpu-vnni", 8) and not avx2.saturates_here
    widest = max(int(np.abs(w.astype(np.int32)).max()) for w in _weight_tensors(avx2.out_path))
    assert widest == 64 and 2 * 255 * widest <= np.iinfo(np.int16).max  # each channel's largest weight maps to 64
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in _weight_tensors(vnni.out_path)) == 127
    assert avx2.integer_kernels == vnni.integer_kernels == 3
    ref = _run(convnet_onnx.path, calib_images)
    assert np.linalg.norm(_run(avx2.out_path, calib_images) - ref) / np.linalg.norm(ref) < 0.1


@pytest.fixture(scope="module")
def arm64_int8(convnet_onnx: ExportResult, calib_images: np.ndarray, tmp_path_factory: pytest.TempPathFactory):
    return quantize_int8(convnet_onnx.path, tmp_path_factory.mktemp("q") / "arm64.int8.onnx", calib_images,
                         QuantConfig(target="arm64"))


def _dequantize_inputs(model: onnx.ModelProto) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """DequantizeLinear output → (stored integers or ``None`` for a computed input, scale, zero point)."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.output[0]: (values.get(n.input[0]), values[n.input[1]], values[n.input[2]])
            for n in model.graph.node if n.op_type == "DequantizeLinear"}


def test_arm64_target_writes_symmetric_int8_activations_and_per_channel_int8_weights(arm64_int8) -> None:
    """S8S8 for ONNX Runtime's ARM64 kernels: every activation quantiser int8 with zero point 0 (symmetric), every
    weight int8, per output channel, zero point 0, each channel's largest weight on ±127 (8 bits, no reduce_range);
    biases int32 on the grid s_x·s_w (zero point 0); the RGB stem not widened (an x86 rule)."""
    assert (arm64_int8.target, arm64_int8.requested_target, arm64_int8.quant_format) == ("arm64", "arm64", "QDQ")
    assert (arm64_int8.activation_type, arm64_int8.activation_symmetric) == ("int8", True)
    assert (arm64_int8.weight_type, arm64_int8.weight_bits, arm64_int8.per_channel) == ("int8", 8, True)
    assert arm64_int8.quantized_bias and arm64_int8.roundtrip_nodes == []
    model = onnx.load(arm64_int8.out_path)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    quantizers = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert len(quantizers) == 8
    for n in quantizers:
        zero = values[n.input[2]]
        assert zero.dtype == np.int8 and zero.shape == () and zero == 0
    dq = _dequantize_inputs(model)
    layers = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    assert len(layers) == 3
    for n in layers:
        weight, w_scale, w_zero = dq[n.input[1]]
        assert weight.dtype == np.int8 and w_zero.dtype == np.int8 and not w_zero.any()
        assert w_scale.shape == (weight.shape[0],)  # one scale per output channel
        assert np.array_equal(np.abs(weight.reshape(len(weight), -1).astype(np.int32)).max(1),
                              np.full(len(weight), 127))
        bias, b_scale, b_zero = dq[n.input[2]]
        x_scale = dq[n.input[0]][1]
        assert bias.dtype == np.int32 and not b_zero.any()
        np.testing.assert_allclose(b_scale, x_scale * w_scale, rtol=1e-6)
    assert dq[layers[0].input[1]][0].shape[1] == 3 and "Pad" not in arm64_int8.node_counts


def test_every_session_of_an_arm64_file_runs_arm_s_graph(arm64_int8, convnet_onnx: ExportResult) -> None:
    """An INT8 file names its target in its metadata, and every session minreal opens of an arm64 file (accuracy,
    parity, timing) runs the graph ONNX Runtime builds for ARM: int8 activations kept (no uint8 QuantizeLinear left),
    as with ``ARM_GRAPH_CONFIG`` given; ``config={}`` runs this machine's own graph, where an x86 build rewrites them to
    uint8. A fp32 file gets neither."""
    from minreal.facts import INT8_TARGET_KEY
    from minreal.runtime_bench.cpu import ARM_GRAPH_CONFIG
    from minreal.runtime_bench.model_info import model_info, optimized_graph

    meta = {p.key: p.value for p in onnx.load(arm64_int8.out_path).metadata_props}
    assert meta[INT8_TARGET_KEY] == "arm64" == model_info("q", Path(arm64_int8.out_path)).int8_target

    def quantised_types(config: dict[str, str] | None) -> set[int]:
        graph = optimized_graph(Path(arm64_int8.out_path), config=config)
        zeros = {t.name: t.data_type for t in graph.initializer}
        return {zeros[n.input[2]] for n in graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2}

    arm = quantised_types(dict(ARM_GRAPH_CONFIG))
    assert quantised_types(None) == arm == {onnx.TensorProto.INT8}
    if cpu_facts.cpu_isa().is_x86:
        assert onnx.TensorProto.UINT8 in quantised_types({})
    assert INT8_TARGET_KEY not in {p.key for p in onnx.load(convnet_onnx.path).metadata_props}


_FLOAT32_STEPS = 1e-4
"""How far, in quantisation steps, float32 requantisation can move a value: a value below 128 steps carries relative
rounding of a few 2^-24 (multiplier, product, division), under 1e-4 steps; the reference is float64."""


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _quantize(u: torch.Tensor, slack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(round(u) clipped to int8's [-128, 127], bound in steps on |round(u') - round(u)| for any |u' - u| <= slack).

    With r = |u - round(u)|: round(u') = round(u) unless slack >= 1/2 - r (u' can cross a tie), and in any case
    |round(u') - round(u)| <= slack + r + 1/2, an integer, so at most its floor; clipping changes no bound."""
    r = (u - torch.round(u)).abs()
    crosses = slack >= 0.5 - r
    return torch.round(u).clamp(-128, 127), torch.where(crosses, torch.floor(slack + r + 0.5), torch.zeros_like(u))


def _qdq_reference(model: onnx.ModelProto, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The QDQ graph evaluated in float64, as its nodes say (dequantised weights and biases, every quantiser
    rounding half to even): what ONNX Runtime's integer kernels compute (exact int32 sums, one requantisation per
    quantiser) up to float32 rounding. Returns the output and a bound on |ONNX Runtime - reference| at each output
    element: zero unless a rounding on its path lies within float32 error (plus what reaches it from upstream) of a
    tie (:func:`_quantize`); a difference propagates through a layer by |W|, through a mean by the mean."""
    consts = {t.name: torch.from_numpy(numpy_helper.to_array(t).astype(np.float64)) for t in model.graph.initializer}
    value = {model.graph.input[0].name: torch.from_numpy(x.astype(np.float64))}
    error = {model.graph.input[0].name: torch.zeros_like(value[model.graph.input[0].name])}
    get = lambda name: (value[name], error[name]) if name in value else (consts[name], 0.0)  # noqa: E731
    for n in model.graph.node:
        (a, e), out = get(n.input[0]), n.output[0]
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            scale = consts[n.input[1]]
            if scale.ndim:  # per channel along the weight's axis
                scale = scale.reshape([-1 if d == _attribute(n, "axis", 1) else 1 for d in range(a.ndim)])
            if n.op_type == "QuantizeLinear":
                value[out], error[out] = _quantize(a / scale, e / scale + _FLOAT32_STEPS)
            else:
                value[out], error[out] = a * scale, e * scale
        elif n.op_type == "Conv":
            w, b = value[n.input[1]], value[n.input[2]]
            pad, stride = _attribute(n, "pads", [0, 0, 0, 0])[:2], _attribute(n, "strides", [1, 1])
            conv = functools.partial(torch.nn.functional.conv2d, stride=stride, padding=pad)
            value[out], error[out] = conv(a, w, b), conv(e, w.abs())
        elif n.op_type == "Gemm":
            w = value[n.input[1]].T if _attribute(n, "transB", 0) else value[n.input[1]]
            value[out], error[out] = a @ w + value[n.input[2]], e @ w.abs()
        elif n.op_type == "Relu":
            value[out], error[out] = a.clamp(min=0), e
        elif n.op_type == "GlobalAveragePool":
            value[out], error[out] = a.mean((2, 3), keepdim=True), e.mean((2, 3), keepdim=True)
        elif n.op_type == "Reshape":
            shape = [int(d) for d in consts[n.input[1]]]
            value[out], error[out] = a.reshape(shape), e.reshape(shape)
        else:
            raise AssertionError(f"no reference for {n.op_type}")
    name = model.graph.output[0].name
    return value[name].numpy(), error[name].numpy()


def test_arm64_file_runs_here_as_its_qdq_graph_says(arm64_int8, calib_images: np.ndarray) -> None:
    """ONNX Runtime on this x86 CPU runs the arm64 file (its int8 activations turned into uint8 by ORT's x86 graph)
    as its QDQ graph computes with dequantised weights (:func:`_qdq_reference`), on two batch sizes: bit for bit but
    where a rounding sits within float32 error of a tie, and there within the propagated bound. The session asks
    for ONNX Runtime's x64 precision mode (``session.x64quantprecision``: uint8 weights where the CPU's u8·s8 kernel
    could saturate an int16), so the integer sums are exact on any x86 CPU, with or without VNNI."""
    model = onnx.load(arm64_int8.out_path)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    session = ort.InferenceSession(arm64_int8.out_path, options, providers=["CPUExecutionProvider"])
    for x in (calib_images, calib_images[:1]):
        (int8,) = session.run(None, {session.get_inputs()[0].name: x})
        reference, bound = _qdq_reference(model, x)
        assert int8.shape == reference.shape
        assert np.all(np.abs(int8 - reference) <= bound + 1e-6 * np.abs(reference)), np.abs(int8 - reference).max()
        assert np.mean(bound == 0) >= 0.5  # most outputs are bit-exact: the bound is not vacuous


_AVX2 = CpuIsa("x86_64", ("avx2",), "/proc/cpuinfo")
@pytest.mark.parametrize("saturates", [True, False])
def test_cpu_target_resolves_by_the_detected_cpu(saturates: bool, convnet_onnx: ExportResult,
                                                 calib_images: np.ndarray, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Both branches on one machine: the detection is overridden; ``cpu`` writes 7-bit weights exactly when the
    (pretended) CPU's kernel saturates, and the result says so."""
    isa = _AVX2 if saturates else CpuIsa("x86_64", ("avx2", "avx512_vnni"), "/proc/cpuinfo")
    monkeypatch.setattr(cpu_facts, "cpu_isa", lambda: isa)
    monkeypatch.setattr(cpu_facts, "u8s8_saturates", lambda: None)
    result = quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", calib_images)
    assert (result.requested_target, result.target) == ("cpu", "cpu-avx2" if saturates else "cpu-vnni")
    assert result.weight_bits == (7 if saturates else 8) and not result.saturates_here
    pinned = quantize_int8(convnet_onnx.path, tmp_path / "v.onnx", calib_images, QuantConfig(target="cpu-vnni"))
    assert pinned.saturates_here == saturates  # an explicit 8-bit file on a saturating CPU is flagged


def test_failed_shape_inference_leaves_nothing_in_the_working_directory(convnet_onnx: ExportResult,
                                                                        calib_images: np.ndarray, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Runtime's symbolic shape inference saves ``sym_shape_infer_temp.onnx`` (and its data file) into the
    current directory when it fails (as on the SSM demo model); quantisation runs it in its own work folder."""
    import onnxruntime.quantization.shape_inference as shape_inference

    real = shape_inference.quant_pre_process

    def failing(source: str, dest: str, **options: object) -> None:
        if not options.get("skip_symbolic_shape"):
            Path("sym_shape_infer_temp.onnx").write_bytes(b"debug copy")  # what ORT does, relative to the cwd
            raise RuntimeError("Incomplete symbolic shape inference")
        real(source, dest, **options)

    monkeypatch.setattr(shape_inference, "quant_pre_process", failing)
    user = tmp_path / "user"
    user.mkdir()
    monkeypatch.chdir(user)
    result = quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", calib_images)
    assert "without symbolic shapes" not in (result.preprocess_note or "x")  # the second attempt succeeded
    assert "Incomplete symbolic shape inference" in result.preprocess_note
    assert list(user.iterdir()) == [] and Path.cwd() == user


def test_a_kept_block_pre_processes_one_file_once_with_its_note_and_warnings(
        convnet_onnx: ExportResult, calib_images: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Inside preprocessed_kept, ONNX Runtime's pre-processing of one float file runs once per align setting: later
    quantisations get the same graph (files to the bit), the same note and the same warning; another align setting
    or file runs again; outside the block every call runs."""
    import onnxruntime.quantization.shape_inference as shape_inference

    from minreal.export.int8.preprocess import preprocessed_kept

    calls: list[bool] = []
    real = shape_inference.quant_pre_process

    def failing_first(source: str, dest: str, **options: object) -> None:
        calls.append(bool(options.get("skip_symbolic_shape")))
        if not options.get("skip_symbolic_shape"):
            raise RuntimeError("Incomplete symbolic shape inference")
        real(source, dest, **options)

    monkeypatch.setattr(shape_inference, "quant_pre_process", failing_first)
    outside = quantize_int8(convnet_onnx.path, tmp_path / "outside.onnx", calib_images)
    assert calls == [False, True]
    calls.clear()
    with preprocessed_kept():
        caplog.clear()
        results = [quantize_int8(convnet_onnx.path, tmp_path / f"q{i}.onnx", calib_images) for i in range(3)]
        assert calls == [False, True]  # once for three quantisations
        warned = [r.getMessage() for r in caplog.records if "symbolic shape inference" in r.getMessage()]
        assert len(warned) == 3 and len(set(warned)) == 1
        quantize_int8(convnet_onnx.path, tmp_path / "plain.onnx", calib_images, QuantConfig(align_channels=False))
        assert calls == [False, True, False, True]  # another align setting
        twin = tmp_path / "twin.onnx"
        shutil.copyfile(convnet_onnx.path, twin)
        quantize_int8(twin, tmp_path / "twin.int8.onnx", calib_images)
        assert len(calls) == 6  # another file (its note and warnings name it)
    assert {r.preprocess_note for r in results} == {outside.preprocess_note}
    assert {(tmp_path / f"q{i}.onnx").read_bytes() for i in range(3)} == {(tmp_path / "outside.onnx").read_bytes()}
    quantize_int8(convnet_onnx.path, tmp_path / "after.onnx", calib_images)
    assert len(calls) == 8


class _MeanHead(torch.nn.Module):
    """Two convolutions, then a mean over the spatial axes that drops them (a ``ReduceMean`` without kept axes, which
    ONNX Runtime's CPU graph runs in float between a dequantise and a re-quantise) and a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


@pytest.fixture(scope="module")
def mean_head_onnx(calib_images: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    from minreal.export.onnx_export import to_onnx

    torch.manual_seed(12)
    return to_onnx(_MeanHead().eval(), torch.from_numpy(calib_images[:2]), tmp_path_factory.mktemp("mean") / "m.onnx")


@pytest.mark.parametrize("target", ["cpu", "tensorrt"])
def test_ranges_calibrated_once_give_the_file_of_a_fresh_calibration(target: str, mean_head_onnx: ExportResult,
                                                                     calib_images: np.ndarray, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte for byte, with and without nodes in float: quantising with :func:`calibrate`'s ranges, quantising from
    scratch (one calibration for all its rounds), and ONNX Runtime calibrating inside every ``quantize_static``
    (as where it reads no calibration cache) write the same file; the results differ only in their path."""
    import onnxruntime.quantization as ort_quantization

    config = QuantConfig(target=target)
    calibrations, rounds = [], []
    real_calibrated, real_static = int8_calibration._calibrated, ort_quantization.quantize_static
    monkeypatch.setattr(int8_calibration, "_calibrated", lambda *a: calibrations.append(a) or real_calibrated(*a))
    monkeypatch.setattr(ort_quantization, "quantize_static",
                        functools.wraps(real_static)(lambda *a, **k: rounds.append(k) or real_static(*a, **k)))
    calibration = calibrate(mean_head_onnx.path, calib_images, config)
    assert len(calibrations) == 1 and (calibration.samples, calibration.random) == (64, False)
    for exclude in ([], quantizable_nodes(mean_head_onnx.path)[-1:]):
        reused = quantize_int8(mean_head_onnx.path, tmp_path / "reused.onnx", None, config, exclude=exclude,
                               calibration=calibration)
        rounds.clear()
        fresh = quantize_int8(mean_head_onnx.path, tmp_path / "fresh.onnx", calib_images, config, exclude=exclude)
        assert len(calibrations) == 2 and rounds and all("calibration_cache_path" in k for k in rounds)
        if target == "cpu" and not exclude:
            assert len(rounds) > 1  # the float round trips were tried in float: more quantisations, no calibration
        with monkeypatch.context() as patch:
            patch.setattr(int8_calibration, "reusable_calibration", lambda: False)
            inline = quantize_int8(mean_head_onnx.path, tmp_path / "inline.onnx", calib_images, config,
                                   exclude=exclude)
        assert len(calibrations) == 2  # only the fresh file was calibrated here: ONNX Runtime calibrated the inline one
        calibrations.pop()
        assert (tmp_path / "reused.onnx").read_bytes() == (tmp_path / "fresh.onnx").read_bytes()
        assert (tmp_path / "inline.onnx").read_bytes() == (tmp_path / "fresh.onnx").read_bytes()
        assert dataclasses.replace(reused, out_path=fresh.out_path) == fresh
        assert dataclasses.replace(inline, out_path=fresh.out_path) == fresh
        assert set(exclude) <= set(reused.excluded_nodes) and reused.calibration_samples == 64


def test_ranges_of_another_graph_or_method_are_refused(convnet_onnx: ExportResult, two_heads_onnx: ExportResult,
                                                       calib_images: np.ndarray, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calibration = calibrate(convnet_onnx.path, calib_images)
    with pytest.raises(ValueError, match="calibrated on another graph"):
        quantize_int8(two_heads_onnx.path, tmp_path / "q.onnx", None, calibration=calibration)
    with pytest.raises(ValueError, match="calibrated with 'minmax' but the config asks for 'entropy'"):
        quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", None, QuantConfig(calibration_method="entropy"),
                      calibration=calibration)
    with pytest.raises(ValueError, match="calibration= is for mode='static'"):
        quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", None, QuantConfig(mode="dynamic"),
                      calibration=calibration)
    with pytest.raises(ValueError, match="mode='dynamic' calibrates nothing"):
        calibrate(convnet_onnx.path, calib_images, QuantConfig(mode="dynamic"))
    monkeypatch.setattr(int8_calibration, "reusable_calibration", lambda: False)
    with pytest.raises(QuantizationError, match="calibration_cache_path"):
        calibrate(convnet_onnx.path, calib_images)
    with pytest.raises(QuantizationError, match="calibration_cache_path"):
        quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", None, calibration=calibration)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def cut_resnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, int]:
    """A CIFAR ResNet-8 (option-A shortcuts, one block per stage; random weights, BatchNorm statistics as after
    training) cut by ``magnitude`` to about half of its MACs, exported as ``minreal`` exports a variant: (file,
    calibration images, number of its convolutions)."""
    from minreal.compress.core.data import Dataset
    from minreal.compress.methods.magnitude import MagnitudeConfig
    from minreal.compress.models import CifarResNet
    from minreal.compress.registry import compress
    from minreal.export.settings import VariantConfig
    from minreal.export.variant import export_variant

    torch.manual_seed(0)
    model = CifarResNet(blocks_per_stage=1).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(32, 3, 16, 16)
    # importance weighting "none" narrows the residual stream first, which is what this fixture needs
    config = MagnitudeConfig(mac_ratio=0.5, importance_weighting="none")
    small, report = compress(model, Dataset(x), "magnitude", config)
    streams = report.predicted["segment_widths"]["conv1"]
    assert any(kept < size for size, kept in streams)  # the option-A streams themselves are cut
    folder = tmp_path_factory.mktemp("cut")
    record = export_variant(small, x, folder / "cut.onnx", VariantConfig())
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in small.modules())
    return folder / record.onnx, x.numpy(), convs


@pytest.mark.parametrize("target", ["cpu-avx2", "cpu-vnni"])
def test_width_cut_resnet_int8_keeps_shortcuts_and_convolutions_in_integers(target: str, cut_resnet, tmp_path: Path
                                                                            ) -> None:
    """Issue 28: in ONNX Runtime's optimised CPU graph of a width-cut option-A ResNet's INT8 file, the shortcuts'
    subsample (Slice) and zero channels (Pad) run on quantised tensors (no DequantizeLinear before them, no
    QuantizeLinear after them), every residual sum is a QLinearAdd, and every convolution and the classifier are
    integer kernels. Graph structure only: the same on any x86 CPU, with or without VNNI."""
    from minreal.runtime_bench.model_info import float_roundtrip_nodes, op_counts, optimized_graph

    path, x, convs = cut_resnet
    result = quantize_int8(path, tmp_path / "cut.int8.onnx", x, QuantConfig(target=target))
    graph = optimized_graph(Path(result.out_path), "cpu")
    ops = op_counts(graph)
    assert result.integer_kernels == convs + 1 and result.float_kernels == 0  # the Linear head: QGemm
    assert ops["QLinearConv"] == convs and ops["QLinearAdd"] == 3  # one residual sum per block
    producer = {o: n.op_type for n in graph.node for o in n.output}
    readers: dict[str, set[str]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, set()).add(n.op_type)
    shortcut = [n for n in graph.node if n.op_type in ("Slice", "Pad")]
    # stages 2 and 3 change width through option A; a Pad named *_channel_pad widens the RGB stem (qdq_channels)
    assert len([n for n in shortcut if n.op_type == "Pad" and "_channel_pad" not in n.name]) == 2 and ops["Slice"] == 2
    assert all(producer.get(n.input[0]) != "DequantizeLinear" and "QuantizeLinear" not in readers[n.output[0]]
               for n in shortcut)
    assert not {n.op_type for n in float_roundtrip_nodes(graph)}  # the pooling runs quantised too
    assert ops["QuantizeLinear"] == 1 and ops["DequantizeLinear"] == 1  # the graph's input and output only
    assert result.float_roundtrips == {}
    reference = _run(path, x)
    assert np.linalg.norm(_run(result.out_path, x) - reference) / np.linalg.norm(reference) < 0.1


def test_arm64_resnet_counts_the_kernels_of_the_graph_onnx_runtime_builds_for_arm(cut_resnet, tmp_path: Path) -> None:
    """An arm64 file's kernels are those of ONNX Runtime's ARM graph (``session.qdqisint8allowed=1``, what an ARM
    build does by itself): every convolution, the classifier and every residual sum in int8, the shortcuts' zero
    pads on quantised tensors. Only the ReLUs run in float between a dequantise and a re-quantise: with symmetric
    activations their zero point is 0, not int8's minimum, so ONNX Runtime cannot fold them into the convolution
    (``ReluQuantFusion``); round-trip dropping, which reads a graph optimised here, is not applied."""
    from minreal.runtime_bench.cpu import ARM_GRAPH_CONFIG
    from minreal.runtime_bench.model_info import op_counts, optimized_graph

    path, x, convs = cut_resnet
    result = quantize_int8(path, tmp_path / "cut.arm64.onnx", x, QuantConfig(target="arm64"))
    ops = op_counts(optimized_graph(Path(result.out_path), "cpu", config=ARM_GRAPH_CONFIG))
    assert result.integer_kernels == convs + 1 and result.float_kernels == 0  # the Linear head: QGemm
    assert ops["QLinearConv"] == convs and ops["QLinearAdd"] == 3 and ops["Pad"] == 2
    assert set(result.float_roundtrips) == {"Relu"} and result.roundtrip_nodes == []
    reference = _run(path, x)
    assert np.linalg.norm(_run(result.out_path, x) - reference) / np.linalg.norm(reference) < 0.1
