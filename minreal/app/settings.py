"""Application settings the command line shows before it imports anything heavy: the held-out share and a run's
:class:`PipelineConfig` (no torch, onnx or onnxruntime at import)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import minreal.runtime_bench as rb
from minreal.export.settings import OrtConfig, VariantConfig

if TYPE_CHECKING:
    from minreal.compress.core.recover_options import RecoveryConfig
    from minreal.export.fp16 import Fp16Config

__all__ = ["HOLDOUT_FRACTION", "FP16_PROVIDERS", "RUN_BENCH", "PipelineConfig"]

#: Share of the data held out for measurement unless the user says otherwise (--data-holdout, digits splits).
HOLDOUT_FRACTION = 0.25

FP16_PROVIDERS: tuple[str, ...] = ("cuda", "tensorrt")
"""Providers whose request gives every fp32 variant an FP16 copy in the run (``--fp16`` forces them elsewhere)."""

RUN_BENCH = rb.BenchConfig(batch_sizes=(1, 32))
"""A run's timing settings unless told otherwise: ``minreal bench``'s, but for the batch sizes (a run also times a
large batch)."""


@dataclass(frozen=True)
class PipelineConfig:
    """Export, quantisation and benchmark settings shared by every case of a run (``report.json``'s config).

    It composes the settings of the stages it drives rather than repeating their fields: export/INT8 settings are one
    :class:`minreal.export.settings.VariantConfig` (``variant``; :meth:`variant_config` adds what the run's providers
    and batch sizes decide), timing settings one :class:`minreal.runtime_bench.BenchConfig` (``bench``;
    :meth:`bench_config` adds the axis lengths each case's data decides). :meth:`with_bench` changes timing settings.
    """

    bench: rb.BenchConfig = RUN_BENCH
    """What to time and how: providers, batch sizes, warm-up, measured runs and seconds, fresh processes, provider
    settings (``--provider-option``, ``--provider-config``), ``--io-binding``, and in ``axis_values`` the lengths of
    dynamic axes besides the batch that latency is measured at, by dimension name (``--axis-values seq=32,128``; an
    axis not named there is timed at its length in the data and at half of it)."""
    int8: bool = True
    variant: VariantConfig = field(default_factory=VariantConfig)
    """Opset, parity tolerances, INT8 target, mode and calibration samples, and the symbolic dimensions fixed in
    every exported file (``--fixed-shapes``, for NNAPI/CoreML; a fixed batch must then be the only batch size
    timed)."""
    skip_unavailable_providers: bool = False
    recovery: RecoveryConfig | None = None
    """Distillation from the original after every variant's method (None or a disabled config: none)."""
    allow_data_mismatch: bool = False
    """Go on (with a warning) when the original scores near chance on the labelled data
    (:mod:`minreal.app.mismatch`); by default that stops the run before any work."""
    fp16: bool = False
    """FP16 copies of the original and every variant even when no provider of :data:`FP16_PROVIDERS` is asked for
    (``--fp16``); with one, they are made anyway."""
    ort: OrtConfig | None = None
    """ORT-format copies (``NAME.ort``) of every fp32 and INT8 file, with their operator configurations and the
    case's merged one (``--format onnx,ort``); ``None``: ONNX only."""

    def with_bench(self, **changes: Any) -> PipelineConfig:
        """This config with ``changes`` made to :attr:`bench` (checked by :class:`~minreal.runtime_bench.BenchConfig`,
        whose errors name the field and its flag)."""
        return replace(self, bench=replace(self.bench, **changes))

    def bench_config(self, axis_values: Mapping[str, tuple[int, ...]] | None = None) -> rb.BenchConfig:
        """Timing settings for :func:`minreal.runtime_bench.run_benchmark`: :attr:`bench` with ``axis_values``, the
        axis lengths to time a case at (the user's, from :attr:`bench`, where an axis was named; else its data's)."""
        return replace(self.bench, axis_values=dict(axis_values or {}))

    def to_json(self) -> dict[str, Any]:
        """``report.json``'s config: the timing settings at the top level beside the others, as run report schema
        version 1 lays them out (readers find ``providers`` there); values still to pass through
        :func:`~minreal.export.json_safe.to_jsonable`."""
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "bench"}
        return {**{f.name: getattr(self.bench, f.name) for f in fields(self.bench)}, **rest}

    def wants_fp16(self) -> bool:
        """Whether the run makes FP16 copies: ``fp16`` set, or a GPU provider requested."""
        return self.fp16 or any(p in FP16_PROVIDERS for p in self.bench.providers)

    def fp16_config(self) -> Fp16Config:
        """FP16 options: fp32 I/O (the benchmark feeds every model the same arrays), parity on CUDA when a GPU
        provider is asked for and this onnxruntime has CUDA (real float16 arithmetic), else on CPU."""
        from minreal.export.fp16 import Fp16Config  # onnx: only when a run makes FP16 copies

        gpu = any(p in FP16_PROVIDERS for p in self.bench.providers)
        return Fp16Config(provider="cuda" if gpu and "cuda" in rb.available_providers() else "cpu")

    def variant_config(self) -> VariantConfig:
        """Export, parity and INT8 settings for :func:`minreal.export.variant.export_variant`."""
        batches = self.bench.batch_sizes
        return replace(self.variant, tensorrt_validation="tensorrt" in self.bench.providers,
                       tensorrt_batch=(min(batches), max(batches), max(batches)))
