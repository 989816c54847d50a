"""What a run knows of one exported model: :class:`VariantRecord`, without torch, onnx or onnxruntime at import, so
a run's ``report.json`` reads back (:mod:`minreal.app.run_report`) without them; :mod:`minreal.export.variant` makes
the records."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from minreal.compress.core.report import CompressionReport

__all__ = ["VariantRecord"]


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

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (values still to pass through
        :func:`~minreal.export.json_safe.to_jsonable`); no compression report is written ``{}``, as before it was
        typed, so readers of run report schema_version 1 keep reading it (both ``{}`` and ``null`` read as none)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "compression": {} if self.compression is None else self.compression}
