"""ONNX Runtime benchmark: interleaved timing in fresh processes, metrics, reports, release gate.

This package never imports torch.
"""

from .atomic import atomic_path, atomic_write_bytes, atomic_write_text
from .bench import Progress, run_benchmark
from .check import CheckResult, Criterion, check_report, format_check
from .config import BenchConfig, ModelEntry
from .errors import (
    BenchInputError,
    CheckError,
    ModelFileError,
    ProviderUnavailableError,
    ReportSchemaError,
    SessionError,
    UnknownProviderError,
    WorkerError,
)
from .model_info import INTEGER_OP_TYPES, ModelInfo, count_nodes, model_info, optimized_graph_ops
from .providers import PROVIDERS, available_providers
from .report import SCHEMA_VERSION, BenchReport, format_table, load_report, write_json, write_markdown
from .timing import LatencyStats, latency_stats, time_interleaved

__all__ = [
    "BenchConfig",
    "ModelEntry",
    "Progress",
    "run_benchmark",
    "BenchReport",
    "SCHEMA_VERSION",
    "write_json",
    "write_markdown",
    "format_table",
    "load_report",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_report",
    "format_check",
    "CheckResult",
    "Criterion",
    "available_providers",
    "PROVIDERS",
    "model_info",
    "ModelInfo",
    "count_nodes",
    "optimized_graph_ops",
    "INTEGER_OP_TYPES",
    "time_interleaved",
    "latency_stats",
    "LatencyStats",
    "BenchInputError",
    "ModelFileError",
    "UnknownProviderError",
    "ProviderUnavailableError",
    "WorkerError",
    "ReportSchemaError",
    "SessionError",
    "CheckError",
]
