"""ONNX Runtime benchmark: interleaved timing in fresh processes, metrics, reports, release gate.

This package never imports torch. Its public names load lazily (PEP 562), so importing
:mod:`minreal.facts` (stdlib only) does not import onnxruntime: that is the one module ``compress``
may import from here (``tests/test_layering.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module that defines it (relative to this package, as in an import statement).
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("atomic_path", "atomic_write_bytes", "atomic_write_text"), ".atomic"),
    **dict.fromkeys(("Progress", "run_benchmark"), ".bench"),
    **dict.fromkeys(("CheckResult", "Criterion", "check_report", "format_check"), ".check"),
    **dict.fromkeys(("BenchConfig", "ModelEntry"), ".config"),
    **dict.fromkeys(("DecisionPlan", "LatencyDecision", "sequential_decision"), ".decision"),
    "MachineLoad": ".load", "paired_decision": ".paired",
    **dict.fromkeys(("BenchInputError", "CheckError", "ModelFileError", "ProviderUnavailableError",
                     "ReportSchemaError", "SessionError", "UnknownProviderError", "WorkerError"), ".errors"),
    **dict.fromkeys(("INTEGER_OP_TYPES", "ModelInfo", "count_nodes", "model_info", "optimized_graph_ops"),
                    ".model_info"),
    **dict.fromkeys(("Placement", "PlacedNode", "measure_placement", "parse_profile"), ".placement"),
    "PROVIDERS": "minreal.facts", "available_providers": ".providers",
    **dict.fromkeys(("SCHEMA_VERSION", "BenchReport", "PlacementResult", "format_table", "load_report", "write_json",
                     "write_markdown"), ".report"),
    **dict.fromkeys(("LatencyStats", "latency_stats", "time_interleaved"), ".timing"),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime_bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "BenchConfig",
    "ModelEntry",
    "Progress",
    "run_benchmark",
    "BenchReport",
    "PlacementResult",
    "Placement",
    "PlacedNode",
    "parse_profile",
    "measure_placement",
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
    "DecisionPlan",
    "LatencyDecision",
    "sequential_decision",
    "paired_decision",
    "MachineLoad",
]
