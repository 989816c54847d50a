"""Export settings that the command line shows before it imports anything heavy: the INT8 targets and modes
and the defaults of a variant (:class:`VariantConfig`). No torch, onnx or onnxruntime here."""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, fields
from typing import TYPE_CHECKING

from minreal.facts import ARM64_TARGET, CPU_AVX2_TARGET, CPU_VNNI_TARGET, FieldError

MIN_OPSET = 17
"""Lowest ONNX opset accepted (LayerNormalization is standard from 17)."""

if TYPE_CHECKING:
    from minreal.export.int8 import QuantConfig
    from minreal.export.mobile import ShapeSpec

__all__ = ["AUTO_TARGET", "QUANT_TARGETS", "QUANT_MODES", "DROP_ROUNDTRIPS", "CALIB_SAMPLES", "FEW_CALIBRATION_SAMPLES",
           "FORMATS", "MIN_OPSET",
           "ORT_OPTIMIZATIONS", "ORT_STYLES", "ORT_PLATFORMS", "OrtConfig", "Int8Policy", "VariantConfig",
           "int8_format"]

AUTO_TARGET = "cpu"
"""``--quant-target cpu``: the format this machine needs, ``cpu-vnni``/``cpu-avx2`` on x86 and ``arm64`` on an ARM64
CPU (:func:`minreal.export.int8.resolve_target`)."""

QUANT_TARGETS: tuple[str, ...] = (AUTO_TARGET, CPU_VNNI_TARGET, CPU_AVX2_TARGET, ARM64_TARGET, "tensorrt")
"""INT8 formats here (``--quant-target``): ``cpu`` (the right one for this machine, :data:`AUTO_TARGET`),
``cpu-vnni``, ``cpu-avx2``, ``arm64`` (symmetric int8 activations and per-channel weights, for ONNX Runtime's ARM64
kernels) and ``tensorrt``; each picks an activation type, symmetry and weight range."""

QUANT_MODES: tuple[str, ...] = ("static", "dynamic")
"""``--quant-mode``: calibrated QDQ, or weights only with activations quantised at run time."""

DROP_ROUNDTRIPS = True
"""Default of :attr:`Int8Policy.drop_roundtrips` (``--int8-keep-roundtrips`` turns it off)."""

CALIB_SAMPLES = 256
"""Samples INT8 calibration uses (all of the calibration data up to this many, else a seeded random subset)."""

FEW_CALIBRATION_SAMPLES = 32
"""Below this many calibration samples export and run say the INT8 ranges rest on too few (one sample's extremes
are its own, not the data's)."""


FORMATS: tuple[str, ...] = ("onnx", "ort")
"""File formats ``--format`` writes: the ``.onnx`` file (always written: the ``.ort`` file is converted from it) and
ONNX Runtime's ORT format (``.ort``, loadable by a minimal build) with its required-operators configuration."""

ORT_OPTIMIZATIONS: tuple[str, ...] = ("disable", "basic", "extended", "layout", "all")
"""Graph optimisation levels of ONNX Runtime's ORT-format converter (``--ort-optimization``), lowest first."""

ORT_STYLES: tuple[str, ...] = ("fixed", "runtime")
"""The converter's optimisation styles (``--ort-style``): ``fixed`` applies the optimisations before saving;
``runtime`` applies basic ones and saves the others to be replayed at run time (for NNAPI/CoreML)."""

ORT_PLATFORMS: tuple[str, ...] = ("arm", "amd64", "any")
"""The converter's target platforms (``--ort-platform``): ``arm`` allows int8 QDQ fusions (``QDQIsInt8Allowed``),
``amd64`` x86's NCHWc convolution layouts, ``any`` neither (a file that runs anywhere, with neither). By default the
platform of the INT8 target (:func:`minreal.export.ort_format.ort_for_target`)."""


@dataclass(frozen=True)
class OrtConfig:
    """How an ONNX file becomes an ORT-format model (:func:`minreal.export.ort_format.convert_to_ort`).

    Attributes
    ----------
    optimization : str
        graph optimisation level baked into the file, one of :data:`ORT_OPTIMIZATIONS`.
    style : str
        ``fixed`` or ``runtime`` (:data:`ORT_STYLES`).
    target_platform : str | None
        ``arm``, ``amd64``, ``any`` (:data:`ORT_PLATFORMS`), or ``None``: the platform of the
        files' INT8 target where a run, export or tune decides it (``--quant-target``;
        :func:`minreal.export.ort_format.ort_for_target`); none for a bare
        :func:`~minreal.export.ort_format.convert_to_ort`.
    type_reduction : bool
        record the types each operator needs in the configuration, so a minimal build can also
        drop kernels' unused types (``--enable_type_reduction``).
    """

    optimization: str = "all"
    style: str = "fixed"
    target_platform: str | None = None
    type_reduction: bool = False

    def __post_init__(self) -> None:
        for name, value, allowed in (("optimization", self.optimization, ORT_OPTIMIZATIONS),
                                     ("style", self.style, ORT_STYLES),
                                     ("target_platform", self.target_platform, (None, *ORT_PLATFORMS))):
            if value not in allowed:
                raise ValueError(f"ORT {name} {value!r} is not one of {', '.join(map(str, allowed))}")


def int8_format(activation_type: str, activation_symmetric: bool, weight_bits: int, weight_type: str = "int8",
                per_channel: bool = True) -> str:
    """An INT8 format in words for a report, with ONNX Runtime's shorthand (activation then weight signedness):
    ``S8S8: symmetric int8 activations, 8-bit per-channel int8 weights``."""
    code = "".join("S8" if t == "int8" else "U8" for t in (activation_type, weight_type))
    symmetry = "symmetric" if activation_symmetric else "asymmetric"
    channels = "per-channel " if per_channel else ""
    return f"{code}: {symmetry} {activation_type} activations, {weight_bits}-bit {channels}{weight_type} weights"


@dataclass(frozen=True, kw_only=True)
class Int8Policy:
    """What an INT8 quantisation may do besides writing its target's format: the fields that a variant's settings
    (:class:`VariantConfig`) and the quantiser's (:class:`minreal.export.int8.QuantConfig`) share, declared here once;
    both subclass it. Its fields are keyword-only and so are those a subclass declares after the place these had
    among its own (a positional argument there is a ``TypeError``, not a value shifted onto the next field); a
    subclass's :func:`dataclasses.asdict` (``report.json``'s ``config.variant``) lists these two first.

    The target and the mode are shared too but spelled apart, ``quant_target``/``quant_mode`` beside the
    variant's opset and tolerances and ``target``/``mode`` in the quantiser, where nothing else is one:
    :meth:`VariantConfig.quant_config` maps them, with every field of this class.

    Attributes
    ----------
    allow_random_calibration : bool
        calibrate on random data when no calibration data is given (not advised: the ranges are those of noise).
    drop_roundtrips : bool
        x86 CPU targets (``cpu``), static mode: leave in float the nodes that ONNX Runtime's optimised CPU graph runs
        in float between a DequantizeLinear and a QuantizeLinear (no integer kernel: Pad, ConvTranspose, a Conv with
        computed weights, ...) and quantise again, keeping an exclusion only where it removes the
        dequantise/re-quantise pair and the result only if ORT's graph has fewer Q/DQ nodes and no fewer integer
        kernels (:func:`minreal.export.int8.cleanup.drop_roundtrips`; ``--int8-keep-roundtrips`` turns it off).
        ``arm64`` ignores it: it would change the file on the strength of a graph optimised here, not on ARM. ORT's
        x86 graph of an arm64 file is built after ``QDQS8ToU8Transformer`` (x86 only) and runs a ResNet's residual
        convolutions and additions in float where ARM's fuses them into int8 kernels; the ARM graph built here (the
        one the result counts) still has x86-only rewrites (NCHWc layouts).
    """

    allow_random_calibration: bool = False
    drop_roundtrips: bool = DROP_ROUNDTRIPS


@dataclass(frozen=True)
class VariantConfig(Int8Policy):
    """Export, parity and INT8 settings of a variant; what an INT8 quantisation may do besides writing its target's
    format (``allow_random_calibration``, ``drop_roundtrips``) is :class:`Int8Policy`'s.

    Attributes
    ----------
    opset : int
        ONNX opset (>= 17).
    rtol, atol : float
        parity (and simplification) tolerances, ``|onnx - torch| <= atol + rtol * |torch|``.
    atol_scale : float
        torch-against-ONNX parity adds this part of each output's largest magnitude to ``atol``
        (``--atol-scale``; :data:`minreal.export.verify.DEFAULT_ATOL_SCALE`, 0 for ``numpy.allclose``'s rule).
    quant_target : str
        provider whose INT8 format is written (``--quant-target``).
    quant_mode : str
        ``"static"`` (calibrated QDQ) or ``"dynamic"`` (``--quant-mode``).
    calib_samples : int
        samples of the calibration data used for static INT8.
    fixed_shapes : ShapeSpec | None
        symbolic dimensions to fix in the written file once parity passed (``--fixed-shapes``; for
        NNAPI/CoreML), or ``None`` to keep them dynamic.
    tensorrt_validation : bool
        validate each file with TensorRT itself (parse, engine builds, parity with ONNX
        Runtime; :func:`minreal.export.tensorrt_check.tensorrt_check`) when it is importable; the static check
        otherwise and when this is off. The pipeline turns it on when ``--providers`` includes tensorrt.
    tensorrt_batch : tuple[int, int, int]
        (min, opt, max) batch of the optimisation profile of that validation.
    """

    opset: int = 18
    rtol: float = 1e-3
    atol: float = 1e-4
    quant_target: str = AUTO_TARGET
    quant_mode: str = QUANT_MODES[0]
    calib_samples: int = CALIB_SAMPLES
    _: KW_ONLY  # allow_random_calibration was the next positional field: what follows it is keyword-only
    fixed_shapes: ShapeSpec | None = None
    tensorrt_validation: bool = False
    tensorrt_batch: tuple[int, int, int] = (1, 32, 32)
    atol_scale: float = 1e-4

    def __post_init__(self) -> None:
        for name, zero in (("rtol", "no relative part"), ("atol", "no absolute part"),
                           ("atol_scale", "numpy.allclose's rule alone")):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):  # nan fails every element, inf passes every one
                raise FieldError(f"`VariantConfig.{name}`={value!r}: --{name.replace('_', '-')} must be a finite "
                                 f"number >= 0 (0: {zero}), got {value!r}", fields=(name,))
        if self.opset < MIN_OPSET:
            raise FieldError(f"`VariantConfig.opset`={self.opset!r}: --opset must be {MIN_OPSET} or more "
                             f"(LayerNormalization is standard from 17), got {self.opset}", fields=("opset",))
        if self.quant_mode == "dynamic" and self.quant_target in ("tensorrt", ARM64_TARGET):
            # told before any export: dynamic INT8 has uint8 activations quantised at run time, neither format's
            raise FieldError(f"`VariantConfig.quant_mode`='dynamic': --quant-mode dynamic cannot write the "
                             f"{self.quant_target} INT8 format (its activations are quantised to uint8 at run time); "
                             "use `quant_mode`='static' (--quant-mode static)", fields=("quant_mode",))

    def quant_config(self) -> QuantConfig:
        """The :class:`QuantConfig` these settings ask for: their target, mode and :class:`Int8Policy`."""
        from minreal.export.int8 import QuantConfig  # onnx and onnxruntime: only when a variant is quantised

        policy = {f.name: getattr(self, f.name) for f in fields(Int8Policy)}
        return QuantConfig(target=self.quant_target, mode=self.quant_mode, **policy)
