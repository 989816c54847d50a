"""The options of an INT8 quantisation (:class:`QuantConfig`) and what it wrote (:class:`QuantResult`)."""

from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY, dataclass, field

import minreal.runtime_bench.cpu as cpu_facts
from minreal.export.int8.target import TARGETS, TargetFormat, resolve_target
from minreal.export.settings import AUTO_TARGET, QUANT_MODES, QUANT_TARGETS, Int8Policy, int8_format
from minreal.facts import ARM64_TARGET, REDUCED_WEIGHT_QMAX, WEIGHT_QMAX

__all__ = ["QUANT_TYPES", "CALIBRATION_METHODS", "WEIGHT_BITS", "QuantConfig", "QuantResult", "target_format",
           "weight_qmax", "aligns"]

_WEIGHT_TYPES = ("int8", "uint8")
QUANT_TYPES = {"uint8": "QUInt8", "int8": "QInt8"}  # onnxruntime.quantization.QuantType members
CALIBRATION_METHODS = {  # onnxruntime.quantization.CalibrationMethod members
    "minmax": "MinMax",
    "entropy": "Entropy",
    "percentile": "Percentile",
}


@dataclass(frozen=True)
class QuantConfig(Int8Policy):
    """Options of :func:`quantize_int8`; what it may do besides writing the target's format
    (``allow_random_calibration``, ``drop_roundtrips``) is :class:`~minreal.export.settings.Int8Policy`'s, which a
    variant's settings share (:meth:`minreal.export.settings.VariantConfig.quant_config`).

    Attributes
    ----------
    mode : str
        ``"static"`` (calibrated QDQ) or ``"dynamic"`` (``quantize_dynamic``, no calibration).
    target : str
        one of :data:`QUANT_TARGETS`; picks the activation type, symmetry and weight range. ``"cpu"`` is
        resolved to this machine's format (``"cpu-vnni"``, ``"cpu-avx2"`` or ``"arm64"``) by :meth:`resolved`, once,
        at the entry of :func:`quantize_int8` and :func:`calibrate`; ``"arm64"`` is symmetric int8 activations for
        ONNX Runtime's ARM64 kernels, on any machine.
    activation_type : str | None
        ``"uint8"`` or ``"int8"``; ``None`` follows the target.
    activation_symmetric : bool | None
        symmetric activation ranges; ``None`` follows the target.
    weight_type : str
        ``"int8"`` (the default) or ``"uint8"`` (ONNX Runtime's U8U8, which does not saturate on x86
        without VNNI but runs a slower kernel there; per-channel uint8 weights are centred on zero point 128).
    reduce_range : bool | None
        7-bit weights ([-64, 64]); ``None`` follows the target.
    per_channel : bool
        per-output-channel weight scales.
    calibration_method : str
        ``"minmax"``, ``"entropy"`` or ``"percentile"``.
    batch_size : int
        calibration batch size; a min/max calibration of large inputs takes smaller batches
        (:func:`~minreal.export.int8.calibration.calibration_batch`), which changes no range.
    random_samples : int
        number of standard-normal samples calibrated on with ``allow_random_calibration`` and no data.
    seed : int
        seed of the random calibration data.
    align_channels : bool
        x86 CPU targets: widen every ungrouped convolution whose input channels are not a multiple
        of 4 (an RGB stem) with zero channels, which changes no output and puts it on ONNX Runtime's fast int8
        kernel (:func:`minreal.export.qdq_channels.align_conv_inputs`); other targets (``arm64``, ``tensorrt``), and
        quantising on an ARM
        machine, ignore it. A trained range of a widened layer's input holds for the ``Pad`` before it too. On by
        default: the CIFAR ResNet-32's INT8 file ran 0.982x / 0.960x as long at batch 1 / 32 with it, lower in
        18 and 20 of 20 processes, with bit-identical outputs (``benchmarks/int8_align.json``, AVX-512 VNNI).
    """

    mode: str = QUANT_MODES[0]
    target: str = AUTO_TARGET
    activation_type: str | None = None
    activation_symmetric: bool | None = None
    weight_type: str = "int8"
    reduce_range: bool | None = None
    per_channel: bool = True
    calibration_method: str = "minmax"
    batch_size: int = 16
    _: KW_ONLY  # allow_random_calibration was the next positional field: what follows it is keyword-only
    random_samples: int = 32
    seed: int = 0
    align_channels: bool = True

    def __post_init__(self) -> None:
        choices = {
            "mode": (self.mode, QUANT_MODES),
            "target": (self.target, QUANT_TARGETS),
            "weight_type": (self.weight_type, _WEIGHT_TYPES),
            "calibration_method": (self.calibration_method, tuple(CALIBRATION_METHODS)),
            "activation_type": (self.activation_type, (None, *QUANT_TYPES)),
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

    def target_defaults(self) -> TargetFormat:
        """The defaults of this config's explicit target (:data:`~minreal.export.int8.target.TARGETS`).

        Raises
        ------
        ValueError
            the target is ``cpu``, not yet resolved (:meth:`resolved`, at the entry of
            :func:`~minreal.export.int8.quantize_int8` and :func:`~minreal.export.int8.calibrate`).
        """
        if self.target not in TARGETS:
            raise ValueError(f"QuantConfig.target={self.target!r} is not resolved for this machine; "
                             "QuantConfig.resolved() gives the explicit target")
        return TARGETS[self.target]

    def activation(self) -> tuple[str, bool]:
        """Return (activation type, symmetric) after applying the (explicit) target's defaults."""
        default = self.target_defaults()
        symmetric = default.activation_symmetric if self.activation_symmetric is None else self.activation_symmetric
        return self.activation_type or default.activation_type, symmetric

    def weights_reduced(self) -> bool:
        """7-bit weights, after applying the (explicit) target's default."""
        default = self.target_defaults().reduce_range
        return default if self.reduce_range is None else self.reduce_range

    def resolved(self) -> QuantConfig:
        """This config with ``target="cpu"`` replaced by the explicit target for this machine
        (:func:`~minreal.export.int8.target.resolve_target`); an explicit target is kept. The library's entry points
        call it once; everything below them receives the explicit target."""
        return dataclasses.replace(self, target=resolve_target(self.target, self.mode))


def target_format(target: str) -> str:
    """The static INT8 format the explicit ``target`` writes, in words (:func:`minreal.export.settings.int8_format`):
    ``S8S8: symmetric int8 activations, 8-bit per-channel int8 weights`` for ``arm64``."""
    config = QuantConfig(target=target)
    act_type, symmetric = config.activation()
    return int8_format(act_type, symmetric, WEIGHT_BITS[weight_qmax(config)], config.weight_type,
                       config.per_channel)


@dataclass(frozen=True)
class QuantResult:
    """What :func:`quantize_int8` wrote.

    Attributes
    ----------
    fp32_path : str
        the float model (not modified).
    out_path : str
        the quantised model.
    mode : str
        ``"static"`` or ``"dynamic"``.
    target : str
        the explicit target written (``"cpu-vnni"``, ``"cpu-avx2"``, ``"arm64"`` or ``"tensorrt"``).
    requested_target : str
        the target asked for (``"cpu"`` is resolved for this machine into ``target``).
    quant_format : str
        ``"QDQ"`` (static) or ``"QOperator"`` (dynamic: integer ops written directly).
    activation_type : str
        ``"uint8"`` or ``"int8"`` (dynamic mode: ``"uint8"``, computed at run time).
    activation_symmetric : bool
        symmetric activation ranges.
    weight_type : str
        ``"int8"`` (symmetric) or ``"uint8"`` (U8U8; per-channel weights centred on zero point 128).
    weight_bits : int
        8, or 7 for reduced-range weights ([-64, 64]).
    saturates_here : bool
        this file's format can saturate in ONNX Runtime's CPU kernels on the machine that
        quantised it (8-bit int8 weights on x86 without VNNI): its accuracy measured here is not what a VNNI
        CPU gets, and a saturation-free target (``cpu-avx2``) is the remedy. For ``arm64`` and ``tensorrt``
        files it only says the accuracy measured here understates their device's.
    per_channel : bool
        per-channel weight scales.
    quantized_bias : bool
        biases stored as int32 behind a DequantizeLinear (``False``: float biases).
    calibration_samples : int
        samples used for calibration (0 in dynamic mode).
    calibration_digest : str
        digest of those samples as calibrated on (:meth:`ArrayCalibrationReader.digest
        <minreal.export.int8.calibration.ArrayCalibrationReader.digest>`; ``""`` in dynamic mode): which rows, not
        only how many.
    random_calibration : bool
        calibrated on random data (``allow_random_calibration``).
    preprocess_note : str | None
        ``None`` if ``quant_pre_process`` ran fully, else what was skipped and why.
    node_counts : dict[str, int]
        op type → count in the written graph.
    optimized_ops : dict[str, int]
        op type → count in the ORT-optimised CPU graph (``domain:op`` outside ai.onnx); for
        ``arm64`` the graph ONNX Runtime builds for ARM (:data:`minreal.runtime_bench.cpu.ARM_GRAPH_CONFIG`).
    integer_kernels : int
        Conv/MatMul/Gemm nodes running as integer kernels in that graph.
    float_kernels : int
        Conv/MatMul/Gemm nodes still in floating point in that graph, fused attention kernels included.
    size_fp32_bytes : int
        size of the float file.
    size_int8_bytes : int
        size of the quantised file.
    excluded_nodes : list[str]
        nodes left in float: those whose weights are computed in the graph (e.g. an SSM's
        generated convolution kernel; quantising them only adds Q/DQ work), then the caller's ``exclude``.
    range_source : str
        ``"trained"`` when some activation scales came from quantisation-aware recovery,
        else ``"calibrated"``.
    trained_ranges : int
        layer-input tensors whose written scale and zero point are the trained ones.
    untrained_modules : list[str]
        modules whose trained range could not be placed in the graph (calibrated instead).
    float_roundtrips : dict[str, int]
        op type → nodes of the ORT-optimised CPU graph that run in float between a
        DequantizeLinear and a QuantizeLinear (:func:`minreal.runtime_bench.model_info.float_roundtrips`): each
        costs a dequantise and a re-quantise with nothing gained, the usual reason an INT8 file is slower than fp32.
    nonfinite_nodes : list[str]
        nodes left in float because calibration gave a tensor they read or write a scale that is
        not finite (e.g. a 0/-inf attention mask and the masked scores): quantised, such a tensor flattens
        everything downstream. Also listed in ``excluded_nodes``.
    roundtrip_nodes : list[str]
        nodes left in float by ``QuantConfig.drop_roundtrips`` (a first quantisation ran them in
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
    calibration_digest: str = ""
    requested_target: str = ""
    weight_bits: int = 8
    saturates_here: bool = False


WEIGHT_BITS = {WEIGHT_QMAX: 8, REDUCED_WEIGHT_QMAX: 7}


def weight_qmax(config: QuantConfig) -> int:
    """The largest weight magnitude the file's grid has: 127, or 64 with ``reduce_range`` (the grid QAT trains on,
    ``minreal.compress.core.qat``)."""
    return REDUCED_WEIGHT_QMAX if config.weights_reduced() else WEIGHT_QMAX


def aligns(config: QuantConfig) -> bool:
    """Whether ``config`` (resolved) widens convolution inputs: static mode, an x86 CPU target (``cpu-vnni``,
    ``cpu-avx2``; not ``arm64``) on an x86 machine (the rule is MLAS's x86 kernel's; ARM's differs), not turned
    off."""
    return (config.align_channels and config.mode == "static" and config.target in cpu_facts.CPU_TARGETS
            and not cpu_facts.cpu_isa().is_arm)
