"""Release gate over a bench report or a run directory's report.json (one check per case)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import runtime_bench as rb

__all__ = ["check_reports", "bench_reports"]


def bench_reports(path: Path) -> dict[str, dict[str, Any]]:
    """Bench reports in ``path`` by name: the report itself, or each case of a run report."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise rb.ReportSchemaError(f"report {path} does not exist") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise rb.ReportSchemaError(f"report {path} is not readable JSON: {exc}") from None
    if isinstance(data, dict) and "cases" in data:
        return {c["name"]: c["bench"] for c in data["cases"]}
    return {Path(path).stem: rb.load_report(path)}


def check_reports(path: Path, baseline: Path | None, max_latency_ratio: float | None,
                  max_accuracy_drop: float | None, min_agreement: float | None,
                  max_regression: float | None) -> list[tuple[str, rb.CheckResult]]:
    """Apply the thresholds to every bench report in ``path`` (baseline matched by case name)."""
    reports = bench_reports(path)
    base = bench_reports(baseline) if baseline else {}
    if baseline and len(base) == 1 and len(reports) == 1:
        base = {next(iter(reports)): next(iter(base.values()))}
    results = []
    for name, rep in reports.items():
        if baseline and name not in base:
            raise rb.CheckError(f"baseline {baseline} has no case named {name!r}")
        results.append((name, rb.check_report(rep, max_latency_ratio, max_accuracy_drop, min_agreement,
                                              base.get(name), max_regression)))
    return results
