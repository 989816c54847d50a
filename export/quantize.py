"""INT8 quantisation with ONNX Runtime: static QDQ (calibrated) or dynamic.

Static mode runs ``quant_pre_process`` (shape inference + basic optimisation), then
``quantize_static`` in QDQ format with per-channel symmetric int8 weights, calibrated on the caller's
array. The activation type follows the target (a table, overridable in :class:`QuantConfig`):

- ``cpu-vnni``: uint8, asymmetric (QUInt8) activations, 8-bit weights ("U8S8"). ORT's CPU provider fuses
  DQ→Conv→(Relu)→Q into integer kernels (QLinearConv, QGemm); measured about 2x faster than int8 activations on
  x86. Right for x86 CPUs with VNNI or AMX (ARM runs it too, but ``arm64`` is its own format).
- ``cpu-avx2``: the same with 7-bit weights (``reduce_range``: [-64, 64]). On x86 without VNNI ORT's U8S8 kernel
  adds two u8·s8 products into a saturating int16 (``VPMADDUBSW``); with 7-bit weights a pair is at most
  2·255·64 = 32640 < 2^15, so it cannot saturate (:mod:`minreal.runtime_bench.cpu`).
- ``cpu``: whichever of the two is right for the machine that quantises (:func:`resolve_target`).
- ``arm64``: int8, symmetric (QInt8, zero point 0) activations and per-channel symmetric 8-bit int8 weights ("S8S8"),
  int32 biases. ONNX Runtime's quantisation guide (docs/performance/model-optimizations/quantization.md) calls S8S8 in
  QDQ "the first choice" and says U8S8 saturation, the one reason for 7-bit weights, does not occur on ARM; MLAS's
  ARM64 build has int8-input symmetric convolution kernels (``MlasConvSymS8DispatchNeon``/``...Dot`` in
  ``core/mlas/lib/convsym.cpp``; its uint8 dispatches shift the input zero point by 128, ``FixupInputZeroPoint``) and
  an S8S8 GEMM (``MlasGemmS8S8DispatchSdot`` in ``core/mlas/lib/platform.cpp``); ARM's graph optimiser keeps int8 Q/DQ
  as they are (``QDQIsInt8Allowed()`` is true only for ARM builds). On x86 ONNX Runtime's ``QDQS8ToU8Transformer``
  turns the int8 activations into uint8 (zero point 128), so the file runs here in U8S8, computing the same QDQ
  function: parity and accuracy are measured here, latency on ARM is not. Its kernels are counted in the graph ONNX
  Runtime builds for ARM (``session.qdqisint8allowed=1``, :data:`minreal.runtime_bench.cpu.ARM_GRAPH_CONFIG`). Not
  quantised with x86's rules: no input-channel widening, no round-trip dropping (both are about x86 kernels or a graph
  optimised here). A cost of symmetric activations: ORT folds a ReLU into the preceding quantiser only when the zero
  point is the type's minimum (``ReluQuantFusion``), so each ReLU runs in float between a dequantise and a
  re-quantise, on ARM too.
- ``tensorrt``: int8, symmetric (QInt8, ``ActivationSymmetric``/``WeightSymmetric``), biases left
  in float (``QuantizeBias=False``): what TensorRT's explicit-quantisation mode expects.

The result counts Conv/MatMul/Gemm nodes that run as integer kernels in the ORT-optimised CPU graph
against those left in float. Whether INT8 is actually faster is for the benchmark to judge.

Two rewrites keep tensors quantised where ORT's CPU graph optimiser has no fusion of its own: a mean over every
spatial axis (``ReduceMean``, as PyTorch exports a global average pool) is written as ``GlobalAveragePool`` before
quantisation (:mod:`minreal.export.qdq_pools`; ORT fuses it into ``QLinearGlobalAveragePool``), and for the CPU targets
a constant zero ``Pad`` between a dequantise and a re-quantise of one scale (an option-A ResNet shortcut's zero
channels) pads the quantised tensor with the zero point instead (:mod:`minreal.export.qdq_pads`).

Activation ranges trained by quantisation-aware recovery (``minreal.compress.core.qat``, keyed by module name) replace
the calibrated ones of the layers' input tensors (ORT's ``TensorQuantOverrides``): each module is found by its
weight initializer, named ``<module>.weight`` by the dynamo exporter (onnxsim keeps the name when it folds a
BatchNorm into the Conv), else by equal values (transposed for Gemm/MatMul). Every other tensor is calibrated.

Calibration runs once per :func:`quantize_int8` call (its later rounds, which leave more nodes in float, reuse the
ranges), or once for many calls: :func:`calibrate` measures the ranges, which do not depend on the nodes left in float,
and ``quantize_int8(..., calibration=...)`` quantises with them (ORT's calibration cache), giving the same file.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import inspect
import logging
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

import minreal.runtime_bench.cpu as cpu_facts
from minreal.export.atomic import ensure_distinct
from minreal.export.errors import CalibrationError, QuantizationError
from minreal.export.onnx_files import data_files
from minreal.export.qdq_channels import align_conv_inputs, channel_pads
from minreal.export.qdq_pads import integer_pads
from minreal.export.qdq_pools import global_average_pools
from minreal.export.settings import AUTO_TARGET as _AUTO_TARGET
from minreal.export.settings import DROP_ROUNDTRIPS, QUANT_MODES, QUANT_TARGETS, int8_format
from minreal.facts import (
    ARM64_TARGET,
    CPU_AVX2_TARGET,
    CPU_VNNI_TARGET,
    FLOAT_KERNEL_OPS,
    INT8_TARGET_KEY,
    INTEGER_KERNEL_OPS,
    REDUCED_WEIGHT_QMAX,
    WEIGHT_QMAX,
    error_line,
)
from minreal.runtime_bench import optimized_graph_ops
from minreal.runtime_bench.atomic import atomic_path
from minreal.runtime_bench.model_info import float_roundtrip_nodes, float_roundtrips, op_counts, optimized_graph
from minreal.runtime_bench.runtime import onnxruntime_module

__all__ = [
    "QUANT_MODES",
    "QUANT_TARGETS",
    "ArrayCalibrationReader",
    "Calib",
    "Calibration",
    "QuantConfig",
    "QuantResult",
    "optimized_op_counts",
    "dynamic_weight_nodes",
    "quantizable_nodes",
    "nonfinite_scale_nodes",
    "module_inputs",
    "trained_overrides",
    "calibrate",
    "reusable_calibration",
    "quantize_int8",
    "int8_skip_reason",
    "resolve_target",
    "target_text",
    "saturates_here",
    "target_format",
]

logger = logging.getLogger(__name__)


class _Target(NamedTuple):
    """Per-target defaults: activation type, symmetric activations, int32-quantised biases, 7-bit weights."""

    activation_type: str
    activation_symmetric: bool
    quantize_bias: bool
    reduce_range: bool = False


_TARGETS = {
    CPU_VNNI_TARGET: _Target("uint8", False, True),
    CPU_AVX2_TARGET: _Target("uint8", False, True, reduce_range=True),
    ARM64_TARGET: _Target("int8", True, True),
    "tensorrt": _Target("int8", True, False),
}
#: Targets whose files ONNX Runtime's CPU provider runs (zero pads on quantised tensors, :func:`_pad_quantised`).
_ORT_CPU_TARGETS = (*cpu_facts.CPU_TARGETS, ARM64_TARGET)
#: Session config of the CPU graph whose kernels a target's result counts (this machine's graph for the others): an
#: arm64 file's is the graph ONNX Runtime builds for ARM. On x86 ORT's own graph of it runs a ResNet's residual
#: convolutions and additions in float (uint8-converted and int8 Q/DQ meet there), which ARM's fuses into int8 kernels.
_TARGET_GRAPHS = {ARM64_TARGET: cpu_facts.ARM_GRAPH_CONFIG}
_WEIGHT_TYPES = ("int8", "uint8")
_QUANT_TYPES = {"uint8": "QUInt8", "int8": "QInt8"}  # onnxruntime.quantization.QuantType members
_CALIBRATION_METHODS = {  # onnxruntime.quantization.CalibrationMethod members
    "minmax": "MinMax",
    "entropy": "Entropy",
    "percentile": "Percentile",
}


@dataclass(frozen=True)
class QuantConfig:
    """Options of :func:`quantize_int8`.

    Attributes:
        mode: ``"static"`` (calibrated QDQ) or ``"dynamic"`` (``quantize_dynamic``, no calibration).
        target: one of :data:`QUANT_TARGETS`; picks the activation type, symmetry and weight range. ``"cpu"`` is
            resolved to ``"cpu-vnni"`` or ``"cpu-avx2"`` for the machine that quantises (:func:`resolve_target`);
            ``"arm64"`` is symmetric int8 activations for ONNX Runtime's ARM64 kernels, on any machine.
        activation_type: ``"uint8"`` or ``"int8"``; ``None`` follows the target.
        activation_symmetric: symmetric activation ranges; ``None`` follows the target.
        weight_type: ``"int8"`` (the default) or ``"uint8"`` (ONNX Runtime's U8U8, which does not saturate on x86
            without VNNI but runs a slower kernel there; per-channel uint8 weights are centred on zero point 128).
        reduce_range: 7-bit weights ([-64, 64]); ``None`` follows the target.
        per_channel: per-output-channel weight scales.
        calibration_method: ``"minmax"``, ``"entropy"`` or ``"percentile"``.
        batch_size: calibration batch size.
        allow_random_calibration: calibrate on standard-normal data when no data is given.
        random_samples: number of random samples in that case.
        seed: seed of the random calibration data.
        drop_roundtrips: x86 CPU targets (``cpu``), static mode: leave in float the nodes that ONNX Runtime's
            optimised CPU graph runs in float between a DequantizeLinear and a QuantizeLinear (no integer kernel:
            Pad, ConvTranspose, a Conv with computed weights, ...) and quantise again, keeping an exclusion only
            where it removes the dequantise/re-quantise pair and the result only if ORT's graph has fewer Q/DQ nodes
            and no fewer integer kernels (:func:`_drop_roundtrips`). ``arm64`` ignores it: it would change the file
            on the strength of a graph optimised here, not on ARM. ORT's x86 graph of an arm64 file is built after
            ``QDQS8ToU8Transformer`` (x86 only) and runs a ResNet's residual convolutions and additions in float
            where ARM's fuses them into int8 kernels; the ARM graph built here (the one the result counts) still
            has x86-only rewrites (NCHWc layouts).
        align_channels: x86 CPU targets: widen every ungrouped convolution whose input channels are not a multiple
            of 4 (an RGB stem) with zero channels, which changes no output and puts it on ONNX Runtime's fast int8
            kernel (:func:`minreal.export.qdq_channels.align_conv_inputs`); other targets (``arm64``, ``tensorrt``), and
            quantising on an ARM
            machine, ignore it. A trained range of a widened layer's input holds for the ``Pad`` before it too. On by
            default: the CIFAR ResNet-32's INT8 file ran 0.982x / 0.960x as long at batch 1 / 32 with it, lower in
            18 and 20 of 20 processes, with bit-identical outputs (``benchmarks/int8_align.json``, AVX-512 VNNI).
    """

    mode: str = QUANT_MODES[0]
    target: str = _AUTO_TARGET
    activation_type: str | None = None
    activation_symmetric: bool | None = None
    weight_type: str = "int8"
    reduce_range: bool | None = None
    per_channel: bool = True
    calibration_method: str = "minmax"
    batch_size: int = 16
    allow_random_calibration: bool = False
    random_samples: int = 32
    seed: int = 0
    drop_roundtrips: bool = DROP_ROUNDTRIPS
    align_channels: bool = True

    def __post_init__(self) -> None:
        choices = {
            "mode": (self.mode, QUANT_MODES),
            "target": (self.target, QUANT_TARGETS),
            "weight_type": (self.weight_type, _WEIGHT_TYPES),
            "calibration_method": (self.calibration_method, tuple(_CALIBRATION_METHODS)),
            "activation_type": (self.activation_type, (None, *_QUANT_TYPES)),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"QuantConfig.{name}={value!r} is not one of {allowed}")
        if self.mode == "dynamic" and self.target == "tensorrt":
            raise ValueError("mode='dynamic' emits integer ops TensorRT cannot read; use mode='static' for tensorrt")
        if self.mode == "dynamic" and self.target == ARM64_TARGET:
            raise ValueError("mode='dynamic' quantises activations to uint8 at run time, not arm64's symmetric int8 "
                             "(S8S8); use mode='static' for arm64")
        if self.batch_size < 1 or self.random_samples < 1:
            raise ValueError("QuantConfig.batch_size and random_samples must be positive")

    def activation(self) -> tuple[str, bool]:
        """Return (activation type, symmetric) after applying the target's defaults."""
        default = _TARGETS[resolve_target(self.target, self.mode)]
        symmetric = default.activation_symmetric if self.activation_symmetric is None else self.activation_symmetric
        return self.activation_type or default.activation_type, symmetric

    def weights_reduced(self) -> bool:
        """7-bit weights, after applying the target's default."""
        default = _TARGETS[resolve_target(self.target, self.mode)].reduce_range
        return default if self.reduce_range is None else self.reduce_range

    def resolved(self) -> QuantConfig:
        """This config with ``target="cpu"`` replaced by the explicit target for this machine."""
        return dataclasses.replace(self, target=resolve_target(self.target, self.mode))


def resolve_target(target: str, mode: str = "static") -> str:
    """``cpu`` → ``arm64`` on an ARM64 CPU, ``cpu-vnni`` where this machine's ONNX Runtime U8S8 kernel cannot saturate
    (x86 with VNNI or AMX), else ``cpu-avx2`` (:func:`minreal.runtime_bench.cpu.cpu_int8_target`); in ``dynamic``
    mode (uint8 activations quantised at run time, never ARM's S8S8) ``cpu-vnni`` on ARM. An explicit target is
    returned as is."""
    if target != _AUTO_TARGET:
        return target
    found = cpu_facts.cpu_int8_target()
    return CPU_VNNI_TARGET if found == ARM64_TARGET and mode == "dynamic" else found


def target_text(target: str, mode: str = "static") -> str:
    """``target`` for a progress line: ``cpu → cpu-avx2`` where ``cpu`` is resolved for this machine (in ``mode``)."""
    resolved = resolve_target(target, mode)
    return target if resolved == target else f"{target} → {resolved}"


def target_format(target: str) -> str:
    """The static INT8 format ``target`` writes, in words (:func:`minreal.export.settings.int8_format`), ``cpu``
    resolved for this machine: ``S8S8: symmetric int8 activations, 8-bit per-channel int8 weights`` for ``arm64``."""
    config = QuantConfig(target=target).resolved()
    act_type, symmetric = config.activation()
    return int8_format(act_type, symmetric, _WEIGHT_BITS[_weight_qmax(config)], config.weight_type,
                       config.per_channel)


def saturates_here(weight_type: str, reduce_range: bool) -> bool:
    """Whether a file of this format can saturate in ONNX Runtime's CPU kernels on this machine: 8-bit int8
    weights (with uint8 activations, or int8 ones, which ORT's x86 graph turns into uint8) on a CPU whose kernel
    adds u8·s8 pairs in int16. 7-bit or uint8 weights cannot."""
    return weight_type == "int8" and not reduce_range and cpu_facts.kernel_saturates()


@dataclass(frozen=True)
class QuantResult:
    """What :func:`quantize_int8` wrote.

    Attributes:
        fp32_path: the float model (not modified).
        out_path: the quantised model.
        mode: ``"static"`` or ``"dynamic"``.
        target: the explicit target written (``"cpu-vnni"``, ``"cpu-avx2"``, ``"arm64"`` or ``"tensorrt"``).
        requested_target: the target asked for (``"cpu"`` is resolved for this machine into ``target``).
        quant_format: ``"QDQ"`` (static) or ``"QOperator"`` (dynamic: integer ops written directly).
        activation_type: ``"uint8"`` or ``"int8"`` (dynamic mode: ``"uint8"``, computed at run time).
        activation_symmetric: symmetric activation ranges.
        weight_type: ``"int8"`` (symmetric) or ``"uint8"`` (U8U8; per-channel weights centred on zero point 128).
        weight_bits: 8, or 7 for reduced-range weights ([-64, 64]).
        saturates_here: this file's format can saturate in ONNX Runtime's CPU kernels on the machine that
            quantised it (8-bit int8 weights on x86 without VNNI): its accuracy measured here is not what a VNNI
            CPU gets, and a saturation-free target (``cpu-avx2``) is the remedy. For ``arm64`` and ``tensorrt``
            files it only says the accuracy measured here understates their device's.
        per_channel: per-channel weight scales.
        quantized_bias: biases stored as int32 behind a DequantizeLinear (``False``: float biases).
        calibration_samples: samples used for calibration (0 in dynamic mode).
        random_calibration: calibrated on random data (``allow_random_calibration``).
        preprocess_note: ``None`` if ``quant_pre_process`` ran fully, else what was skipped and why.
        node_counts: op type → count in the written graph.
        optimized_ops: op type → count in the ORT-optimised CPU graph (``domain:op`` outside ai.onnx); for
            ``arm64`` the graph ONNX Runtime builds for ARM (:data:`minreal.runtime_bench.cpu.ARM_GRAPH_CONFIG`).
        integer_kernels: Conv/MatMul/Gemm nodes running as integer kernels in that graph.
        float_kernels: Conv/MatMul/Gemm nodes still in floating point in that graph.
        size_fp32_bytes: size of the float file.
        size_int8_bytes: size of the quantised file.
        excluded_nodes: nodes left in float: those whose weights are computed in the graph (e.g. an SSM's
            generated convolution kernel; quantising them only adds Q/DQ work), then the caller's ``exclude``.
        range_source: ``"trained"`` when some activation scales came from quantisation-aware recovery,
            else ``"calibrated"``.
        trained_ranges: layer-input tensors whose written scale and zero point are the trained ones.
        untrained_modules: modules whose trained range could not be placed in the graph (calibrated instead).
        float_roundtrips: op type → nodes of the ORT-optimised CPU graph that run in float between a
            DequantizeLinear and a QuantizeLinear (:func:`minreal.runtime_bench.model_info.float_roundtrips`): each
            costs a dequantise and a re-quantise with nothing gained, the usual reason an INT8 file is slower than fp32.
        nonfinite_nodes: nodes left in float because calibration gave a tensor they read or write a scale that is
            not finite (e.g. a 0/-inf attention mask and the masked scores): quantised, such a tensor flattens
            everything downstream. Also listed in ``excluded_nodes``.
        roundtrip_nodes: nodes left in float by ``QuantConfig.drop_roundtrips`` (a first quantisation ran them in
            float between a dequantise and a re-quantise); also listed in ``excluded_nodes``. ``float_roundtrips``
            counts what is left after that.
    """

    fp32_path: str
    out_path: str
    mode: str
    target: str
    quant_format: str
    activation_type: str
    activation_symmetric: bool
    weight_type: str
    per_channel: bool
    quantized_bias: bool
    calibration_samples: int
    random_calibration: bool
    preprocess_note: str | None
    node_counts: dict[str, int] = field(default_factory=dict)
    optimized_ops: dict[str, int] = field(default_factory=dict)
    integer_kernels: int = 0
    float_kernels: int = 0
    size_fp32_bytes: int = 0
    size_int8_bytes: int = 0
    excluded_nodes: list[str] = field(default_factory=list)
    range_source: str = "calibrated"
    trained_ranges: int = 0
    untrained_modules: list[str] = field(default_factory=list)
    nonfinite_nodes: list[str] = field(default_factory=list)
    float_roundtrips: dict[str, int] = field(default_factory=dict)
    roundtrip_nodes: list[str] = field(default_factory=list)
    requested_target: str = ""
    weight_bits: int = 8
    saturates_here: bool = False


Calib = np.ndarray | Mapping[str, np.ndarray]
"""Calibration inputs: one array for a one-input graph, or arrays by graph input name (same row count)."""


@dataclass(frozen=True)
class Calibration:
    """Activation ranges ONNX Runtime's calibrator measured on one model (:func:`calibrate`), for static
    :func:`quantize_int8` to use instead of calibrating again.

    Attributes:
        ranges: ``onnxruntime.quantization.TensorsData``: tensor name → calibrated range (and histogram).
        samples: calibration samples the ranges come from.
        random: the samples were random (``QuantConfig.allow_random_calibration``).
        method: ``QuantConfig.calibration_method`` used.
        graph_sha256: SHA-256 of the pre-processed graph calibrated, to refuse the ranges for another model.
    """

    ranges: Any
    samples: int
    random: bool
    method: str
    graph_sha256: str


class ArrayCalibrationReader:
    """Feed arrays (by graph input name) to ONNX Runtime's calibrator in batches along axis 0 (an
    ``onnxruntime.quantization.CalibrationDataReader`` by its ``get_next``; ONNX Runtime checks no more)."""

    def __init__(self, data: Mapping[str, np.ndarray], batch_size: int, drop_last: bool = False) -> None:
        """Batches of ``batch_size``; ``drop_last`` skips a short final batch (for a static batch axis)."""
        self.data = dict(data)
        self.rows = len(next(iter(self.data.values())))
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._start = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        """Return the next batch as ``{input_name: array}``, or ``None`` when exhausted."""
        end = self.rows - (self.rows % self.batch_size if self.drop_last else 0)
        if self._start >= end:
            return None
        batch = {n: a[self._start : self._start + self.batch_size] for n, a in self.data.items()}
        self._start += self.batch_size
        return batch

    def rewind(self) -> None:
        """Start again from the first batch."""
        self._start = 0

    def __iter__(self) -> ArrayCalibrationReader:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = self.get_next()
        if batch is None:
            raise StopIteration
        return batch


Spec = tuple[str, list[int | None], np.dtype]


def _input_specs(model: onnx.ModelProto) -> list[Spec]:
    """Every graph input's name, shape (``None`` for symbolic dims) and numpy dtype."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in (i for i in model.graph.input if i.name not in initializers):
        tensor_type = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        specs.append((value.name, shape, onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
    return specs


def _random_calibration(spec: Spec, config: QuantConfig) -> np.ndarray:
    """Standard-normal calibration data for a float input whose only symbolic dim is the batch."""
    name, shape, dtype = spec
    if np.dtype(dtype).kind != "f":
        raise CalibrationError(f"input {name!r} is {np.dtype(dtype)}: random values would be out of range (token "
                               "ids, masks); give calibration data")
    if any(d is None for d in shape[1:]):
        raise CalibrationError(f"input {name!r} has symbolic dims {shape}; random calibration needs static ones")
    samples = max(config.random_samples, shape[0] or 0)
    return np.random.default_rng(config.seed).standard_normal((samples, *shape[1:])).astype(dtype)


def _by_name(calib: Calib, specs: list[Spec]) -> dict[str, np.ndarray]:
    """Calibration arrays keyed by input name (one array feeds a one-input graph)."""
    names = [n for n, _, _ in specs]
    if not isinstance(calib, Mapping):
        if len(specs) != 1:
            raise CalibrationError(f"the graph has inputs {names}; give calibration data by input name")
        return {names[0]: np.asarray(calib)}
    if sorted(calib) != sorted(names):
        raise CalibrationError(f"calibration data names inputs {sorted(calib)} but the graph's are {names}")
    rows = {n: len(calib[n]) for n in names}
    if len(set(rows.values())) > 1:
        raise CalibrationError(f"calibration inputs have different sample counts {rows}")
    return {n: np.asarray(calib[n]) for n in names}


def _calibration_array(
    calib: Calib | None, model: onnx.ModelProto, config: QuantConfig
) -> tuple[dict[str, np.ndarray], bool]:
    """Check (or, if allowed, generate) calibration data; return it cast to the inputs' dtypes and a random flag."""
    specs = _input_specs(model)
    if calib is None:
        if not config.allow_random_calibration:
            raise CalibrationError(
                "static INT8 quantisation needs calibration data (a few hundred representative inputs); "
                "pass calib=array or set QuantConfig(allow_random_calibration=True) to accept random data"
            )
        logger.warning("calibrating %s on random data: INT8 ranges will not match real inputs",
                       ", ".join(repr(n) for n, _, _ in specs))
        return {spec[0]: _random_calibration(spec, config) for spec in specs}, True
    arrays = _by_name(calib, specs)
    for name, shape, _ in specs:
        a = arrays[name]
        fits = a.ndim == len(shape) and all(d is None or d == c for d, c in zip(shape[1:], a.shape[1:]))
        if not fits or len(a) == 0:
            raise CalibrationError(f"calibration data of shape {a.shape} does not fit input {name!r} of shape {shape}")
    return {name: arrays[name].astype(dtype, copy=False) for name, _, dtype in specs}, False


@contextlib.contextmanager
def _working_directory(folder: Path) -> Iterator[None]:
    """Run the block in ``folder``: ONNX Runtime's symbolic shape inference, when it fails, saves a debugging copy of
    the model (``sym_shape_infer_temp.onnx`` and an external-data file) into the current directory, which must not
    be the user's."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _preprocess(fp32_path: Path, out: Path, align: bool = False) -> tuple[Path, str | None]:
    """Run ``quant_pre_process`` (then :func:`_rewrite` on its output); retry without symbolic shape inference, else
    use the float model as is."""
    _ort_quantization()
    from onnxruntime.quantization.shape_inference import quant_pre_process

    note, source, dest = None, str(fp32_path.resolve()), str(out.resolve())
    for options in ({}, {"skip_symbolic_shape": True}):
        try:
            with _working_directory(out.parent):
                quant_pre_process(source, dest, **options)
        except Exception as exc:
            note = f"quant_pre_process{' without symbolic shapes' if options else ''} failed: {error_line(exc)}"
            logger.warning("%s", note)
            continue
        _rewrite(out, align)
        return out, note
    return fp32_path, note


def _rewrite(path: Path, align: bool) -> None:
    """Rewrite the pre-processed file's graph once: means over every spatial axis as ``GlobalAveragePool``
    (:func:`minreal.export.qdq_pools.global_average_pools`: ONNX Runtime runs that one on quantised tensors) and, when
    ``align``, convolutions widened to input channels on a multiple of 4
    (:func:`minreal.export.qdq_channels.align_conv_inputs`). External data stays where it is."""
    model = onnx.load(str(path), load_external_data=False)
    pooled = global_average_pools(model)
    widened = align_conv_inputs(model) if align else []
    if pooled or widened:
        onnx.save(model, str(path))
    if widened:
        logger.debug("%s: input channels widened to a multiple of 4 for %s", path.name, ", ".join(widened))


def _aligns(config: QuantConfig) -> bool:
    """Whether ``config`` (resolved) widens convolution inputs: static mode, an x86 CPU target (``cpu-vnni``,
    ``cpu-avx2``; not ``arm64``) on an x86 machine (the rule is MLAS's x86 kernel's; ARM's differs), not turned
    off."""
    return (config.align_channels and config.mode == "static" and config.target in cpu_facts.CPU_TARGETS
            and not cpu_facts.cpu_isa().is_arm)


def _reader(model: onnx.ModelProto, data: Mapping[str, np.ndarray], config: QuantConfig) -> ArrayCalibrationReader:
    """Calibration reader; a static batch axis fixes the batch size (and drops a short last batch)."""
    name, shape, _ = _input_specs(model)[0]
    rows = len(next(iter(data.values())))
    if shape[0] is not None and rows < shape[0]:
        raise CalibrationError(f"{rows} calibration samples < static batch {shape[0]} of input {name!r}")
    return ArrayCalibrationReader(data, shape[0] or config.batch_size, drop_last=shape[0] is not None)


class _PerChannelAxisNoise(logging.Filter):
    """Drops onnxruntime's root-logger warning that a 1-D weight (e.g. a norm scale) has no per-channel axis 1;
    such weights are quantised per tensor, which is what we want."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is out-of-range for weight" not in record.getMessage()


def _value_dependent(model: onnx.ModelProto) -> set[str]:
    """Tensors whose values depend on the graph inputs' values (Shape/Size outputs depend only on shapes)."""
    live = {i.name for i in model.graph.input}
    for node in model.graph.node:  # ONNX nodes are stored in topological order
        if node.op_type not in ("Shape", "Size") and any(i in live for i in node.input):
            live.update(node.output)
    return live


def dynamic_weight_nodes(model: onnx.ModelProto) -> list[str]:
    """Nodes that static quantisation should leave in float: weight-generating nodes (no input depends on the
    data, e.g. an SSM kernel built from its parameters and the sequence length) and Conv/ConvTranspose/Gemm
    nodes whose weight is computed in the graph rather than stored."""
    live = _value_dependent(model)
    constants = {i.name for i in model.graph.initializer}
    excluded = []
    for n in model.graph.node:
        generates = not any(i in live for i in n.input)
        computed_weight = (n.op_type in ("Conv", "ConvTranspose", "Gemm") and len(n.input) > 1
                           and n.input[1] not in constants)
        if n.name and (generates or computed_weight):
            excluded.append(n.name)
    return excluded


_WEIGHTED_OPS = ("Conv", "Gemm", "MatMul")
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
_NONFINITE_ROUNDS = 4
_ROUNDTRIP_ROUNDS = 4
_SHARED_PARAMS_OPS = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool"})
"""Ops whose output ORT's QDQ quantiser gives its input's scale and zero point, and which commute with a
per-tensor quantiser (they move or select values): a range trained for the output holds for the input too."""
_ZERO_POINT_TYPES = {"uint8": np.uint8, "int8": np.int8}


def _weight_consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Initializer name → the Conv/Gemm/MatMul nodes that take it as their weight (input 1)."""
    constants = {t.name for t in model.graph.initializer}
    found: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        if n.op_type in _WEIGHTED_OPS and len(n.input) > 1 and n.input[1] in constants:
            found.setdefault(n.input[1], []).append(n)
    return found


def _same_values(tensor: onnx.TensorProto, weight: np.ndarray) -> bool:
    """The initializer holds ``weight``, as is or transposed (a Linear written as Gemm/MatMul with (in, out)), or
    widened with zero input channels (:func:`minreal.export.qdq_channels.align_conv_inputs`)."""
    dims = tuple(tensor.dims)
    if weight.ndim >= 3 and len(dims) == weight.ndim and dims[0] == weight.shape[0] and dims[2:] == weight.shape[2:] \
            and dims[1] > weight.shape[1]:
        value = numpy_helper.to_array(tensor)
        return np.array_equal(value[:, :weight.shape[1]], weight) and not value[:, weight.shape[1]:].any()
    if dims not in (weight.shape, weight.shape[::-1]):
        return False
    value = numpy_helper.to_array(tensor)
    return np.array_equal(value, weight) or (value.ndim == 2 and np.array_equal(value, weight.T))


def module_inputs(model: onnx.ModelProto, modules: Iterable[str],
                  weights: Mapping[str, np.ndarray] | None = None) -> dict[str, list[str]]:
    """Module name → input tensors of the Conv/Gemm/MatMul nodes whose weight comes from that module.

    A weight is found by the initializer name ``<module>.weight``, else (given ``weights``, module name → array)
    by equal values; modules found neither way are left out.
    """
    consumers = _weight_consumers(model)
    candidates = {t.name: t for t in model.graph.initializer if t.name in consumers}
    found = {}
    for name in modules:
        key = f"{name}.weight"
        if key not in consumers and weights is not None and name in weights:
            key = next((k for k, t in candidates.items() if _same_values(t, np.asarray(weights[name]))), key)
        if key in consumers:
            found[name] = list(dict.fromkeys(n.input[0] for n in consumers[key]))
    return found


def _zero_pad(node: onnx.NodeProto) -> bool:
    """A constant ``Pad`` with the default zero value (no ``constant_value`` input): ORT's QDQ quantiser gives its
    output its input's parameters, and padding with a zero commutes with a per-tensor quantiser whose range holds
    zero (every asymmetric uint8 range does)."""
    mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
    return node.op_type == "Pad" and mode == b"constant" and (len(node.input) < 3 or not node.input[2])


def _upstream(model: onnx.ModelProto, tensor: str) -> list[str]:
    """Tensors above ``tensor`` through :data:`_SHARED_PARAMS_OPS` and zero pads (:func:`_zero_pad`), each the only
    use of its value."""
    producers = {o: n for n in model.graph.node for o in n.output}
    uses = collections.Counter(i for n in model.graph.node for i in n.input)
    chain, node = [], producers.get(tensor)
    while node is not None and (node.op_type in _SHARED_PARAMS_OPS or _zero_pad(node)) and uses[node.input[0]] == 1:
        chain.append(node.input[0])
        node = producers.get(node.input[0])
    return chain


def _override(r: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
    return [{"scale": np.array(r["scale"], dtype=np.float32),
             "zero_point": np.array(r["zero_point"], dtype=_ZERO_POINT_TYPES[r["dtype"]])}]


def trained_overrides(model: onnx.ModelProto, ranges: Mapping[str, Mapping[str, Any]],
                      weights: Mapping[str, np.ndarray] | None = None
                      ) -> tuple[dict[str, list[dict[str, np.ndarray]]], dict[str, list[str]]]:
    """(``TensorQuantOverrides`` for ORT, module → its input tensors) placing each trained range on its layer's
    input tensor, and on the tensors above it whose parameters ORT shares with it (:data:`_SHARED_PARAMS_OPS`:
    ORT would ignore an override below them). A range set directly on a layer's input wins over one reaching a
    tensor from further down."""
    direct = module_inputs(model, ranges, weights)
    overrides: dict[str, list[dict[str, np.ndarray]]] = {}
    for name, tensors in direct.items():
        for t in tensors:
            overrides.setdefault(t, _override(ranges[name]))
    for name, tensors in direct.items():
        for up in (u for t in tensors for u in _upstream(model, t)):
            overrides.setdefault(up, _override(ranges[name]))
    return overrides, direct


def _written_params(path: Path) -> dict[str, tuple[float, int]]:
    """Tensor → (scale, zero point) of the QuantizeLinear that quantises it in a written QDQ model."""
    model = onnx.load(str(path), load_external_data=False)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.input[0]: (float(values[n.input[1]]), int(values[n.input[2]])) for n in model.graph.node
            if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[1] in values and n.input[2] in values
            and values[n.input[1]].size == 1}


def _applied(path: Path, direct: dict[str, list[str]], ranges: Mapping[str, Mapping[str, Any]]
             ) -> tuple[int, list[str]]:
    """(tensors written with their trained scale and zero point, modules whose range is not in the graph)."""
    written = _written_params(path)
    trained, untrained = set(), []
    for name, r in ranges.items():
        tensors = direct.get(name, [])
        hits = [t for t in tensors if written.get(t) == (float(np.float32(r["scale"])), int(r["zero_point"]))]
        if tensors and len(hits) == len(tensors):
            trained.update(hits)
        else:
            untrained.append(name)
    return len(trained), untrained


_WEIGHT_BITS = {WEIGHT_QMAX: 8, REDUCED_WEIGHT_QMAX: 7}


def _weight_qmax(config: QuantConfig) -> int:
    """The largest weight magnitude the file's grid has: 127, or 64 with ``reduce_range`` (the grid QAT trains on,
    ``minreal.compress.core.qat``)."""
    return REDUCED_WEIGHT_QMAX if config.weights_reduced() else WEIGHT_QMAX


def _check_ranges(ranges: Mapping[str, Mapping[str, Any]], config: QuantConfig) -> None:
    """Trained ranges need static mode and the activation format they were trained in."""
    if config.mode != "static":
        raise QuantizationError("trained activation ranges apply to static quantisation; got mode='dynamic'")
    act_type, symmetric = config.activation()
    qmax = _weight_qmax(config)
    for name, r in ranges.items():
        if (r["dtype"], bool(r["symmetric"])) != (act_type, symmetric):
            kind = lambda t, sym: f"{t} {'symmetric' if sym else 'asymmetric'}"  # noqa: E731
            raise QuantizationError(
                f"the activation range of {name!r} was trained for {kind(r['dtype'], r['symmetric'])} activations "
                f"but target {config.target!r} writes {kind(act_type, symmetric)}; recover for the same target")
        if int(r.get("weight_qmax", 127)) != qmax:
            raise QuantizationError(
                f"the layer {name!r} was trained with weights on [-{r.get('weight_qmax', 127)}, "
                f"{r.get('weight_qmax', 127)}] but target {config.target!r} writes [-{qmax}, {qmax}] (cpu-avx2 has "
                "7-bit weights, cpu-vnni 8-bit ones); recover for the same target")


def _excluded(source: Path, exclude: Sequence[str], static: bool) -> list[str]:
    """Nodes to leave in float: in static mode :func:`dynamic_weight_nodes` of the graph to quantise, then the
    caller's ``exclude`` (checked to name nodes of that graph: ONNX Runtime would ignore an unknown name)."""
    model = onnx.load(str(source), load_external_data=False)
    unknown = sorted(set(exclude) - {n.name for n in model.graph.node})
    if unknown:
        raise ValueError(f"exclude names nodes {unknown} that are not in the graph ONNX Runtime quantises; "
                         "take names from minreal.export.quantize.quantizable_nodes")
    return list(dict.fromkeys([*(dynamic_weight_nodes(model) if static else []), *exclude]))


_RangeSource = Path | ArrayCalibrationReader
"""Where static quantisation takes its activation ranges from: a file of ONNX Runtime's calibration cache
(:func:`_range_source`), or a reader it calibrates on (again in every quantisation)."""


def _run_static(source: Path, dest: Path, ranges: _RangeSource, config: QuantConfig,
                overrides: Mapping[str, list[dict[str, np.ndarray]]] | None = None,
                excluded: Sequence[str] = ()) -> None:
    """Static QDQ quantisation with the activation ranges of ``ranges``, leaving the ``excluded`` nodes in float
    (with the channel ``Pad`` that :func:`_rewrite` put before an excluded convolution: it gains nothing in
    float and must not quantise that convolution's input)."""
    if excluded:
        pads = channel_pads(onnx.load(str(source), load_external_data=False))
        excluded = list(dict.fromkeys([*excluded, *(pads[n] for n in excluded if n in pads)]))
    act_type, symmetric = config.activation()
    noise = _PerChannelAxisNoise()
    logging.getLogger().addFilter(noise)
    try:
        with warnings.catch_warnings():
            # An infinite calibrated range makes ORT divide by an infinite scale; _run_static_finite finds those
            # scales in the written graph, leaves their nodes in float and says so, so numpy's warning adds nothing.
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"onnxruntime\.quantization\.quant_utils")
            _quantize_static(source, dest, ranges, config, act_type, symmetric, list(excluded), overrides or {})
    finally:
        logging.getLogger().removeFilter(noise)
    if config.target in _ORT_CPU_TARGETS:
        _pad_quantised(dest)


def _stamp_target(path: Path, target: str) -> None:
    """Record the file's explicit INT8 target in its metadata (:data:`minreal.facts.INT8_TARGET_KEY`), so every
    ONNX Runtime session of it runs the graph its target's builds make (an ``arm64`` file: ARM's int8 fusions)."""
    model = onnx.load(str(path), load_external_data=False)
    kept = [p for p in model.metadata_props if p.key != INT8_TARGET_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=INT8_TARGET_KEY, value=target)
    onnx.save(model, str(path))


def _pad_quantised(path: Path) -> None:
    """Run the file's constant zero pads between a dequantise and a re-quantise of one scale on the quantised tensors
    (:func:`minreal.export.qdq_pads.integer_pads`; ONNX Runtime's CPU graph would run them in float)."""
    model = onnx.load(str(path), load_external_data=False)
    pads = integer_pads(model)
    if pads:
        onnx.save(model, str(path))
        logger.debug("%s: %d pad(s) run on quantised tensors: %s", path.name, len(pads), ", ".join(pads))


def _quantize_static(source: Path, dest: Path, ranges: _RangeSource, config: QuantConfig,
                     act_type: str, symmetric: bool, excluded: list[str],
                     overrides: Mapping[str, list[dict[str, np.ndarray]]]) -> None:
    q = _ort_quantization()
    if isinstance(ranges, ArrayCalibrationReader):
        ranges.rewind()
    feed = {"calibration_cache_path": str(ranges)} if isinstance(ranges, Path) else {"calibration_data_reader": ranges}
    q.quantize_static(
        str(source), str(dest), **feed, nodes_to_exclude=excluded,
        quant_format=q.QuantFormat.QDQ, per_channel=config.per_channel,
        activation_type=getattr(q.QuantType, _QUANT_TYPES[act_type]),
        weight_type=getattr(q.QuantType, _QUANT_TYPES[config.weight_type]), reduce_range=config.weights_reduced(),
        calibrate_method=getattr(q.CalibrationMethod, _CALIBRATION_METHODS[config.calibration_method]),
        extra_options={
            "ActivationSymmetric": symmetric, "WeightSymmetric": config.weight_type == "int8",
            "QuantizeBias": _TARGETS[config.target].quantize_bias,
            **({"TensorQuantOverrides": dict(overrides)} if overrides else {}),
        },
    )  # fmt: skip


def _constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Initializers and Constant-node tensors by name."""
    consts = {i.name: i for i in model.graph.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in model.graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR})
    return consts


def _nonfinite_scales(model: onnx.ModelProto) -> list[str]:
    """Scale tensors of Q/DQ nodes that are not finite."""
    consts = _constants(model)
    return sorted({n.input[1] for n in model.graph.node if n.op_type in _QDQ_OPS and len(n.input) > 1
                   and n.input[1] in consts and not np.isfinite(numpy_helper.to_array(consts[n.input[1]])).all()})


def nonfinite_scale_nodes(model: onnx.ModelProto) -> list[str]:
    """Float nodes of a QDQ graph that read or write a tensor quantised with a scale that is not finite (inf or
    NaN: calibration met an infinite value, e.g. a 0/-inf attention mask), in graph order."""
    consts = _constants(model)
    bad, dequantised = set(), {}
    for n in model.graph.node:
        if n.op_type in _QDQ_OPS and len(n.input) > 1 and n.input[1] in consts:
            if not np.isfinite(numpy_helper.to_array(consts[n.input[1]])).all():
                bad.update((n.input[0], n.output[0]))
        if n.op_type == "DequantizeLinear":
            dequantised[n.output[0]] = n.input[0]
    bad |= {out for out, src in dequantised.items() if src in bad}
    return [n.name for n in model.graph.node
            if n.op_type not in _QDQ_OPS and n.name and bad & {*n.input, *n.output}]


def _run_static_finite(source: Path, dest: Path, ranges: _RangeSource, config: QuantConfig,
                       overrides: Mapping[str, list[dict[str, np.ndarray]]], excluded: list[str],
                       label: str) -> list[str]:
    """:func:`_run_static`, then again with the nodes around non-finite scales in float until none is left (a few
    rounds at most: each round only adds nodes). Returns the nodes it added to ``excluded``; ``label`` names the
    user's file in messages."""
    added: list[str] = []
    for _ in range(_NONFINITE_ROUNDS):
        _run_static(source, dest, ranges, config, overrides, [*excluded, *added])
        written = onnx.load(str(dest), load_external_data=False)
        if not _nonfinite_scales(written):
            if added:
                logger.warning("%s: calibration gave non-finite scales (an infinite value, e.g. a -inf attention "
                               "mask) around %d node(s), left in float: %s", label, len(added), ", ".join(added))
            return added
        new = [n for n in nonfinite_scale_nodes(written) if n not in added]
        if not new:
            raise QuantizationError(f"{label}: non-finite quantisation scales on tensors of unnamed nodes, which "
                                    "cannot be left in float; name the nodes or exclude them by hand")
        added += new
    raise QuantizationError(f"non-finite quantisation scales remain after {_NONFINITE_ROUNDS} rounds of leaving "
                            f"their nodes in float ({', '.join(added)}); exclude them by hand")


def _qdq_cost(graph: onnx.GraphProto) -> tuple[int, int, set[str]]:
    """(Q/DQ nodes, integer Conv/MatMul/Gemm kernels, names of the float round-trip nodes) of an ORT CPU graph."""
    ops = op_counts(graph)
    return (ops["QuantizeLinear"] + ops["DequantizeLinear"], _kernel_counts(dict(ops))[0],
            {n.name for n in float_roundtrip_nodes(graph)})


def _drop_roundtrips(source: Path, dest: Path, ranges: _RangeSource, config: QuantConfig,
                     overrides: Mapping[str, list[dict[str, np.ndarray]]], excluded: list[str],
                     graph: onnx.GraphProto) -> tuple[list[str], onnx.GraphProto]:
    """Quantise ``source`` again into ``dest`` with the nodes that ORT's CPU graph of ``dest`` (``graph``) runs in
    float between a DequantizeLinear and a QuantizeLinear (named in ``source``) left in float, a few rounds at most.

    An exclusion is kept only where its round trip is gone (a quantised neighbour can keep the tensor quantised),
    and the new file only if ORT's graph has fewer Q/DQ nodes and no fewer integer kernels than the first; otherwise
    the first file is restored. Returns the nodes it added to ``excluded`` (those whose round trip it removed) and
    ORT's CPU graph of the file it leaves.
    """
    names = {n.name for n in onnx.load(str(source), load_external_data=False).graph.node if n.name}
    first, first_graph = dest.read_bytes(), graph
    qdq0, int0, trips = _qdq_cost(graph)
    kept: list[str] = []
    tried: set[str] = set()
    for last in (i == _ROUNDTRIP_ROUNDS - 1 for i in range(_ROUNDTRIP_ROUNDS)):
        stale = [n for n in kept if n in trips]
        new = [] if last else sorted(n for n in trips if n in names and n not in tried and n not in excluded)
        if not stale and not new:
            break
        kept, tried = [n for n in kept if n not in trips] + new, tried | set(new)
        _run_static(source, dest, ranges, config, overrides, [*excluded, *kept])
        graph = optimized_graph(dest, "cpu")
        qdq, integer, trips = _qdq_cost(graph)
    if kept and not (qdq < qdq0 and integer >= int0):
        dest.write_bytes(first)
        return [], first_graph
    if kept:
        logger.info("%s: %d node(s) ran in float between a dequantise and a re-quantise; left in float: %s",
                    dest.name, len(kept), ", ".join(kept))
    return kept, graph


def _ort_quantization() -> ModuleType:
    """``onnxruntime.quantization`` (imported on first use: the base install may have no runtime wheel)."""
    onnxruntime_module()
    import onnxruntime.quantization

    return onnxruntime.quantization


def reusable_calibration() -> bool:
    """Whether this ONNX Runtime quantises with ranges calibrated before (``quantize_static``'s
    ``calibration_cache_path``; onnxruntime 1.32 has it): :func:`calibrate` needs it; without it, every static
    quantisation calibrates again (also each round of one :func:`quantize_int8`)."""
    return "calibration_cache_path" in inspect.signature(_ort_quantization().quantize_static).parameters


def _require_reusable() -> None:
    if not reusable_calibration():
        raise QuantizationError("reusing calibrated ranges needs onnxruntime.quantization.quantize_static's "
                                "calibration_cache_path (onnxruntime 1.32 has it); upgrade onnxruntime, or quantise "
                                "without calibration= (each quantisation then calibrates)")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _calibrated(source: Path, reader: ArrayCalibrationReader, config: QuantConfig, random: bool) -> Calibration:
    """ONNX Runtime's calibration of ``source`` on ``reader``, set up as ``quantize_static`` sets up its own: the
    calibrator of ``config.calibration_method`` over the op types its quantisers handle, no extra options."""
    q = _ort_quantization()
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    method = getattr(q.CalibrationMethod, _CALIBRATION_METHODS[config.calibration_method])
    with tempfile.TemporaryDirectory() as workdir:
        calibrator = q.create_calibrator(source, sorted({*QLinearOpsRegistry, *QDQRegistry}),
                                         augmented_model_path=str(Path(workdir) / "augmented_model.onnx"),
                                         calibrate_method=method)
        reader.rewind()
        calibrator.collect_data(reader)
        ranges = calibrator.compute_data()
    return Calibration(ranges, reader.rows, random, config.calibration_method, _sha256(source))


def _check_calibration(calibration: Calibration, source: Path, config: QuantConfig) -> None:
    """``calibration`` was measured on the graph ``source`` with ``config``'s calibration method."""
    if calibration.method != config.calibration_method:
        raise ValueError(f"the ranges were calibrated with {calibration.method!r} but the config asks for "
                         f"{config.calibration_method!r}; calibrate with the same QuantConfig")
    if calibration.graph_sha256 != _sha256(source):
        raise ValueError("the ranges were calibrated on another graph; calibrate this model "
                         "(minreal.export.quantize.calibrate)")


def _range_source(source: Path, workdir: Path, reader: ArrayCalibrationReader | None, calibration: Calibration | None,
                  config: QuantConfig, random: bool) -> _RangeSource:
    """The ranges of every static quantisation of one :func:`quantize_int8`: ``calibration`` (else a calibration of
    ``source`` on ``reader``) in a cache file in ``workdir``; ``reader`` itself where ONNX Runtime reads no cache."""
    if calibration is None and not reusable_calibration():
        return reader
    calibration = calibration or _calibrated(source, reader, config, random)
    path = workdir / "ranges.json"
    _ort_quantization().save_tensors_data(calibration.ranges, path)
    return path


def _run_dynamic(source: Path, dest: Path, config: QuantConfig, excluded: Sequence[str] = ()) -> None:
    """Dynamic quantisation: int8 weights, activations quantised at run time; ``excluded`` nodes stay float."""
    q = _ort_quantization()
    q.quantize_dynamic(str(source), str(dest), per_channel=config.per_channel, reduce_range=config.weights_reduced(),
                       weight_type=getattr(q.QuantType, _QUANT_TYPES[config.weight_type]),
                       nodes_to_exclude=list(excluded))


def optimized_op_counts(path: str | Path, provider: str = "cpu") -> dict[str, int]:
    """Op counts of the graph ONNX Runtime actually runs for ``provider`` (all optimisations on).

    Delegates to :func:`minreal.runtime_bench.optimized_graph_ops` so the project counts kernels one way.
    """
    return optimized_graph_ops(Path(path), provider)


def _kernel_counts(op_counts: dict[str, int]) -> tuple[int, int]:
    """Return (integer, float) Conv/MatMul/Gemm kernel counts from domain-prefixed op counts."""
    integer = sum(n for op, n in op_counts.items() if op.rsplit(":", 1)[-1] in INTEGER_KERNEL_OPS)
    floating = sum(n for op, n in op_counts.items() if op.rsplit(":", 1)[-1] in FLOAT_KERNEL_OPS)
    return integer, floating


def int8_skip_reason(fp32_path: str | Path) -> str | None:
    """Why INT8 is not made for ``fp32_path`` (``None`` when it can be): a model with external data (weights
    beside the graph, e.g. one over 2 GiB) is not quantised; the pipeline records this line instead."""
    if not data_files(fp32_path):
        return None
    return ("the model keeps its weights in external data; INT8 quantisation here loads one in-memory protobuf "
            "(at most 2 GiB)")


def calibrate(fp32_path: str | Path, calib: Calib | None = None, config: QuantConfig | None = None) -> Calibration:
    """The activation ranges static :func:`quantize_int8` calibrates for ``fp32_path`` on ``calib``: pass them as its
    ``calibration`` to quantise the model many times (e.g. with different nodes left in float) calibrating once.

    Args:
        fp32_path: float model (not modified).
        calib: calibration inputs, as for :func:`quantize_int8`.
        config: options (static mode); the quantisations must use the same ``calibration_method``.

    Raises:
        CalibrationError: no or ill-shaped calibration data.
        ValueError: ``config`` is for dynamic mode (nothing is calibrated).
        QuantizationError: ONNX Runtime could not calibrate the model, the model keeps its weights in external data,
            or this ONNX Runtime cannot quantise with precomputed ranges (:func:`reusable_calibration`).
    """
    config = (config or QuantConfig()).resolved()
    if config.mode != "static":
        raise ValueError("mode='dynamic' calibrates nothing; calibrate for mode='static'")
    _require_reusable()
    fp32_path = Path(fp32_path)
    skip = int8_skip_reason(fp32_path)
    if skip:
        raise QuantizationError(f"cannot calibrate {fp32_path.name} for INT8: {skip}")
    model = onnx.load(str(fp32_path))
    data, is_random = _calibration_array(calib, model, config)
    reader = _reader(model, data, config)
    with tempfile.TemporaryDirectory() as workdir:
        source, _ = _preprocess(fp32_path, Path(workdir) / "preprocessed.onnx", _aligns(config))
        try:
            return _calibrated(source, reader, config, is_random)
        except Exception as exc:
            raise QuantizationError(f"calibration of {fp32_path.name} failed: {error_line(exc)}") from exc


def quantize_int8(
    fp32_path: str | Path,
    out_path: str | Path,
    calib: Calib | None = None,
    config: QuantConfig | None = None,
    activation_ranges: Mapping[str, Mapping[str, Any]] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    exclude: Sequence[str] = (),
    calibration: Calibration | None = None,
) -> QuantResult:
    """Quantise a float ONNX model to INT8 with ONNX Runtime and count its integer kernels.

    Args:
        fp32_path: float model (not modified).
        out_path: destination (must differ from ``fp32_path``); written atomically.
        calib: calibration inputs, batch along axis 0 (static mode): one array, or arrays by graph input name
            for several inputs (integer inputs such as token ids feed the calibration as they are; only float
            tensors get ranges). ``None`` is refused unless ``config.allow_random_calibration`` (and every input
            is float).
        config: options; default :class:`QuantConfig` (static, cpu target).
        activation_ranges: trained input ranges by module name (a recovery's ``activation_ranges``: ``scale``,
            ``zero_point``, ``dtype``, ``symmetric``); their layers' input tensors get exactly these parameters,
            all other tensors are calibrated on ``calib``.
        weights: module name → weight array, to find a module whose initializer the exporter renamed.
        exclude: nodes to leave in float, named as in the pre-processed graph (:func:`quantizable_nodes`);
            added to those whose weights the graph computes.
        calibration: ranges from :func:`calibrate` of this model with this config's ``calibration_method`` (static
            mode): used instead of calibrating, for the same file; ``calib`` is then not read.

    Returns:
        A :class:`QuantResult`.

    Raises:
        CalibrationError: no or ill-shaped calibration data.
        ValueError: ``exclude`` names a node that is not in the pre-processed graph, or ``calibration`` is of
            another graph or calibration method, or given in dynamic mode.
        QuantizationError: ONNX Runtime could not quantise the model, the trained ranges are for another
            activation format (or for dynamic mode), the model keeps its weights in external data
            (:func:`int8_skip_reason`), or ``calibration`` is given to an ONNX Runtime that cannot use it
            (:func:`reusable_calibration`).
    """
    requested = (config or QuantConfig()).target
    config = (config or QuantConfig()).resolved()
    ranges = dict(activation_ranges or {})
    if ranges:
        _check_ranges(ranges, config)
    ensure_distinct(fp32_path, out_path)
    skip = int8_skip_reason(fp32_path)
    if skip:
        raise QuantizationError(f"cannot quantise {Path(fp32_path).name} to INT8: {skip}")
    fp32_path, out_path = Path(fp32_path), Path(out_path)
    static = config.mode == "static"
    if calibration is not None:
        if not static:
            raise ValueError("calibration= is for mode='static'; dynamic quantisation calibrates nothing")
        _require_reusable()
    model = onnx.load(str(fp32_path))
    data, is_random = _calibration_array(calib, model, config) if static and calibration is None else (None, False)
    reader = _reader(model, data, config) if data is not None else None
    if calib is not None and not static:
        logger.info("dynamic quantisation ignores the calibration data")
    with tempfile.TemporaryDirectory() as workdir, atomic_path(out_path) as tmp:
        source, note = _preprocess(fp32_path, Path(workdir) / "preprocessed.onnx", _aligns(config))
        overrides, direct = trained_overrides(onnx.load(str(source)), ranges, weights) if ranges else ({}, {})
        excluded = _excluded(source, exclude, static=static)
        if calibration is not None:
            _check_calibration(calibration, source, config)
        try:
            roundtrip: list[str] = []
            if static:
                calibrated = _range_source(source, Path(workdir), reader, calibration, config, is_random)
                nonfinite = _run_static_finite(source, tmp, calibrated, config, overrides, excluded, fp32_path.name)
            else:
                nonfinite = []
                _run_dynamic(source, tmp, config, excluded)
            graph = optimized_graph(tmp, "cpu", config=_TARGET_GRAPHS.get(config.target))
            if static and config.drop_roundtrips and config.target in cpu_facts.CPU_TARGETS:
                roundtrip, graph = _drop_roundtrips(source, tmp, calibrated, config, overrides,
                                                    [*excluded, *nonfinite], graph)
        except QuantizationError:
            raise
        except Exception as exc:
            raise QuantizationError(f"{config.mode} quantisation of {fp32_path.name} failed: "
                                    f"{error_line(exc)}") from exc
        _stamp_target(tmp, config.target)
    trained, untrained = _applied(out_path, direct, ranges) if ranges else (0, [])
    if untrained:
        logger.warning("%s: the trained activation ranges of %s are not in the graph; calibrated instead",
                       out_path.name, ", ".join(untrained))
    samples = 0 if data is None else len(next(iter(data.values())))
    if calibration is not None:
        samples, is_random = calibration.samples, calibration.random
    return dataclasses.replace(
        _result(fp32_path, out_path, graph, config, samples, is_random, note),
        excluded_nodes=[*excluded, *nonfinite, *roundtrip], nonfinite_nodes=nonfinite, roundtrip_nodes=roundtrip,
        requested_target=requested,
        range_source="trained" if trained else "calibrated", trained_ranges=trained, untrained_modules=untrained)


def _result(
    fp32_path: Path, out_path: Path, graph: onnx.GraphProto, config: QuantConfig, samples: int, is_random: bool,
    note: str | None
) -> QuantResult:
    """Assemble the :class:`QuantResult`, counting ops in the written graph and in ``graph``, ORT's optimised CPU
    graph of it."""
    static = config.mode == "static"
    act_type, symmetric = config.activation() if static else ("uint8", False)
    written = onnx.load(str(out_path), load_external_data=False)
    optimized, roundtrips = dict(op_counts(graph)), float_roundtrips(graph)
    integer, floating = _kernel_counts(optimized)
    logger.info("%s: %d integer and %d float Conv/MatMul/Gemm kernels on CPU", out_path.name, integer, floating)
    return QuantResult(
        fp32_path=str(fp32_path), out_path=str(out_path), mode=config.mode, target=config.target,
        quant_format="QDQ" if static else "QOperator", activation_type=act_type, activation_symmetric=symmetric,
        weight_type=config.weight_type, per_channel=config.per_channel,
        weight_bits=_WEIGHT_BITS[_weight_qmax(config)],
        saturates_here=saturates_here(config.weight_type, config.weights_reduced()),
        quantized_bias=static and _TARGETS[config.target].quantize_bias, calibration_samples=samples,
        random_calibration=is_random,
        preprocess_note=note, node_counts=dict(collections.Counter(n.op_type for n in written.graph.node)),
        optimized_ops=optimized, integer_kernels=integer, float_kernels=floating, float_roundtrips=roundtrips,
        size_fp32_bytes=fp32_path.stat().st_size, size_int8_bytes=out_path.stat().st_size,
    )  # fmt: skip


def quantizable_nodes(fp32_path: str | Path) -> list[str]:
    """Conv/Gemm/MatMul nodes that static :func:`quantize_int8` quantises, in graph order, named as in the graph
    ONNX Runtime's quantiser sees (after ``quant_pre_process``): the names its ``exclude`` takes.

    Unnamed nodes (which cannot be excluded) and nodes whose weights the graph computes are left out.
    """
    with tempfile.TemporaryDirectory() as workdir:
        source, _ = _preprocess(Path(fp32_path), Path(workdir) / "preprocessed.onnx")
        model = onnx.load(str(source), load_external_data=False)
    computed = set(dynamic_weight_nodes(model))
    return [n.name for n in model.graph.node if n.op_type in _WEIGHTED_OPS and n.name and n.name not in computed]
