"""The release gate's latency criteria decided on paired fresh processes re-measured now (see
:mod:`minreal.runtime_bench.decision` for the test and its error rates)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .config import BenchConfig, ModelEntry, shape_grid, shape_label
from .decision import DecisionPlan, LatencyDecision
from .model_info import model_files
from .paired import paired_decision

__all__ = ["cell_config", "decide_cell", "remeasure_problem", "model_path"]

#: (model, provider, batch size, shape label)
Cell = tuple[str, str, int, str]


def cell_config(data: Mapping[str, Any], cell: Cell, plan: DecisionPlan) -> BenchConfig:
    """The timing protocol of ``data``'s config (warm-up, runs, threads, seed) on ``cell`` alone, with each process
    measuring for ``plan.pair_seconds`` per model."""
    config = data.get("config") or {}
    shapes = {shape_label(s): s for s in shape_grid(config.get("axis_values") or {})}
    shape = shapes.get(cell[3], {})
    return BenchConfig(providers=(cell[1],), batch_sizes=(cell[2],), warmup=int(config.get("warmup", 10)),
                       min_runs=int(config.get("min_runs", 50)), min_seconds=plan.pair_seconds,
                       intra_op_threads=config.get("intra_op_threads"), seed=int(config.get("seed", 0)),
                       axis_values={name: (value,) for name, value in shape.items()})


def model_path(data: Mapping[str, Any], name: str) -> Path | None:
    """The file a report timed as model ``name``; None when it records none."""
    for m in data.get("models") or ():
        if m.get("name") == name and m.get("path"):
            return Path(m["path"])
    return None


def remeasure_problem(baseline: Mapping[str, Any], report: Mapping[str, Any], name: str) -> str:
    """Why the baseline's file of model ``name`` cannot stand in for the baseline now (``""`` when it can): it is not
    recorded, no longer readable, the report's own file (overwritten since), or changed in size since."""
    then, now = model_path(baseline, name), model_path(report, name)
    if then is None:
        return "the baseline records no file for this model"
    if not then.is_file():
        return f"the baseline's model file {then} is not readable here"
    if now is not None and now.is_file() and then.resolve() == now.resolve():
        return f"the baseline and the report name the same file ({then}), so the baseline's model is gone"
    size = next((m.get("file_size_bytes") for m in baseline.get("models") or () if m.get("name") == name), None)
    if size is not None and _size_on_disk(then) != int(size):
        return f"the baseline's model file {then} changed since the baseline (its size differs)"
    return ""


def _size_on_disk(path: Path) -> int | None:
    """Bytes of a model's files as the report counts them; None when the file no longer reads as a model."""
    try:
        return sum(f.stat().st_size for f in model_files(path))
    except (OSError, ValueError):  # ModelFileError is a ValueError
        return None


def decide_cell(reference: Path, candidate: Path, data: Mapping[str, Any], cell: Cell, allowed: float,
                plan: DecisionPlan, progress: Callable[[str], None] | None = None) -> LatencyDecision:
    """Re-measure ``candidate`` against ``reference`` on ``cell`` in paired fresh processes and decide."""
    return paired_decision(ModelEntry("reference", reference), ModelEntry("candidate", candidate),
                           cell_config(data, cell, plan), allowed, plan, progress)
