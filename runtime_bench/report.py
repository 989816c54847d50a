"""The benchmark report: dataclasses, JSON/Markdown writers, console table and loader."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .atomic import atomic_write_text
from .config import BenchConfig
from .environment import Environment
from .errors import ReportSchemaError
from .load import describe_load
from .metrics import ModelMetrics
from .model_info import ModelInfo
from .placement import Placement, describe_fallback
from .timing import LatencyStats

__all__ = [
    "SCHEMA_VERSION",
    "LatencyResult",
    "RatioResult",
    "UnavailableProvider",
    "PlacementResult",
    "BenchReport",
    "write_json",
    "write_markdown",
    "format_table",
    "load_report",
    "validate_report",
]

#: Version of the JSON schema written by :func:`write_json`; bump on incompatible changes.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class LatencyResult:
    """Latency of one model on one provider at one batch size and shape, pooled over worker processes.

    ``shape`` labels the symbolic axis lengths timed (e.g. ``"seq=32"``, see
    :attr:`minreal.runtime_bench.BenchConfig.axis_values`); ``""`` when there are none. ``session_s`` (session creation)
    and ``first_run_ms`` (the first call, where TensorRT builds or loads an engine) are per process and never
    part of ``stats``. With I/O binding, ``device_stats`` are the device-only latencies (inputs and outputs on the
    device) and ``stats`` those with host copies.
    """

    model: str
    provider: str
    batch_size: int
    stats: LatencyStats
    process_p50_ms: tuple[float, ...]
    worker_pids: tuple[int, ...]
    actual_providers: tuple[str, ...]
    shape: str = ""
    session_s: tuple[float, ...] = ()
    first_run_ms: tuple[float, ...] = ()
    device_stats: LatencyStats | None = None
    device_process_p50_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class RatioResult:
    """``model`` latency / ``reference`` latency (median latencies, paired per process) in one cell."""

    model: str
    reference: str
    provider: str
    batch_size: int
    statistic: str
    median: float
    min: float
    max: float
    per_process: tuple[float, ...]
    shape: str = ""


@dataclass(frozen=True)
class UnavailableProvider:
    """A requested provider that could not run, and why; no numbers are reported for it."""

    provider: str
    requested: str
    reason: str


@dataclass(frozen=True)
class PlacementResult:
    """Where ``model``'s kernels ran on ``provider`` (short name), from one separate profiled run in the first
    timing process of its first batch size and shape (:func:`minreal.runtime_bench.placement.measure_placement`)."""

    model: str
    provider: str
    placement: Placement


@dataclass(frozen=True)
class BenchReport:
    """Everything one benchmark run measured (``asdict`` gives the JSON document)."""

    schema_version: int
    created_utc: str
    environment: Environment
    config: BenchConfig
    models: tuple[ModelInfo, ...]
    latency: tuple[LatencyResult, ...]
    ratios: tuple[RatioResult, ...]
    metrics: tuple[ModelMetrics, ...]
    metrics_data: str
    unavailable: tuple[UnavailableProvider, ...]
    placement: tuple[PlacementResult, ...] = ()


def write_json(report: BenchReport, path: Path) -> Path:
    """Write ``report`` as indented JSON atomically; returns the path."""
    return _write_text(Path(path), json.dumps(asdict(report), indent=2) + "\n")


def write_markdown(report: BenchReport, path: Path) -> Path:
    """Write ``report`` as Markdown atomically; returns the path."""
    return _write_text(Path(path), _markdown(report))


def format_table(report: BenchReport) -> str:
    """Plain-text tables (latency, metrics, unavailable providers) for the console."""
    parts = [_text_table(*_latency_rows(report))]
    if report.metrics:
        parts.append(_text_table(*_metrics_rows(report)))
    parts.extend(f"unavailable: {u.provider} ({u.requested}): {u.reason}" for u in report.unavailable)
    parts.extend(f"placement: {r.model} on {r.provider}: {r.placement.on_provider}/{r.placement.nodes} nodes; "
                 f"not on {r.placement.requested}: {describe_fallback(r.placement)}"
                 for r in report.placement if r.placement.fallback)
    return "\n\n".join(parts)


def load_report(path: Path) -> dict[str, Any]:
    """Read a report JSON file and check its schema version.

    Raises
    ------
    ReportSchemaError
        missing file, invalid JSON, or a schema version this code does not read.
    """
    path = Path(path)
    if not path.is_file():
        raise ReportSchemaError(f"report file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportSchemaError(f"report {path} is not valid JSON: {exc}") from None
    return validate_report(data, str(path))


def validate_report(data: Any, source: str) -> dict[str, Any]:
    """Check that ``data`` is a report dict of :data:`SCHEMA_VERSION`; returns it.

    Latency and ratio rows of reports written before shapes existed get ``shape: ""`` (in the returned
    copy; ``data`` itself is not changed).
    """
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ReportSchemaError(f"{source} is not a minreal benchmark report (no schema_version)")
    version = data["schema_version"]
    if version != SCHEMA_VERSION:
        raise ReportSchemaError(f"{source} has schema_version {version!r}; this minreal reads {SCHEMA_VERSION}")
    data = {**data, **{key: _with_shape(data[key]) for key in ("latency", "ratios") if isinstance(data.get(key), list)}}
    for row in data.get("latency") or []:
        _check_latency_row(row, source)
    return data


def _with_shape(rows: list[Any]) -> list[Any]:
    """``rows`` with ``shape`` defaulted to ``""`` in each object (older reports have none)."""
    return [{"shape": "", **row} if isinstance(row, dict) else row for row in rows]


def _positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _check_latency_row(row: Any, source: str) -> None:
    """A latency row names its cell and holds a finite, positive p50 (and per-process p50s, if any)."""
    if not isinstance(row, dict):
        raise ReportSchemaError(f"{source}: a latency entry is a {type(row).__name__}, not an object; "
                                "regenerate the report")
    where = f"{source}: latency of {row.get('model')} {row.get('provider')} batch {row.get('batch_size')}"
    if not isinstance(row.get("shape"), str):
        raise ReportSchemaError(f"{where} has a shape that is not a string; regenerate the report")
    where += f" {row['shape']}" if row["shape"] else ""
    stats = row.get("stats")
    if not isinstance(stats, dict) or not _positive_finite(stats.get("p50_ms")):
        raise ReportSchemaError(f"{where} has no finite, positive stats.p50_ms; regenerate the report")
    spread = row.get("process_p50_ms") or []
    if not isinstance(spread, (list, tuple)) or not all(_positive_finite(v) for v in spread):
        raise ReportSchemaError(f"{where} has a process_p50_ms that is not a list of positive numbers; "
                                "regenerate the report")


def _write_text(path: Path, text: str) -> Path:
    """Create the parent folder if needed, then write ``text`` atomically (umask permissions)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, text)


Rows = tuple[list[str], list[list[str]]]


def _latency_rows(report: BenchReport) -> Rows:
    """One row per latency result; a ``shape`` column after ``batch`` when any result has a shape."""
    ratios = {(r.model, r.provider, r.batch_size, r.shape): r for r in report.ratios}
    shaped = any(res.shape for res in report.latency)
    headers = ["model", "provider", "batch", *(["shape"] if shaped else []), "mean ms", "std ms", "p50 ms", "p90 ms",
               "p99 ms", "samples/s", "runs", "ratio (min-max)"]
    rows = []
    for res in report.latency:
        s = res.stats
        ratio = ratios.get((res.model, res.provider, res.batch_size, res.shape))
        shown = "1 (reference)" if ratio is None else f"{ratio.median:.3f} ({ratio.min:.3f}-{ratio.max:.3f})"
        times = [f"{t:.3f}" for t in (s.mean_ms, s.std_ms, s.p50_ms, s.p90_ms, s.p99_ms)]
        cell = [res.model, res.provider, str(res.batch_size), *([res.shape] if shaped else [])]
        rows.append([*cell, *times, f"{s.throughput_sps:.1f}", str(s.runs), shown])
    return headers, rows


def _median_max(values: Sequence[float], scale: float = 1.0, digits: int = 3) -> str:
    finite = [v * scale for v in values if math.isfinite(v)]
    if not finite:
        return "-"
    return f"{statistics.median(finite):.{digits}f} ({max(finite):.{digits}f})"


def _build_rows(report: BenchReport) -> Rows:
    """Session creation (ms) and first call (ms) per latency cell."""
    shaped = any(res.shape for res in report.latency)
    headers = ["model", "provider", "batch", *(["shape"] if shaped else []), "session ms", "first run ms"]
    rows = [[res.model, res.provider, str(res.batch_size), *([res.shape] if shaped else []),
             _median_max(res.session_s, 1e3, 1), _median_max(res.first_run_ms, 1.0, 1)] for res in report.latency]
    return headers, rows


def _device_rows(report: BenchReport) -> Rows:
    """Device-only latency next to the with-copy p50 of the same cell."""
    shaped = any(res.shape for res in report.latency)
    headers = ["model", "provider", "batch", *(["shape"] if shaped else []), "with-copy p50 ms", "device p50 ms",
               "device p90 ms"]
    rows = [[res.model, res.provider, str(res.batch_size), *([res.shape] if shaped else []),
             f"{res.stats.p50_ms:.3f}", f"{res.device_stats.p50_ms:.3f}", f"{res.device_stats.p90_ms:.3f}"]
            for res in report.latency if res.device_stats is not None]
    return headers, rows


def _metrics_rows(report: BenchReport) -> Rows:
    headers = ["model", "samples", "accuracy", "mse", "top-1 agreement", "max abs diff"]
    rows = [[m.model, str(m.samples), _opt(m.accuracy, "{:.4f}"), _opt(m.mse, "{:.4g}"),
             _opt(m.top1_agreement, "{:.4f}"), f"{m.max_abs_diff:.3g}"] for m in report.metrics]
    return headers, rows


def _placement_rows(report: BenchReport) -> Rows:
    headers = ["model", "provider", "nodes on provider", "node share", "MAC share", "device copies",
               "not on the provider (first 5)"]
    rows = [[r.model, r.provider, f"{p.on_provider}/{p.nodes}", f"{p.node_share:.4f}",
             "unknown" if p.mac_share is None else f"{p.mac_share:.4f}", str(p.copies), describe_fallback(p) or "-"]
            for r in report.placement for p in [r.placement]]
    return headers, rows


def _environment_lines(env: dict[str, Any]) -> str:
    """``- key: value`` per environment field; GPUs as ``name (memory MiB, driver version)``."""
    def shown(key: str, value: Any) -> str:
        if key == "gpus" and value:
            return ", ".join(f"{g['name']} ({_opt(g['memory_mib'], '{} MiB')}, driver {g['driver_version']})"
                             for g in value)
        if key == "machine_load" and value:
            return describe_load(value)
        return _plain(value)

    return "\n".join(f"- {key}: {shown(key, value)}" for key, value in env.items())


def _model_rows(report: BenchReport) -> Rows:
    headers = ["model", "path", "size bytes", "gzip bytes", "nodes", "opset"]
    rows = [[m.name, m.path, str(m.file_size_bytes), str(m.gzip_bytes),
             _opt(m.node_count, "{}"), _opt(m.opset, "{}")]
            for m in report.models]
    if any(m.int8_target for m in report.models):  # an arm64 file ran ARM's graph: the table says which files
        headers.append("INT8 target")
        for row, m in zip(rows, report.models):
            row.append(_opt(m.int8_target, "{}") + (" (ARM graph)" if m.int8_target == "arm64" else ""))
    return headers, rows


def _plain(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def _markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _markdown(report: BenchReport) -> str:
    env = asdict(report.environment)
    cfg = report.config
    parts = [
        "# ONNX Runtime benchmark",
        f"Schema {report.schema_version}, created {report.created_utc} UTC.",
        "## Environment",
        _environment_lines(env),
        "## Protocol",
        f"Warm-up {cfg.warmup} runs discarded; at least {cfg.min_runs} runs and {cfg.min_seconds} s measured per "
        f"process; models interleaved; {cfg.repeats} fresh processes per (provider, batch size"
        f"{', shape' if cfg.axis_values else ''}). "
        "Ratios are median latencies vs the first model, paired per process: median (min-max).",
        "## Models",
        _markdown_table(*_model_rows(report)),
        "## Latency",
        _markdown_table(*_latency_rows(report)),
    ]
    parts += ["## Session build and first run", "Per model and cell, median over processes (max): session creation "
              "and the first call, where TensorRT builds or loads its engine; never part of the latency above.",
              _markdown_table(*_build_rows(report))]
    if any(r.device_stats for r in report.latency):
        parts += ["## Device-resident latency (I/O binding)", "Inputs and outputs bound on the device, timed "
                  "interleaved with the with-copy calls of the latency table.", _markdown_table(*_device_rows(report))]
    if report.placement:
        parts += ["## Placement", "Kernels of the optimised graph by the provider that ran them, from one separate "
                  "profiled run per model and provider (device copies not counted as nodes; MAC share unknown "
                  "where a kernel's MACs cannot be counted).", _markdown_table(*_placement_rows(report))]
    if report.metrics:
        parts += ["## Accuracy and agreement with the first model", f"Computed on {report.metrics_data}.",
                  _markdown_table(*_metrics_rows(report))]
    if report.unavailable:
        lines = [f"- {u.provider} ({u.requested}): {u.reason}" for u in report.unavailable]
        parts += ["## Unavailable providers", "\n".join(lines)]
    return "\n\n".join(parts) + "\n"
