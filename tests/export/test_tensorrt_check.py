"""Tests for minreal.export.tensorrt_check: the static fallback, and through a fake ``tensorrt`` module the calls made
to TensorRT's API (parser errors by node, optimisation profiles, flags per precision, builds, parity)."""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import minreal.export.tensorrt_check as tc
from minreal.export.readiness import tensorrt_readiness
from minreal.export.tensorrt_check import ShapeRange, Tolerance, tensorrt_check
from minreal.runtime_bench.sessions import create_session


def _save(tmp_path: Path, name: str, nodes: list[onnx.NodeProto], dims: list[Any], inits: list[Any] = (),
          domains: tuple[str, ...] = ()) -> Path:
    """A graph x -> ... -> y with input/output dims ``dims`` (strings are dynamic), saved unchecked."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], list(inits))
    opsets = [helper.make_opsetid("", 18), *(helper.make_opsetid(d, 1) for d in domains)]
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


@pytest.fixture
def float_file(tmp_path: Path) -> Path:
    return _save(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="act")], ["batch", 3, 4, 4])


@pytest.fixture
def qdq_file(tmp_path: Path) -> Path:
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q0"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq0"),
             helper.make_node("Relu", ["d"], ["y"], name="act")]
    return _save(tmp_path, "qdq", nodes, ["batch", 8], inits)


class _Dims(tuple):
    """What ``ITensor.shape`` gives: dims with -1 for a dynamic axis."""


def fake_tensorrt(version: str = "10.3.0", unsupported: frozenset[str] = frozenset(), build_ok: bool = True,
                  node_names: bool = True, flags: tuple[str, ...] = ("FP16", "INT8", "TF32"),
                  builder_error: str | None = None) -> ModuleType:
    """A stand-in for ``tensorrt`` with TensorRT's Python API shape; ``trt.calls`` records what was called."""
    trt = ModuleType("tensorrt")
    trt.__spec__ = ModuleSpec("tensorrt", None)  # torch._dynamo's import scan calls find_spec("tensorrt")
    trt.__version__, trt.calls = version, []
    record = trt.calls.append

    class ILogger:
        ERROR, INTERNAL_ERROR, WARNING = "ERROR", "INTERNAL_ERROR", "WARNING"

    trt.ILogger = ILogger
    trt.BuilderFlag = SimpleNamespace(**{f: f for f in flags})
    trt.MemoryPoolType = SimpleNamespace(WORKSPACE="WORKSPACE")
    trt.NetworkDefinitionCreationFlag = SimpleNamespace(EXPLICIT_BATCH=0)

    class Network:
        def __init__(self) -> None:
            self.inputs: list[SimpleNamespace] = []

        @property
        def num_inputs(self) -> int:
            return len(self.inputs)

        def get_input(self, i: int) -> SimpleNamespace:
            return self.inputs[i]

    def _error(desc: str, index: int, name: str, op: str) -> SimpleNamespace:
        extra = {"node_name": lambda: name, "node_operator": lambda: op} if node_names else {}
        return SimpleNamespace(desc=lambda: desc, node=lambda: index, **extra)

    class OnnxParser:
        def __init__(self, network: Network, logger: ILogger) -> None:
            self.network, self.errors = network, []

        def parse_from_file(self, path: str) -> bool:
            record(("parse_from_file", path))
            graph = onnx.load(path).graph
            for i in graph.input:
                dims = _Dims(d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim)
                self.network.inputs.append(SimpleNamespace(name=i.name, shape=dims))
            self.errors = [_error(f"No importer registered for op: {n.op_type}", k, n.name, n.op_type)
                           for k, n in enumerate(graph.node) if n.op_type in unsupported]
            return not self.errors

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, i: int) -> SimpleNamespace:
            return self.errors[i]

    class Config:
        def set_memory_pool_limit(self, pool: str, size: int) -> None:
            record(("set_memory_pool_limit", pool, size))

        def set_flag(self, flag: str) -> None:
            record(("set_flag", flag))

        def clear_flag(self, flag: str) -> None:
            record(("clear_flag", flag))

        def add_optimization_profile(self, profile: Any) -> int:
            record(("add_optimization_profile",))
            return 0

    class Profile:
        def set_shape(self, name: str, lo: tuple, mid: tuple, hi: tuple) -> None:
            record(("set_shape", name, tuple(lo), tuple(mid), tuple(hi)))

    class Builder:
        def __init__(self, logger: ILogger) -> None:
            if builder_error:
                raise TypeError(builder_error)
            self.logger = logger

        def create_network(self, flags: int) -> Network:
            record(("create_network", flags))
            return Network()

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes | None:
            record(("build_serialized_network",))
            if not build_ok:
                self.logger.log(ILogger.ERROR, "Error Code 4: Internal Error (no implementation for node act)\nmore")
                return None
            return b"engine-bytes"

    trt.OnnxParser, trt.Builder = OnnxParser, Builder
    return trt


def _use(monkeypatch: pytest.MonkeyPatch, trt: ModuleType | None) -> ModuleType | None:
    monkeypatch.setitem(sys.modules, "tensorrt", trt)  # None makes `import tensorrt` raise ImportError
    return trt


def _calls(trt: ModuleType, name: str) -> list[tuple]:
    return [c for c in trt.calls if c[0] == name]


def test_without_tensorrt_the_static_check_runs(monkeypatch: pytest.MonkeyPatch, float_file: Path) -> None:
    _use(monkeypatch, None)
    result = tensorrt_check(float_file)
    assert result.checker == ("static check: tensorrt not importable: "
                              "ModuleNotFoundError: import of tensorrt halted; None in sys.modules")
    assert not result.used_tensorrt and result.parsed is None and result.builds == []
    assert result.static == tensorrt_readiness(float_file) and result.ready is True and result.kind == "fp32"


def test_static_fallback_reports_its_findings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _use(monkeypatch, None)
    path = _save(tmp_path, "odd", [helper.make_node("Odd", ["x"], ["y"], domain="com.x", name="n1")], [1, 4],
                 domains=("com.x",))
    result = tensorrt_check(path)
    assert result.ready is False
    assert result.static["issues"] == ["com.x:Odd on 1 node (n1): outside the standard ONNX domain"]


@pytest.mark.parametrize("node_names", [True, False], ids=["trt10-node-names", "trt8-node-index"])
def test_parser_errors_name_the_unsupported_nodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  node_names: bool) -> None:
    trt = _use(monkeypatch, fake_tensorrt(unsupported=frozenset({"Frob"}), node_names=node_names))
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="act"), helper.make_node("Frob", ["h"], ["y"], name="frob_3")]
    result = tensorrt_check(_save(tmp_path, "frob", nodes, ["batch", 4]))
    assert result.checker == "tensorrt 10.3.0" and result.used_tensorrt and result.parsed is False
    assert [i.line() for i in result.unsupported] == ["node 'frob_3' (Frob): No importer registered for op: Frob"]
    assert result.ready is False and result.builds == [] and not _calls(trt, "build_serialized_network")


def test_float_file_gets_a_batch_profile_and_fp32_fp16_builds(monkeypatch: pytest.MonkeyPatch, float_file: Path,
                                                              tmp_path: Path) -> None:
    trt = _use(monkeypatch, fake_tensorrt())
    result = tensorrt_check(float_file, batch=(1, 32, 32), engine_dir=tmp_path / "engines", workspace_bytes=1 << 28)
    assert _calls(trt, "create_network") == [("create_network", 0)]  # explicit batch is TensorRT 10's only mode
    shape = ("set_shape", "x", (1, 3, 4, 4), (32, 3, 4, 4), (32, 3, 4, 4))
    assert _calls(trt, "set_shape") == [shape, shape]  # one profile per build
    assert _calls(trt, "set_memory_pool_limit") == [("set_memory_pool_limit", "WORKSPACE", 1 << 28)] * 2
    assert _calls(trt, "clear_flag") == [("clear_flag", "TF32")] and _calls(trt, "set_flag") == [("set_flag", "FP16")]
    assert result.profile == {"x": {"min": [1, 3, 4, 4], "opt": [32, 3, 4, 4], "max": [32, 3, 4, 4]}}
    assert [(b.precision, b.flags, b.built) for b in result.builds] == [("fp32", [], True), ("fp16", ["FP16"], True)]
    assert all(b.build_seconds is not None and b.build_seconds >= 0 for b in result.builds)
    for b in result.builds:
        assert Path(b.engine_path).read_bytes() == b"engine-bytes" and b.engine_bytes == len(b"engine-bytes")
    if not torch.cuda.is_available():  # the engine cannot run here: not a pass
        assert all("no CUDA device" in b.parity_skipped for b in result.builds) and result.ready is False


def test_qdq_file_builds_int8_with_explicit_quantisation(monkeypatch: pytest.MonkeyPatch, qdq_file: Path,
                                                         float_file: Path) -> None:
    trt = _use(monkeypatch, fake_tensorrt())
    result = tensorrt_check(qdq_file)
    assert result.kind == "int8" and [b.precision for b in result.builds] == ["int8"]
    assert _calls(trt, "set_flag") == [("set_flag", "INT8")] and not _calls(trt, "clear_flag")
    assert _calls(trt, "set_shape") == [("set_shape", "x", (1, 8), (32, 8), (32, 8))]
    with pytest.raises(ValueError, match="int8 needs an explicit QDQ file, but relu.onnx has no Q/DQ nodes"):
        tensorrt_check(float_file, precisions=["int8"])


def test_inputs_dynamic_beyond_the_batch_need_given_shapes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    trt = _use(monkeypatch, fake_tensorrt())
    path = _save(tmp_path, "seq", [helper.make_node("Relu", ["x"], ["y"], name="act")], ["batch", "seq", 4])
    with pytest.raises(ValueError, match=r"input 'x' \[-1, -1, 4\] is dynamic beyond axis 0; give its min/opt/max"):
        tensorrt_check(path, precisions=["fp32"])
    given = ShapeRange((1, 16, 4), (8, 128, 4), (8, 256, 4))
    result = tensorrt_check(path, shapes={"x": given}, precisions=["fp32"])
    assert _calls(trt, "set_shape") == [("set_shape", "x", (1, 16, 4), (8, 128, 4), (8, 256, 4))]
    assert result.profile["x"]["max"] == [8, 256, 4]
    with pytest.raises(ValueError, match="does not fit the input's dims"):
        tensorrt_check(path, shapes={"x": ShapeRange((1, 16, 5), (1, 16, 5), (1, 16, 5))}, precisions=["fp32"])


def test_build_failure_reports_the_builders_error(monkeypatch: pytest.MonkeyPatch, float_file: Path) -> None:
    _use(monkeypatch, fake_tensorrt(build_ok=False))
    result = tensorrt_check(float_file, precisions=["fp32"])
    (build,) = result.builds
    assert not build.built and build.build_seconds is not None and result.ready is False
    assert build.error == "Error Code 4: Internal Error (no implementation for node act)"


def test_tensorrt_without_fp16_flag_says_so(monkeypatch: pytest.MonkeyPatch, float_file: Path) -> None:
    _use(monkeypatch, fake_tensorrt(version="11.0.0", flags=()))
    (fp32, fp16) = tensorrt_check(float_file).builds
    assert fp32.built and not fp16.built and fp16.build_seconds is None
    assert fp16.error.startswith("tensorrt 11.0.0 has no BuilderFlag.FP16")


def test_tensorrt_8_asks_for_explicit_batch(monkeypatch: pytest.MonkeyPatch, float_file: Path) -> None:
    trt = _use(monkeypatch, fake_tensorrt(version="8.6.1"))
    tensorrt_check(float_file, precisions=["fp32"])
    assert _calls(trt, "create_network") == [("create_network", 1)]


def test_no_gpu_for_the_builder_falls_back(monkeypatch: pytest.MonkeyPatch, float_file: Path) -> None:
    _use(monkeypatch, fake_tensorrt(builder_error="pybind11::init(): factory function returned nullptr"))
    result = tensorrt_check(float_file)
    assert result.checker == "static check: tensorrt 10.3.0 cannot create a builder: " \
                             "pybind11::init(): factory function returned nullptr"
    assert not result.used_tensorrt and result.ready is True


def _ort_engine(path: Path, offset: float, shapes: list[tuple[int, ...]]) -> type:
    """A stand-in for EngineRunner that runs ``path`` with ONNX Runtime, adds ``offset`` and logs input shapes."""

    class OrtEngine:
        def __init__(self, trt: ModuleType, engine: bytes, log: Any) -> None:
            self.session = create_session(path)

        def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            shapes.append(feeds["x"].shape)
            return {"y": self.session.run(None, feeds)[0] + offset}

    return OrtEngine


@pytest.mark.parametrize(("offset", "passed"), [(0.0, True), (0.5, False)])
def test_parity_against_onnxruntime_at_min_and_opt_shapes(monkeypatch: pytest.MonkeyPatch, float_file: Path,
                                                          offset: float, passed: bool) -> None:
    _use(monkeypatch, fake_tensorrt())
    shapes: list[tuple[int, ...]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tc, "EngineRunner", _ort_engine(float_file, offset, shapes))
    tolerances = {"fp16": {"y": Tolerance(0.0, 0.1)}}
    result = tensorrt_check(float_file, batch=(1, 32, 32), tolerances=tolerances)
    fp32, fp16 = result.builds
    assert shapes == [(1, 3, 4, 4), (32, 3, 4, 4)] * 2
    assert [(p.output, p.batch_size) for p in fp32.parity] == [("y", 1), ("y", 32)]
    assert fp32.tolerances == {"y": tc.DEFAULT_TOLERANCES["fp32"]} and fp16.tolerances == {"y": Tolerance(0.0, 0.1)}
    assert all(p.max_abs_err == pytest.approx(offset, abs=1e-6) for p in fp32.parity + fp16.parity)
    assert fp32.passed is fp16.passed is result.ready is passed


def test_tolerance_on_the_output_scale_and_shape_ranges_are_checked() -> None:
    assert Tolerance(rtol=0.0, atol=0.01, atol_scale=0.1).atol_for(np.array([[-3.0, 1.0]])) == pytest.approx(0.31)
    with pytest.raises(ValueError, match="min <= opt <= max"):
        ShapeRange((2, 4), (1, 4), (8, 4))
    with pytest.raises(ValueError, match="one rank"):
        ShapeRange((1, 4), (1, 4, 1), (8, 4))


def test_variant_readiness_says_which_check_decided(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """export_variant records the static check unless validation is asked for; then TensorRT decides when it is
    importable (its parser's verdict lands in the record and in report.md), the static check when not."""
    from minreal.app.report import tensorrt_lines
    from minreal.export.settings import VariantConfig
    from minreal.export.variant import export_variant

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    x = torch.randn(8, 4)
    static = export_variant(model, x, tmp_path / "a.onnx", VariantConfig()).tensorrt_readiness
    assert static["checker"].startswith("static check") and static["ready"] is True
    _use(monkeypatch, None)
    missing = export_variant(model, x, tmp_path / "b.onnx", VariantConfig(tensorrt_validation=True))
    assert missing.tensorrt_readiness["checker"].startswith("static check: tensorrt not importable")
    _use(monkeypatch, fake_tensorrt(unsupported=frozenset({"Gemm", "MatMul"})))
    rejected = export_variant(model, x, tmp_path / "c.onnx", VariantConfig(tensorrt_validation=True))
    record = rejected.tensorrt_readiness
    assert record["checker"] == "tensorrt 10.3.0" and record["ready"] is False
    assert record["tensorrt"]["unsupported"] and record["tensorrt"]["parsed"] is False
    lines = tensorrt_lines("small", record)
    assert lines[0] == "- **small** not TensorRT-ready (decided by tensorrt 10.3.0):"
    assert any("TensorRT parser: node" in line and "No importer registered" in line for line in lines[1:])


def test_tolerance_scale_reads_the_largest_finite_magnitude() -> None:
    """TensorRT's per-output tolerance: an inf in ONNX Runtime's output made ``atol`` infinite and a NaN made it NaN;
    the scale is the largest finite magnitude."""
    from minreal.export.tensorrt_check import Tolerance

    tol = Tolerance(rtol=1e-2, atol=1e-3, atol_scale=1e-2)
    assert tol.atol_for(np.array([0.5, -3.0, np.inf, np.nan], dtype=np.float32)) == 1e-3 + 1e-2 * 3.0
    assert tol.atol_for(np.array([np.nan, -np.inf], dtype=np.float32)) == 1e-3
    # with the engine's output: a constant it reproduces exactly (a -1e9 mask) is not the output's scale
    ref = np.array([[0.5, -3.0, -1e9, -1e9]], dtype=np.float32)
    assert tol.atol_for(ref, ref + np.array([[1e-2, 0.0, 0.0, 0.0]], dtype=np.float32)) == 1e-3 + 1e-2 * 3.0
    assert tol.atol_for(ref, ref[:, :2]) == 1e-3 + 1e-2 * 1e9  # another shape: compare_output reports it, as before
