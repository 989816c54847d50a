"""Application settings the command line shows before it imports anything heavy: the held-out share and a run's
:class:`PipelineConfig` (no torch, onnx or onnxruntime at import)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import minreal.runtime_bench as rb
from minreal.export.settings import OrtConfig, VariantConfig

if TYPE_CHECKING:
    from minreal.compress.core.recover_options import RecoveryConfig
    from minreal.export.fp16 import Fp16Config
    from minreal.runtime_bench.provider_options import ProviderSettings

__all__ = ["HOLDOUT_FRACTION", "FP16_PROVIDERS", "PipelineConfig"]

#: Share of the data held out for measurement unless the user says otherwise (--data-holdout, digits splits).
HOLDOUT_FRACTION = 0.25

FP16_PROVIDERS: tuple[str, ...] = ("cuda", "tensorrt")
"""Providers whose request gives every fp32 variant an FP16 copy in the run (``--fp16`` forces them elsewhere)."""

_BENCH = rb.BenchConfig()  # the timing defaults below are minreal bench's


@dataclass(frozen=True)
class PipelineConfig:
    """Export, quantisation and benchmark settings shared by every case of a run (``report.json``'s config).

    Export/INT8 settings are one :class:`minreal.export.settings.VariantConfig` (``variant``; :meth:`variant_config`
    adds what the run's providers and batch sizes decide); timing defaults are
    :class:`minreal.runtime_bench.BenchConfig`'s, but for the batch sizes (a run also times a large batch).
    """

    batch_sizes: tuple[int, ...] = (1, 32)
    providers: tuple[str, ...] = _BENCH.providers
    int8: bool = True
    variant: VariantConfig = field(default_factory=VariantConfig)
    """Opset, parity tolerances, INT8 target, mode and calibration samples, and the symbolic dimensions fixed in
    every exported file (``--fixed-shapes``, for NNAPI/CoreML; a fixed batch must then be the only batch size
    timed)."""
    warmup: int = _BENCH.warmup
    min_runs: int = _BENCH.min_runs
    min_seconds: float = _BENCH.min_seconds
    repeats: int = _BENCH.repeats
    skip_unavailable_providers: bool = False
    recovery: RecoveryConfig | None = None
    """Distillation from the original after every variant's method (None or a disabled config: none)."""
    allow_data_mismatch: bool = False
    """Go on (with a warning) when the original scores near chance on the labelled data
    (:mod:`minreal.app.mismatch`); by default that stops the run before any work."""
    fp16: bool = False
    """FP16 copies of the original and every variant even when no provider of :data:`FP16_PROVIDERS` is asked for
    (``--fp16``); with one, they are made anyway."""

    axis_values: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Lengths of dynamic axes (besides the batch) latency is measured at, by dimension name (``--axis-values
    seq=32,128``); an axis not named here is timed at its length in the data and at half of it."""

    provider_settings: dict[str, ProviderSettings] = field(default_factory=dict)
    """Per provider: device, TensorRT precision flags, caches and profiles (``--provider-option``,
    ``--provider-config``; :mod:`minreal.runtime_bench.provider_options`)."""
    io_binding: bool = False
    """On GPU providers, also time with inputs and outputs bound on the device (``--io-binding``)."""
    ort: OrtConfig | None = None
    """ORT-format copies (``NAME.ort``) of every fp32 and INT8 file, with their operator configurations and the
    case's merged one (``--format onnx,ort``); ``None``: ONNX only."""

    def bench_config(self, axis_values: Mapping[str, tuple[int, ...]] | None = None) -> rb.BenchConfig:
        """Timing settings for :func:`minreal.runtime_bench.run_benchmark` (``axis_values``: the shapes to time)."""
        return rb.BenchConfig(providers=self.providers, batch_sizes=self.batch_sizes, warmup=self.warmup,
                              min_runs=self.min_runs, min_seconds=self.min_seconds, repeats=self.repeats,
                              axis_values=dict(axis_values or {}), provider_settings=dict(self.provider_settings),
                              io_binding=self.io_binding)

    def wants_fp16(self) -> bool:
        """Whether the run makes FP16 copies: ``fp16`` set, or a GPU provider requested."""
        return self.fp16 or any(p in FP16_PROVIDERS for p in self.providers)

    def fp16_config(self) -> Fp16Config:
        """FP16 options: fp32 I/O (the benchmark feeds every model the same arrays), parity on CUDA when a GPU
        provider is asked for and this onnxruntime has CUDA (real float16 arithmetic), else on CPU."""
        from minreal.export.fp16 import Fp16Config  # onnx: only when a run makes FP16 copies

        gpu = any(p in FP16_PROVIDERS for p in self.providers)
        return Fp16Config(provider="cuda" if gpu and "cuda" in rb.available_providers() else "cpu")

    def variant_config(self) -> VariantConfig:
        """Export, parity and INT8 settings for :func:`minreal.export.variant.export_variant`."""
        return replace(self.variant, tensorrt_validation="tensorrt" in self.providers,
                       tensorrt_batch=(min(self.batch_sizes), max(self.batch_sizes), max(self.batch_sizes)))
