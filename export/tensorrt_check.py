"""TensorRT validation of an ONNX file: parse, build engines, compare with ONNX Runtime; the static check without it.

With ``tensorrt`` importable, :func:`tensorrt_check`

- parses the file with TensorRT's ONNX parser (``OnnxParser.parse_from_file``) and lists every parser error
  by node name and op with the parser's reason (``ParserError.desc()``);
- gives every dynamic network input an optimisation profile (min/opt/max from the caller's shapes, or the
  batch triple on axis 0, e.g. batch 1/32/32);
- builds one engine per precision with ``Builder.build_serialized_network``, timing each build apart from the
  parse: ``fp32`` (TF32 off), ``fp16`` (``BuilderFlag.FP16``) for a float file; ``int8`` for a QDQ file
  (``BuilderFlag.INT8`` with no calibrator: explicit quantisation, the file's own Q/DQ scales);
- runs each engine through an execution context (device buffers are torch CUDA tensors) at the profile's min
  and opt shapes, and compares every output with ONNX Runtime's CPU provider under per-output tolerances.

Without ``tensorrt`` (or when it cannot create a builder, e.g. without a GPU) the static check of
:mod:`minreal.export.readiness` decides instead; :attr:`TensorRTCheck.checker` says which of the two ran
(``"tensorrt 10.3.0"`` or ``"static check: tensorrt not importable: <reason>"``). The static findings are
kept in both cases. This module imports ``tensorrt`` and ``torch`` only inside the calls that need them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import numpy as np
import onnx

from minreal.export.readiness import ReadinessReport, tensorrt_readiness
from minreal.export.verify import OutputParity, compare_output, finite_abs_max, output_scale, run_ort
from minreal.facts import error_line, first_line
from minreal.runtime_bench.atomic import atomic_write_bytes
from minreal.runtime_bench.inputs import Data, input_specs, timing_inputs
from minreal.runtime_bench.sessions import create_session

__all__ = ["PRECISIONS", "DEFAULT_TOLERANCES", "ShapeRange", "Tolerance", "ParserIssue", "EngineBuild",
           "TensorRTCheck", "tensorrt_check", "import_tensorrt", "parser_issues", "profile_shapes", "parity_feeds",
           "EngineRunner"]

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]
PRECISIONS = ("fp32", "fp16", "int8")
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class ShapeRange:
    """An optimisation profile's shapes for one input: TensorRT tunes kernels for ``opt``, accepts min..max."""

    min: Shape
    opt: Shape
    max: Shape

    def __post_init__(self) -> None:
        shapes = (self.min, self.opt, self.max)
        if len({len(s) for s in shapes}) != 1 or any(d < 1 for s in shapes for d in s):
            raise ValueError(f"a shape range needs three shapes of one rank with sizes >= 1, got {shapes}")
        if any(not lo <= mid <= hi for lo, mid, hi in zip(*shapes)):
            raise ValueError(f"a shape range needs min <= opt <= max on every axis, got {shapes}")


@dataclass(frozen=True)
class Tolerance:
    """``|tensorrt - onnxruntime| <= atol + atol_scale * max|onnxruntime| + rtol * |onnxruntime|`` per element.

    ``atol_scale`` judges an element on its output's scale (per output and shape): a sum's rounding error follows
    the size of its terms, not of its result, so an element that cancels to near zero is not held to ``rtol``.
    """

    rtol: float
    atol: float = 0.0
    atol_scale: float = 0.0

    def atol_for(self, reference: np.ndarray, got: np.ndarray | None = None) -> float:
        """The absolute tolerance for one output: ``atol`` plus ``atol_scale`` times its largest finite magnitude
        (an inf element would make the tolerance infinite, a NaN make it NaN); given TensorRT's output ``got``, a
        constant it reproduces exactly (a mask) sets that magnitude only as far as :func:`output_scale` allows."""
        same = got is not None and got.shape == reference.shape  # another shape: compare_output reports it
        scale = output_scale(got, reference, self.atol_scale) if same else finite_abs_max(reference)
        return self.atol + self.atol_scale * scale


#: Tolerances per precision when the caller gives none for an output. fp32 builds have TF32 off. fp16 rounds to
#: 2**-11 at every layer: 10 ulps of relative error and of the output's scale (as :mod:`minreal.export.fp16` allows).
#: int8 engines and ONNX Runtime requantise with different rounding and fusions, which moves outputs by a few
#: quantisation steps (one step of a symmetric int8 output is about 0.8 % of its largest magnitude).
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = MappingProxyType({
    "fp32": Tolerance(rtol=1e-3, atol=1e-4),
    "fp16": Tolerance(rtol=1e-2, atol_scale=1e-2),
    "int8": Tolerance(rtol=5e-2, atol_scale=5e-2),
})


@dataclass(frozen=True)
class ParserIssue:
    """One error of TensorRT's ONNX parser: the node (name and op; ``""`` for the whole graph) and its reason."""

    node: str
    op: str
    reason: str

    def line(self) -> str:
        """``node 'conv_7' (Foo): <parser's reason>``."""
        return f"node {self.node!r} ({self.op}): {self.reason}" if self.node or self.op else self.reason


@dataclass
class EngineBuild:
    """One engine built (or not) at one precision, and its outputs against ONNX Runtime's.

    Attributes
    ----------
    precision : str
        ``fp32``, ``fp16`` or ``int8``.
    flags : list[str]
        the builder flags set (``["FP16"]``, ``["INT8"]``; fp32 clears ``TF32``).
    built : bool
        the engine was built.
    build_seconds : float | None
        wall time of ``build_serialized_network`` alone (``None`` when not called).
    error : str | None
        why it was not built, or why its run failed (one line).
    engine_bytes : int
        size of the serialized engine.
    engine_path : str | None
        where it was written (``None`` without ``engine_dir``).
    tolerances : dict[str, Tolerance]
        output name → the tolerance its parity used.
    parity : list[OutputParity]
        one check per output and shape (``batch_size`` is the shape's axis 0).
    parity_skipped : str | None
        why the engine was not run (no CUDA device for torch), or ``None``.
    passed : bool
        built, and every parity check passed (``False`` when the run was skipped).
    """

    precision: str
    flags: list[str] = field(default_factory=list)
    built: bool = False
    build_seconds: float | None = None
    error: str | None = None
    engine_bytes: int = 0
    engine_path: str | None = None
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    parity: list[OutputParity] = field(default_factory=list)
    parity_skipped: str | None = None
    passed: bool = False


@dataclass
class TensorRTCheck:
    """What :func:`tensorrt_check` found.

    Attributes
    ----------
    path : str
        the ONNX file.
    checker : str
        ``"tensorrt <version>"`` when TensorRT ran, else ``"static check: <why TensorRT did not>"``.
    used_tensorrt : bool
        TensorRT parsed the file (and built what it could).
    ready : bool
        TensorRT ran: parsed, and every engine built and matched ONNX Runtime; static check: no finding.
    kind : str
        ``"fp32"`` or ``"int8"`` (Q/DQ or integer ops in the file).
    parsed : bool | None
        the parser accepted the file (``None`` for the static check).
    parse_seconds : float | None
        wall time of the parse (``None`` for the static check).
    unsupported : list[ParserIssue]
        the parser's errors, by node.
    profile : dict[str, dict[str, list[int]]]
        input name → ``{"min", "opt", "max"}`` shapes of the optimisation profile (dynamic inputs).
    builds : list[EngineBuild]
        one :class:`EngineBuild` per precision asked for.
    static : ReadinessReport | None
        the static check's report (also kept when TensorRT ran).
    """

    path: str
    checker: str
    used_tensorrt: bool
    ready: bool
    kind: str
    parsed: bool | None = None
    parse_seconds: float | None = None
    unsupported: list[ParserIssue] = field(default_factory=list)
    profile: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    builds: list[EngineBuild] = field(default_factory=list)
    static: ReadinessReport | None = None


def import_tensorrt() -> tuple[ModuleType | None, str]:
    """``(tensorrt, "")``, or ``(None, reason)`` when it cannot be imported (missing, or its libraries are)."""
    try:
        import tensorrt
    except Exception as exc:  # ImportError, or OSError when libnvinfer cannot be loaded
        return None, error_line(exc, with_type=True)
    return tensorrt, ""


def tensorrt_check(
    path: str | Path,
    *,
    shapes: Mapping[str, ShapeRange] | None = None,
    batch: tuple[int, int, int] = (1, 32, 32),
    precisions: Sequence[str] | None = None,
    tolerances: Mapping[str, Mapping[str, Tolerance]] | None = None,
    data: Data | None = None,
    opset: int | None = None,
    engine_dir: str | Path | None = None,
    workspace_bytes: int = 1 << 30,
    seed: int = 0,
) -> TensorRTCheck:
    """Validate an ONNX file with TensorRT when it is importable, else with the static check.

    Parameters
    ----------
    path : str | Path
        ONNX file, float or explicit QDQ INT8.
    shapes : Mapping[str, ShapeRange] | None
        input name → :class:`ShapeRange`; required for inputs dynamic beyond axis 0.
    batch : tuple[int, int, int]
        (min, opt, max) of axis 0 for dynamic inputs not in ``shapes``.
    precisions : Sequence[str] | None
        engines to build; default ``("fp32", "fp16")`` for a float file, ``("int8",)`` for a QDQ file.
    tolerances : Mapping[str, Mapping[str, Tolerance]] | None
        precision → output name → :class:`Tolerance`; others use :data:`DEFAULT_TOLERANCES`.
    data : Data | None
        parity inputs (rows along axis 0, tiled or cut to each shape), default seeded random values.
    opset : int | None
        the opset the static check holds the file to (see :func:`minreal.export.readiness.tensorrt_readiness`).
    engine_dir : str | Path | None
        write each engine there as ``<stem>.<precision>.engine``.
    workspace_bytes : int
        the builder's workspace pool limit.
    seed : int
        seed of the random parity inputs.

    Raises
    ------
    ValueError
        an unknown precision, int8 for a file without Q/DQ nodes, or a dynamic input whose shapes
        cannot be derived (give ``shapes``).
    """
    path = Path(path)
    static = tensorrt_readiness(path, opset)
    chosen = _precisions(precisions, static["kind"], path)
    trt, why = import_tensorrt()
    if trt is None:
        return _static_result(path, static, f"static check: tensorrt not importable: {why}")
    options = _Options(shapes or {}, batch, chosen, tolerances or {}, data,
                       Path(engine_dir) if engine_dir else None, workspace_bytes, seed)
    return _with_tensorrt(trt, path, static, options)


@dataclass(frozen=True)
class _Options:
    shapes: Mapping[str, ShapeRange]
    batch: tuple[int, int, int]
    precisions: tuple[str, ...]
    tolerances: Mapping[str, Mapping[str, Tolerance]]
    data: Data | None
    engine_dir: Path | None
    workspace_bytes: int
    seed: int


def _precisions(asked: Sequence[str] | None, kind: str, path: Path) -> tuple[str, ...]:
    """The precisions to build: the caller's (checked against the file), else the file kind's default."""
    if asked is None:
        return ("int8",) if kind == "int8" else ("fp32", "fp16")
    if not asked:
        raise ValueError("precisions must name at least one of " + ", ".join(PRECISIONS))
    unknown = sorted(set(asked) - set(PRECISIONS))
    if unknown:
        raise ValueError(f"unknown precision {unknown}; choose from {', '.join(PRECISIONS)}")
    if "int8" in asked and kind != "int8":
        raise ValueError(f"int8 needs an explicit QDQ file, but {path.name} has no Q/DQ nodes; quantise it first "
                         "(minreal.export.int8.quantize_int8 with QuantConfig(target='tensorrt'))")
    return tuple(asked)


def _static_result(path: Path, static: ReadinessReport, checker: str) -> TensorRTCheck:
    return TensorRTCheck(path=str(path), checker=checker, used_tensorrt=False, ready=static["ready"],
                         kind=static["kind"], static=static)


def _with_tensorrt(trt: ModuleType, path: Path, static: ReadinessReport, opt: _Options) -> TensorRTCheck:
    """Parse, profile, build and compare (see :func:`tensorrt_check`)."""
    version = f"tensorrt {trt.__version__}"
    log = _collecting_logger(trt)
    try:
        builder = trt.Builder(log)
    except Exception as exc:  # pybind raises when CUDA cannot be initialised (no GPU, no driver)
        return _static_result(path, static, f"static check: {version} cannot create a builder: {error_line(exc)}")
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, log)
    t = time.perf_counter()
    parsed = bool(parser.parse_from_file(str(path)))
    result = TensorRTCheck(path=str(path), checker=version, used_tensorrt=True, ready=False, kind=static["kind"],
                           parsed=parsed, parse_seconds=time.perf_counter() - t,
                           unsupported=parser_issues(parser, _onnx_nodes(path)), static=static)
    if not parsed:
        return result
    ranges = profile_shapes(network, opt.shapes, opt.batch)
    result.profile = {n: {"min": list(r.min), "opt": list(r.opt), "max": list(r.max)} for n, r in ranges.items()}
    for precision in opt.precisions:
        build, engine = _build(trt, builder, network, ranges, precision, opt.workspace_bytes, log)
        if engine is not None:
            _save_engine(build, engine, path, opt.engine_dir)
            _compare(trt, build, engine, path, ranges, opt, log)
        result.builds.append(build)
    result.ready = all(b.passed for b in result.builds)
    return result


def _collecting_logger(trt: ModuleType) -> Any:
    """A ``tensorrt.ILogger`` that keeps error messages (``.errors``) and sends the rest to :mod:`logging`."""

    class _Collecting(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.ERROR, trt.ILogger.INTERNAL_ERROR):
                self.errors.append(first_line(msg))
            logger.debug("tensorrt: %s", msg)

    return _Collecting()


def _network_flags(trt: ModuleType) -> int:
    """0 from TensorRT 10 (explicit batch is the only mode); the EXPLICIT_BATCH bit before."""
    if int(trt.__version__.split(".")[0]) >= 10:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)


def _onnx_nodes(path: Path) -> list[tuple[str, str]]:
    """(name, op) of the top-level graph's nodes, by index (what ``ParserError.node()`` counts)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return [(n.name or f"<{n.op_type} #{i}>", n.op_type) for i, n in enumerate(graph.node)]


def parser_issues(parser: Any, nodes: Sequence[tuple[str, str]]) -> list[ParserIssue]:
    """Every error of ``parser``: its node's name and op (the parser's own from TensorRT 10, else looked up by
    the node index in ``nodes``) and its description."""
    out = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        index = err.node()
        known = nodes[index] if 0 <= index < len(nodes) else ("", "")
        name = _optional_call(err, "node_name") or known[0]
        op = _optional_call(err, "node_operator") or known[1]
        out.append(ParserIssue(node=name, op=op, reason=first_line(err.desc())))
    return out


def _optional_call(obj: Any, method: str) -> str:
    """``obj.method()`` as a string where the binding has it (TensorRT 10 added node names), else ``""``."""
    fn = getattr(obj, method, None)
    return str(fn() or "") if callable(fn) else ""


def profile_shapes(network: Any, shapes: Mapping[str, ShapeRange],
                   batch: tuple[int, int, int]) -> dict[str, ShapeRange]:
    """One :class:`ShapeRange` per dynamic network input (``-1`` in its dims): the caller's, else ``batch`` on
    axis 0 with the other axes as the network states them.

    Raises
    ------
    ValueError
        ``shapes`` names no input or disagrees with an input's rank or fixed axes; an input is dynamic
        beyond axis 0 and ``shapes`` omits it.
    """
    out = {}
    inputs = {network.get_input(i).name: tuple(network.get_input(i).shape) for i in range(network.num_inputs)}
    if unknown := sorted(set(shapes) - set(inputs)):
        raise ValueError(f"shapes name {unknown}, which are not network inputs ({', '.join(inputs)})")
    for name, dims in inputs.items():
        if name in shapes:
            out[name] = _checked_range(name, dims, shapes[name])
        elif -1 in dims[1:]:
            raise ValueError(f"input {name!r} {list(dims)} is dynamic beyond axis 0; give its min/opt/max "
                             f"as shapes={{{name!r}: ShapeRange(min, opt, max)}}")
        elif dims and dims[0] == -1:
            out[name] = ShapeRange(*((b, *dims[1:]) for b in batch))
    return out


def _checked_range(name: str, dims: Shape, given: ShapeRange) -> ShapeRange:
    """``given`` when it has the input's rank and keeps its fixed axes."""
    fits = all(len(s) == len(dims) and all(d in (-1, v) for d, v in zip(dims, s)) for s in (given.min, given.max))
    if not fits:
        raise ValueError(f"shapes[{name!r}] {given} does not fit the input's dims {list(dims)} (-1: dynamic)")
    return given


def _build(trt: ModuleType, builder: Any, network: Any, ranges: Mapping[str, ShapeRange], precision: str,
           workspace_bytes: int, log: Any) -> tuple[EngineBuild, bytes | None]:
    """Configure and build one engine; the build's record and the serialized engine (``None`` if not built)."""
    build = EngineBuild(precision=precision)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if missing := _set_flags(trt, config, precision, build.flags):
        build.error = missing
        return build, None
    if ranges:
        profile = builder.create_optimization_profile()
        for name, r in ranges.items():
            profile.set_shape(name, r.min, r.opt, r.max)
        config.add_optimization_profile(profile)
    del log.errors[:]
    t = time.perf_counter()
    try:
        serialized = builder.build_serialized_network(network, config)
    except Exception as exc:  # the bindings raise on some invalid configurations
        serialized = None
        log.errors.append(error_line(exc))
    build.build_seconds = time.perf_counter() - t
    if serialized is None:
        build.error = "; ".join(log.errors[-3:]) or "build_serialized_network returned no engine"
        return build, None
    build.built, engine = True, bytes(serialized)
    build.engine_bytes = len(engine)
    return build, engine


def _set_flags(trt: ModuleType, config: Any, precision: str, flags: list[str]) -> str | None:
    """Set the builder flags of ``precision`` (recorded in ``flags``); why not, for a TensorRT without them."""
    if precision == "fp32":
        if hasattr(trt.BuilderFlag, "TF32"):
            config.clear_flag(trt.BuilderFlag.TF32)  # fp32 means fp32, not TensorRT's default TF32 matmuls
        return None
    name = precision.upper()
    if not hasattr(trt.BuilderFlag, name):
        return (f"tensorrt {trt.__version__} has no BuilderFlag.{name} (strongly typed builds only): give a file "
                f"already in {precision}")
    config.set_flag(getattr(trt.BuilderFlag, name))
    flags.append(name)
    return None


def _save_engine(build: EngineBuild, engine: bytes, path: Path, engine_dir: Path | None) -> None:
    if engine_dir is not None:
        engine_dir.mkdir(parents=True, exist_ok=True)
        out = engine_dir / f"{path.stem}.{build.precision}.engine"
        atomic_write_bytes(out, engine)
        build.engine_path = str(out)


def _compare(trt: ModuleType, build: EngineBuild, engine: bytes, path: Path, ranges: Mapping[str, ShapeRange],
             opt: _Options, log: Any) -> None:
    """Run the engine at the profile's min and opt shapes; compare each output with ONNX Runtime's CPU provider."""
    import torch

    if not torch.cuda.is_available():
        build.parity_skipped = f"torch {torch.__version__} has no CUDA device to run the engine on"
        return
    session = create_session(path)
    names = [o.name for o in session.get_outputs()]
    own = opt.tolerances.get(build.precision, {})
    build.tolerances = {n: own.get(n, DEFAULT_TOLERANCES[build.precision]) for n in names}
    try:
        runner = EngineRunner(trt, engine, log)
        for which in ("min", "opt"):
            feeds = parity_feeds(path, {n: getattr(r, which) for n, r in ranges.items()}, opt.data, opt.seed)
            got = runner.run(feeds)
            for name, ref in zip(names, run_ort(session, feeds)):
                tol, out = build.tolerances[name], got[name]
                build.parity.append(compare_output(name, len(ref), out, ref, tol.rtol, tol.atol_for(ref, out)))
    except Exception as exc:  # a failed run is a finding of the check, not a crash of the caller
        build.error = f"the engine did not run: {error_line(exc)}"
        return
    build.passed = bool(build.parity) and all(p.passed for p in build.parity)


def parity_feeds(path: Path, shapes: Mapping[str, Shape], data: Data | None, seed: int) -> dict[str, np.ndarray]:
    """Inputs of exactly ``shapes`` (static inputs at their own shape): rows of ``data``, or seeded random
    values (:func:`minreal.runtime_bench.inputs.timing_inputs`)."""
    specs = input_specs(path)
    first = next(iter(shapes.values()), None)
    batch = first[0] if first else next((s.fixed_batch() for s in specs if s.fixed_batch()), 1)
    axis_values = {dim: shapes[s.name][a] for s in specs if s.name in shapes
                   for a, dim in enumerate(s.shape) if a and isinstance(dim, str)}
    feeds = timing_inputs(specs, batch, data, seed, path.name, axis_values)
    wrong = {n: list(f.shape) for n, f in feeds.items() if n in shapes and tuple(f.shape) != tuple(shapes[n])}
    if wrong:
        raise ValueError(f"cannot make parity inputs of the profile's shapes {dict(shapes)} (got {wrong}); "
                         "give inputs of one batch size")
    return feeds


class EngineRunner:
    """A serialized TensorRT engine run through one execution context on a CUDA stream of its own; device
    buffers are torch CUDA tensors (TensorRT 10's named-tensor API: ``set_input_shape``,
    ``set_tensor_address``, ``execute_async_v3``).

    :meth:`bind` copies inputs to the device and sizes the outputs once; :meth:`launch` enqueues one inference
    without copies or synchronisation (what a timing loop calls); :meth:`run` does all of it and returns numpy.
    """

    def __init__(self, trt: ModuleType, engine: bytes, log: Any | None = None, stream: Any | None = None) -> None:
        """Deserialize ``engine``; ``stream`` is a ``torch.cuda.Stream`` to run on (default: a new one), so that
        several engines timed together share it."""
        import torch

        self._trt, self._torch = trt, torch
        self._log = log or trt.Logger(trt.Logger.WARNING)  # TensorRT needs its logger alive as long as the engine
        self._runtime = trt.Runtime(self._log)
        self.engine = self._runtime.deserialize_cuda_engine(engine)
        if self.engine is None:
            raise RuntimeError("TensorRT could not deserialize the engine (built by another TensorRT version or GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.stream = stream if stream is not None else torch.cuda.Stream()
        self._buffers: dict[str, Any] = {}

    def _torch_dtype(self, name: str) -> Any:
        numpy_type = self._trt.nptype(self.engine.get_tensor_dtype(name))
        return self._torch.from_numpy(np.empty(0, dtype=numpy_type)).dtype

    def bind(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Copy ``feeds`` (by input name) to the device, set their shapes and allocate the outputs."""
        torch = self._torch
        missing = sorted(set(self.inputs) - set(feeds))
        if missing:
            raise ValueError(f"the engine's inputs {missing} have no feeds")
        for name in self.inputs:
            tensor = torch.from_numpy(np.ascontiguousarray(feeds[name])).to("cuda", self._torch_dtype(name))
            self.context.set_input_shape(name, tuple(tensor.shape))
            self._buffers[name] = tensor
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            self._buffers[name] = torch.empty(shape, dtype=self._torch_dtype(name), device="cuda")
        for name, tensor in self._buffers.items():
            self.context.set_tensor_address(name, tensor.data_ptr())
        torch.cuda.synchronize()  # the copies ran on the current stream, the engine runs on its own

    def launch(self) -> None:
        """Enqueue one inference on :attr:`stream` (asynchronous)."""
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs by name for ``feeds``, as float32/int numpy arrays on the host."""
        self.bind(feeds)
        self.launch()
        self.stream.synchronize()
        return {n: self._buffers[n].float().cpu().numpy() if self._buffers[n].is_floating_point()
                else self._buffers[n].cpu().numpy() for n in self.outputs}
