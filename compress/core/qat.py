"""Fake quantisation in ONNX Runtime's INT8 formats, for quantisation-aware recovery.

Jacob et al. (2018), "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only
Inference" (CVPR), §3: the model trains in float while every ``nn.Conv1d/2d/3d`` and ``nn.Linear`` sees its
weights and its input activation rounded to the integer grid they will have after quantisation, ``r = S(q − Z)``
(eq. 1); gradients pass the rounding unchanged inside the range and are zero outside it (the straight-through
estimator, Bengio et al. 2013, "Estimating or Propagating Gradients Through Stochastic Neurons").

The grids are exactly those ONNX Runtime's static QDQ quantisation writes (``minreal.export.int8``): weights per
output channel, symmetric int8, ``S = max|w|/127`` (``max|w|/64`` for the 7-bit weights of ``cpu-avx2``: ORT's
``reduce_range``; computed in float64, stored in float32), ``Z = 0``;
activations per tensor in the provider's format (:data:`INT8_FORMATS`), scale and zero point from the range
``[min, max]`` by ORT's ``compute_scale_zp`` (:func:`quant_params`). An INT8 export can therefore reuse the
trained ranges as they are instead of calibrating afresh.

Only the weights and the input of every Conv/Linear are simulated: the other tensors ONNX Runtime's QDQ
quantises (outputs feeding a residual add, the add itself, the final output) stay float in training and are
calibrated at export.

A BatchNorm after a Conv is folded into the Conv's weights at export (``W' = W·diag(γ/σ)``, per output channel).
Per-channel symmetric quantisation commutes with a per-channel scale (the channel's scale is scaled by the same
factor, so ``round(W'/S') = sign(γ)·round(W/S)``), so the grid trained here is the exported one up to float
rounding; the folded bias is quantised to int32 at a scale far finer than the weights'.

Ranges start as exact minima/maxima over calibration batches run through the float model (what ORT's MinMax
calibrator measures), then follow an exponential moving average of each batch's minimum and maximum
(``r ← (1 − m)·r + m·r_batch``, ``m`` = :data:`EMA_MOMENTUM`, Jacob et al. §3.1) on forward passes in training
mode with autograd on, i.e. optimiser steps; in eval mode or under ``torch.no_grad`` they are frozen.

References
----------
.. [1] Jacob et al. (2018), "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only
       Inference" (CVPR), §3, eq. 1–2.
.. [2] Bengio et al. 2013, "Estimating or Propagating Gradients Through Stochastic Neurons": the straight-through
       estimator.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from minreal.facts import ARM64_TARGET, CPU_AVX2_TARGET, CPU_VNNI_TARGET, REDUCED_WEIGHT_QMAX, WEIGHT_QMAX

from .costs import computes_as
from .errors import CompressionError
from .evaluate import eval_mode
from .inputs import call

__all__ = ["INT8_FORMATS", "EMA_MOMENTUM", "Int8Format", "ActivationRange", "FakeQuant", "fake_quant",
           "quant_params", "weight_scales", "fake_quantize"]

EMA_MOMENTUM = 0.01
"""Weight of each training batch's minimum/maximum in the ranges' moving average (PyTorch's
``MovingAverageMinMaxObserver`` default)."""

_TYPE_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
_RANGE_BUFFERS = ("qat_input_min", "qat_input_max")


@dataclass(frozen=True)
class Int8Format:
    """An activation format: integer type and whether the range is symmetric about zero; and the largest weight
    magnitude on the symmetric weight grid (127, or 64 for ORT's 7-bit ``reduce_range`` weights)."""

    activation_dtype: str
    symmetric: bool
    weight_qmax: int = WEIGHT_QMAX

    @property
    def type_range(self) -> tuple[int, int]:
        """Values the integer type holds (what QuantizeLinear saturates to)."""
        return _TYPE_RANGES[self.activation_dtype]

    @property
    def grid(self) -> tuple[int, int]:
        """(qmin, qmax) the range is mapped onto: ORT drops −128 for symmetric int8 (``get_qmin_qmax_for_qType``)."""
        lo, hi = self.type_range
        return (-hi, hi) if self.symmetric and lo < 0 else (lo, hi)


INT8_FORMATS: Mapping[str, Int8Format] = types.MappingProxyType({
    CPU_VNNI_TARGET: Int8Format("uint8", symmetric=False),
    CPU_AVX2_TARGET: Int8Format("uint8", symmetric=False, weight_qmax=REDUCED_WEIGHT_QMAX),
    ARM64_TARGET: Int8Format("int8", symmetric=True),
    "tensorrt": Int8Format("int8", symmetric=True),
})
"""INT8 format per explicit target: uint8 asymmetric activations for ONNX Runtime's x86 CPU kernels (8-bit weights
for CPUs whose int8 kernels cannot saturate, 7-bit ones for x86 without VNNI), symmetric int8 for its ARM64 kernels
and for TensorRT's explicit quantisation (the same table as ``minreal.export.int8.target``'s targets; its ``cpu`` is
resolved to one of the two x86 formats before it reaches here)."""


@dataclass(frozen=True)
class ActivationRange:
    """The range of a layer's input activation and the quantisation parameters it gives (``r = scale·(q − zp)``).

    ``min``/``max`` are float32 values; ``scale`` is the float32 scale and ``zero_point`` the integer zero point
    ONNX Runtime computes from them for ``dtype`` (``"uint8"``/``"int8"``) and ``symmetric``; ``weight_qmax`` is the
    weight grid the layer trained with (127, or 64 for 7-bit weights), which its INT8 export must use too.
    """

    scale: float
    zero_point: int
    min: float
    max: float
    dtype: str
    symmetric: bool
    weight_qmax: int = WEIGHT_QMAX


def quant_params(rmin: float, rmax: float, fmt: Int8Format) -> tuple[float, int]:
    """(scale, zero point) of the range ``[rmin, rmax]`` as ONNX Runtime's ``compute_scale_zp`` computes them.

    Jacob et al. (2018), eq. 1–2 with zero kept exact: the range is widened to hold 0 (in float32), made
    symmetric when ``fmt`` is, ``S = (rmax − rmin)/(qmax − qmin)`` in float64, ``Z = round(qmin − rmin/S)``
    (half to even; the grid's middle when symmetric), ``S`` stored in float32; a range narrower than float32's
    smallest normal gives ``(1.0, 0)``.
    """
    lo = np.minimum(np.float32(rmin), np.float32(0.0))
    hi = np.maximum(np.float32(rmax), np.float32(0.0))
    if fmt.symmetric:
        hi = np.maximum(np.abs(lo), np.abs(hi))
        lo = -hi
    qmin, qmax = fmt.grid
    scale = (np.float64(hi) - np.float64(lo)) / np.float64(qmax - qmin)
    if scale < np.finfo(np.float32).tiny:
        return 1.0, 0
    zero = np.round((qmin + qmax) / 2.0) if fmt.symmetric else np.round(qmin - np.float64(lo) / scale)
    return float(np.float32(scale)), int(zero)


def weight_scales(weight: torch.Tensor, qmax: int = WEIGHT_QMAX) -> torch.Tensor:
    """Per-output-channel (axis 0) symmetric int8 scales, ``max|w_c|/qmax`` in float64 stored in ``weight``'s dtype
    (ORT's ``quantize_data``: ``(2·max|w_c|)/(2·qmax)``, the same correctly rounded quotient); 1 for an all-zero
    channel. ``qmax`` is 127, or 64 for reduced-range (7-bit) weights."""
    absmax = weight.detach().abs().flatten(1).amax(1).double()
    scale = 2 * absmax / (2 * qmax)
    return torch.where(scale < torch.finfo(torch.float32).tiny, torch.ones_like(scale), scale).to(weight.dtype)


class _FakeQuantize(torch.autograd.Function):
    """``(clamp(round(x/s) + z, lo, hi) − z)·s`` forward; straight-through inside the range, zero outside."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: torch.Tensor, zero: int, lo: int, hi: int) -> torch.Tensor:
        q = torch.round(x / scale) + zero
        ctx.save_for_backward((q >= lo) & (q <= hi))
        return (q.clamp(lo, hi) - zero) * scale

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None, None, None


def fake_quantize(x: torch.Tensor, scale: torch.Tensor | float, zero_point: int, type_range: tuple[int, int]
                  ) -> torch.Tensor:
    """Quantise and dequantise ``x`` as ONNX Runtime's QuantizeLinear→DequantizeLinear do (``x/scale`` rounded half
    to even, saturated to ``type_range``), with the clipped straight-through gradient (Jacob et al. 2018, §3.1)."""
    scale = torch.as_tensor(scale, dtype=x.dtype, device=x.device)
    return _FakeQuantize.apply(x, scale, zero_point, *type_range)


def _quantized_weight(module: nn.Module, fmt: Int8Format) -> torch.Tensor:
    w = module.weight
    scale = weight_scales(w, fmt.weight_qmax).reshape(-1, *([1] * (w.dim() - 1)))
    return fake_quantize(w, scale, 0, (-fmt.weight_qmax, fmt.weight_qmax))


_LAYERS: Mapping[type, Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]] = types.MappingProxyType({
    nn.Linear: lambda m, x, w: F.linear(x, w, m.bias),
    nn.Conv1d: lambda m, x, w: m._conv_forward(x, w, m.bias),
    nn.Conv2d: lambda m, x, w: m._conv_forward(x, w, m.bias),
    nn.Conv3d: lambda m, x, w: m._conv_forward(x, w, m.bias),
})
"""Layers fake-quantised (and subclasses computing as one, :func:`~minreal.compress.core.costs.computes_as`; not one
with a forward of its own, which may compute something else) and how each applies a weight."""


class _Mode:
    """Shared switch of a :class:`FakeQuant`: ``observing`` records exact min/max and leaves the model float."""

    def __init__(self) -> None:
        self.observing = False


def _observe(module: nn.Module, x: torch.Tensor, exact: bool, momentum: float) -> None:
    """Update the module's range buffers with the batch's minimum and maximum (exact union, or moving average)."""
    lo_buf, hi_buf = (getattr(module, n) for n in _RANGE_BUFFERS)
    lo, hi = x.detach().amin().float(), x.detach().amax().float()
    if exact or not bool(torch.isfinite(lo_buf)):
        lo_buf.copy_(torch.minimum(lo_buf, lo))
        hi_buf.copy_(torch.maximum(hi_buf, hi))
    else:
        lo_buf.add_(momentum * (lo - lo_buf))
        hi_buf.add_(momentum * (hi - hi_buf))


def _range(module: nn.Module, fmt: Int8Format) -> ActivationRange | None:
    lo, hi = (float(getattr(module, n)) for n in _RANGE_BUFFERS)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    scale, zero = quant_params(lo, hi, fmt)
    return ActivationRange(scale, zero, lo, hi, fmt.activation_dtype, fmt.symmetric, fmt.weight_qmax)


def _qat_forward(fmt: Int8Format, mode: _Mode, momentum: float) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """The temporary ``forward`` of a fake-quantised layer (bound to it; its state lives in its buffers)."""

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        apply = _LAYERS[computes_as(self, _LAYERS)]
        if mode.observing:
            _observe(self, x, exact=True, momentum=momentum)
            return apply(self, x, self.weight)
        uninitialised = not bool(torch.isfinite(getattr(self, _RANGE_BUFFERS[0])))
        if uninitialised or (self.training and torch.is_grad_enabled()):
            _observe(self, x, exact=False, momentum=momentum)
        qr = _range(self, fmt)
        x = fake_quantize(x, qr.scale, qr.zero_point, fmt.type_range)
        return apply(self, x, _quantized_weight(self, fmt))

    return forward


class FakeQuant:
    """What :func:`fake_quant` yields: the fake-quantised layers by qualified name and their input ranges."""

    def __init__(self, model: nn.Module, layers: dict[str, nn.Module], fmt: Int8Format, mode: _Mode) -> None:
        self.model, self.layers, self.format, self._mode = model, layers, fmt, mode

    def ranges(self) -> dict[str, ActivationRange]:
        """Current input range of every layer that has seen data, by qualified module name."""
        found = {name: _range(m, self.format) for name, m in self.layers.items()}
        return {name: r for name, r in found.items() if r is not None}

    def range_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The layers' range buffers (minima, maxima; 0-d float32), in the order of :attr:`layers`, to be updated in
        place (e.g. agreed across the ranks of a data-parallel recovery)."""
        lows, highs = ([getattr(m, name) for m in self.layers.values()] for name in _RANGE_BUFFERS)
        return lows, highs

    @torch.no_grad()
    def calibrate(self, batches: Iterable[torch.Tensor]) -> None:
        """Reset the ranges to the exact min/max of each layer's input over ``batches`` of the float model (eval
        mode, nothing fake-quantised: what ORT's MinMax calibrator measures)."""
        for m in self.layers.values():
            for name, value in zip(_RANGE_BUFFERS, (float("inf"), float("-inf"))):
                getattr(m, name).fill_(value)
        self._mode.observing = True
        try:
            with eval_mode(self.model):
                for xb in batches:
                    call(self.model, xb)
        finally:
            self._mode.observing = False


def _layers(model: nn.Module) -> dict[str, nn.Module]:
    """The layers :data:`_LAYERS` handles, by qualified name; an error if the model has none or is already wrapped."""
    layers = {name: m for name, m in model.named_modules() if computes_as(m, _LAYERS) is not None}
    if not layers:
        raise CompressionError(f"{type(model).__name__} has no nn.Conv1d/2d/3d or nn.Linear layer to fake-quantise "
                               "for `RecoveryConfig.int8`", fields=("int8",))
    busy = [name for name, m in layers.items() if hasattr(m, _RANGE_BUFFERS[0]) or "forward" in m.__dict__]
    if busy:
        raise CompressionError(f"layer {busy[0]!r} already has an instance-level forward (nested fake_quant?); "
                               "it cannot be fake-quantised")
    return layers


def _seed_ranges(layers: dict[str, nn.Module], ranges: Mapping[str, ActivationRange | Mapping[str, Any]]) -> None:
    for name, r in ranges.items():
        if name in layers:
            lo, hi = (r.min, r.max) if isinstance(r, ActivationRange) else (r["min"], r["max"])
            getattr(layers[name], _RANGE_BUFFERS[0]).fill_(lo)
            getattr(layers[name], _RANGE_BUFFERS[1]).fill_(hi)


def _wrap(layers: dict[str, nn.Module], fmt: Int8Format, mode: _Mode, momentum: float) -> None:
    forward = _qat_forward(fmt, mode, momentum)
    for m in layers.values():
        ref = m.weight
        m.register_buffer(_RANGE_BUFFERS[0], torch.full((), float("inf"), device=ref.device))
        m.register_buffer(_RANGE_BUFFERS[1], torch.full((), float("-inf"), device=ref.device))
        m.forward = types.MethodType(forward, m)


def _unwrap(layers: dict[str, nn.Module]) -> None:
    for m in layers.values():
        m.__dict__.pop("forward", None)
        for name in _RANGE_BUFFERS:
            m._buffers.pop(name, None)


@contextlib.contextmanager
def fake_quant(model: nn.Module, target: str = CPU_VNNI_TARGET, calibration: Iterable[torch.Tensor] | None = None,
               ranges: Mapping[str, ActivationRange | Mapping[str, Any]] | None = None,
               momentum: float = EMA_MOMENTUM) -> Iterator[FakeQuant]:
    """Fake-quantise ``model``'s Conv/Linear layers in ``target``'s INT8 format for the block (Jacob et al. 2018).

    Parameters
    ----------
    model : nn.Module
        changed in place while the block runs; afterwards exactly as before (same module types,
        state-dict keys and values as left by the block, no hooks or attributes left).
    target : str
        a key of :data:`INT8_FORMATS`.
    calibration : Iterable[torch.Tensor] | None
        input batches whose exact min/max start the ranges (float model); ``None``: ``ranges``,
        else each layer's first batch.
    ranges : Mapping[str, ActivationRange | Mapping[str, Any]] | None
        starting ranges by module name (e.g. a recovery's ``activation_ranges``), used without
        ``calibration``.
    momentum : float
        weight of a training batch in the ranges' moving average.

    The ranges are buffers of the layers while the block runs, so a state dict saved and loaded inside the
    block (e.g. best weights kept by early stopping) carries the ranges that went with those weights. Do not
    copy the model inside the block: a copy keeps the temporary ``forward``.

    Yields
    ------
    FakeQuant
        A :class:`FakeQuant`; its ``ranges()`` are keyed by the qualified name of each fake-quantised layer.
    """
    if target not in INT8_FORMATS:
        raise CompressionError(f"no INT8 format for target {target!r}; choose one of {sorted(INT8_FORMATS)}")
    layers, mode = _layers(model), _Mode()
    try:
        _wrap(layers, INT8_FORMATS[target], mode, momentum)
        handle = FakeQuant(model, layers, INT8_FORMATS[target], mode)
        if calibration is not None:
            handle.calibrate(calibration)
        elif ranges:
            _seed_ranges(layers, ranges)
        yield handle
    finally:
        _unwrap(layers)
