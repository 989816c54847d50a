"""The versioned ``report.json`` of a run directory: :class:`RunReport` and its cases, written by
:func:`minreal.app.pipeline.run_pipeline` through :meth:`RunReport.to_json` and read back by :meth:`RunReport.from_json`
without torch, onnx or onnxruntime. The views (:mod:`minreal.app.report`, :mod:`minreal.app.plots`,
:mod:`minreal.app.digest`, :mod:`minreal.app.gate`) read a :class:`RunReport`; :func:`run_report` is their boundary,
where a report's JSON becomes one. Each compressed variant's ``compression`` is a typed
:class:`~minreal.compress.core.report.CompressionReport`, read from its versioned JSON here."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from minreal.compress.core.report import CompressionReport, ReportVersionError
from minreal.export.record import VariantRecord

__all__ = ["CaseResult", "RunReport", "RUN_SCHEMA_VERSION", "variant_compression", "run_report", "case_result",
           "ReportLike", "CaseLike"]

RUN_SCHEMA_VERSION = 1
"""Version of the run report's layout; a report written without ``schema_version`` reads as version 1."""

_VARIANT_REQUIRED = {"label": "", "method": "", "params": 0, "macs": 0, "onnx": "", "onnx_bytes": 0}


def _as_mapping(record: Any) -> Mapping[str, Any]:
    """A record's JSON object as it is, or the attributes of a record object (a dataclass, a namespace)."""
    if isinstance(record, Mapping):
        return record
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    return vars(record)


@dataclass
class CaseResult:
    """Everything measured for one model and its compressed variants."""

    name: str
    variants: list[VariantRecord]
    bench: dict[str, Any]
    stage_seconds: dict[str, float]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    data_check: dict[str, Any] | None = None
    """The original's accuracy on the labelled data against chance (:class:`minreal.app.mismatch.DataCheck`)."""
    ort_config: str | None = None
    """With ORT-format files: the union of their required-operators configurations (``required_operators.config``
    in the case folder), for one minimal build that runs every file of the case."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | Any, source: str = "run report", *,
                  compression: bool = True) -> CaseResult:
        """A case of a run report's JSON (or a record object with its attributes); fields the report predates take
        their defaults, unknown keys are dropped, each variant's ``compression`` becomes a typed report (a refusal
        names ``source``, the case and the variant). ``compression=False`` leaves every variant's compression
        ``None`` unread, for a reader of the benchmarks only (the gate), which then does not depend on it."""
        data = _as_mapping(data)
        where = f"{source}: case {data.get('name', '')}"
        variants = [_variant_record(raw, where, compression) for raw in data.get("variants") or ()]
        return cls(str(data.get("name", "")), variants, dict(data.get("bench") or {}),
                   dict(data.get("stage_seconds") or {}), list(data.get("notes") or ()),
                   list(data.get("warnings") or ()), data.get("data_check"), data.get("ort_config"))


def _variant_record(raw: VariantRecord | Mapping[str, Any] | Any, where: str = "run report",
                    compression: bool = True) -> VariantRecord:
    """A variant of a case's JSON (or a record object with its attributes) as a :class:`VariantRecord`, its
    ``compression`` typed (``None`` when empty, or unread with ``compression=False``); a refused compression report
    names ``where`` and the variant."""
    if isinstance(raw, VariantRecord):
        return raw
    names = {f.name for f in dataclasses.fields(VariantRecord)}
    given = {k: v for k, v in _as_mapping(raw).items() if k in names}
    comp = given.get("compression")
    if not comp or not compression:
        given["compression"] = None
    elif not isinstance(comp, CompressionReport):
        given["compression"] = CompressionReport.from_json(comp, f"{where}, variant {given.get('label', '')}")
    return VariantRecord(**{**_VARIANT_REQUIRED, **given})


@dataclass
class RunReport:
    """The versioned ``report.json`` of a run directory."""

    schema_version: int
    created_utc: str
    config: dict[str, Any]
    cases: list[CaseResult]

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON object (values still to pass through :func:`~minreal.export.json_safe.to_jsonable`)."""
        return {"schema_version": RUN_SCHEMA_VERSION, "created_utc": self.created_utc, "config": self.config,
                "cases": self.cases}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | Any, source: str = "run report", *,
                  compression: bool = True) -> RunReport:
        """The report of :meth:`to_json`'s object; a missing ``schema_version`` is version 1, a newer one is refused
        (:class:`~minreal.compress.core.report.ReportVersionError`, one line naming ``source`` and the version).
        ``data`` may also be a record object with the same attributes. ``compression=False`` reads no variant's
        compression report (:meth:`CaseResult.from_json`)."""
        data = _as_mapping(data)
        version = data.get("schema_version", 1)
        if not isinstance(version, int) or version > RUN_SCHEMA_VERSION:
            raise ReportVersionError(f"{source}: run report schema_version {version!r} is newer than this minreal "
                                     f"reads ({RUN_SCHEMA_VERSION}); upgrade minreal to read it")
        return cls(version, str(data.get("created_utc", "")), dict(data.get("config") or {}),
                   [c if isinstance(c, CaseResult) else CaseResult.from_json(c, source, compression=compression)
                    for c in data.get("cases") or ()])

    @classmethod
    def load(cls, path: str | Path) -> RunReport:
        """The run report in a ``report.json`` file (:meth:`from_json`; errors name the file)."""
        return cls.from_json(json.loads(Path(path).read_text()), str(path))


ReportLike: TypeAlias = "RunReport | Mapping[str, Any]"
"""A run report, or its JSON (read through :meth:`RunReport.from_json`)."""
CaseLike: TypeAlias = "CaseResult | Mapping[str, Any]"
"""A case of a run report, or its JSON (read through :meth:`CaseResult.from_json`)."""


def run_report(report: ReportLike) -> RunReport:
    """``report`` itself, or the :class:`RunReport` of its JSON: the boundary of the views that take either (they
    read only the typed report past it)."""
    return report if isinstance(report, RunReport) else RunReport.from_json(report)


def case_result(case: CaseLike) -> CaseResult:
    """``case`` itself, or the :class:`CaseResult` of its JSON."""
    return case if isinstance(case, CaseResult) else CaseResult.from_json(case)


def variant_compression(variant: VariantRecord) -> CompressionReport | None:
    """The compression report of a variant (``None`` for the original and its INT8/FP16 copies)."""
    return variant.compression
