"""What a run knows of one exported model: :class:`VariantRecord`, without torch, onnx or onnxruntime at import, so
a run's ``report.json`` reads back (:mod:`minreal.app.run_report`) without them; :mod:`minreal.export.variant` makes
the records."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

from minreal.compress.core.report import CompressionReport

__all__ = ["Laps", "VariantRecord"]


@dataclass
class VariantRecord:
    """One model of a case (original, compressed, INT8, FP16) with its costs and export results.

    ``compression`` is the typed report of the method that made a compressed variant (``None`` for the original and
    for INT8/FP16 copies). ``fp16`` is the :class:`minreal.export.fp16.Fp16Result` of an FP16 copy, or
    ``{"skipped": reason}`` on an fp32 variant that got none; empty otherwise. ``ort`` describes the variant's
    ORT-format copy ``NAME.ort`` and its parity (:func:`minreal.export.ort_format.ort_variant`); empty when none was
    written.
    """

    label: str
    method: str
    params: int
    macs: int
    """Whole-model MACs of one sample, counted as the compression report counts them (torch's FlopCounterMode; a
    layer torch under-counts, and an SSM layer, by its rule): attention's score and value products included, as in a
    torch.export program of the same model (a program has no layers, so torch counts the operations it traced: an
    SSM layer there counts as the convolution it was exported as, not by its rule)."""
    onnx: str
    onnx_bytes: int
    export: dict[str, Any] = field(default_factory=dict)
    simplify: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] = field(default_factory=dict)
    compression: CompressionReport | None = None
    tensorrt_readiness: dict[str, Any] = field(default_factory=dict)
    fixed_shapes: dict[str, Any] | None = None
    mobile: dict[str, Any] = field(default_factory=dict)
    fp16: dict[str, Any] = field(default_factory=dict)
    gzip_bytes: int = 0
    """The file (with its external data) gzip-compressed (:func:`minreal.runtime_bench.model_info.gzip_bytes`)."""
    ort: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    """Wall time (s) by phase of the export that made this record: ``export``, ``simplify``, ``parity``,
    ``fixed_shapes`` (with the move to the output path), ``costs``, ``checks`` (TensorRT readiness, NNAPI/CoreML,
    gzip size), and, added by ``minreal export``, ``load``, ``ort``, ``int8`` and ``fp16`` when they ran; empty in
    reports written before."""
    macs_at: dict[str, list[int]] = field(default_factory=dict)
    """The per-sample input shapes (batch axis dropped) at which ``macs`` was counted: one sample of the data given
    to the export (a run's held-out data); with a dynamic length, other lengths run other counts. Empty in reports
    written before."""

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (values still to pass through
        :func:`~minreal.export.json_safe.to_jsonable`); no compression report is written ``{}``, as before it was
        typed, so readers of run report schema_version 1 keep reading it (both ``{}`` and ``null`` read as none)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "compression": {} if self.compression is None else self.compression}


class Laps:
    """Wall time by phase: each :meth:`lap` adds the seconds since the previous lap (or since the start) to its phase
    in :attr:`timings` (seconds, rounded to the millisecond)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._since = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Close ``phase``: the time since the previous lap goes to it (added, when the phase ran before)."""
        now = time.perf_counter()
        self.timings[phase] = round(self.timings.get(phase, 0.0) + now - self._since, 3)
        self._since = now

    def take(self, timings: dict[str, float]) -> None:
        """Add phases timed elsewhere (a callee's :attr:`timings`) and restart the clock: their time is not counted
        again in the next lap."""
        for phase, seconds in timings.items():
            self.timings[phase] = round(self.timings.get(phase, 0.0) + seconds, 3)
        self._since = time.perf_counter()
