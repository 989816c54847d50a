"""The release gate's latency criteria decided on paired fresh processes re-measured now (see
:mod:`minreal.runtime_bench.decision` for the test and its error rates)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from minreal.facts import error_line

from .config import BenchConfig, ModelEntry, shape_grid, shape_label
from .decision import UNDECIDED, DecisionPlan, LatencyDecision
from .errors import ProviderUnavailableError, WorkerError
from .model_info import model_files
from .paired import paired_decision

__all__ = ["cell_config", "decide_cell", "remeasure_problem", "model_path", "with_model_folder", "PAIR_WARMUP",
           "PAIR_MIN_RUNS"]

#: (model, provider, batch size, shape label)
Cell = tuple[str, str, int, str]
#: Warm-up runs and least timed runs per model in each paired process: small, so that ``pair_seconds`` (not the
#: report's protocol, whose ``min_runs`` may be large) governs how long a pair takes.
PAIR_WARMUP, PAIR_MIN_RUNS = 2, 5


def cell_config(data: Mapping[str, Any], cell: Cell, plan: DecisionPlan) -> BenchConfig:
    """The timing protocol of ``data``'s config (threads, seed) on ``cell`` alone, with each process measuring for
    ``plan.pair_seconds`` per model after :data:`PAIR_WARMUP` warm-up runs and at least :data:`PAIR_MIN_RUNS` runs
    (the report's own warm-up and run counts would make a pair outlast ``--gate-seconds``)."""
    config = data.get("config") or {}
    shapes = {shape_label(s): s for s in shape_grid(config.get("axis_values") or {})}
    shape = shapes.get(cell[3], {})
    return BenchConfig(providers=(cell[1],), batch_sizes=(cell[2],), warmup=PAIR_WARMUP,
                       min_runs=PAIR_MIN_RUNS, min_seconds=plan.pair_seconds,
                       intra_op_threads=config.get("intra_op_threads"), seed=int(config.get("seed", 0)),
                       axis_values={name: (value,) for name, value in shape.items()})


def model_path(data: Mapping[str, Any], name: str) -> Path | None:
    """The file a report timed as model ``name``; None when it records none."""
    for m in data.get("models") or ():
        if m.get("name") == name and m.get("path"):
            return Path(m["path"])
    return None


def with_model_folder(data: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    """``data`` with each relative model path that names a file in ``folder`` (the folder the report's paths are
    relative to: a bench report's own folder, a run report case's folder) made ``folder / path``; a relative path
    that names no file there is left as it is (read from the working directory, where ``bench`` was run)."""
    def resolved(m: Mapping[str, Any]) -> Mapping[str, Any]:
        path = m.get("path") if isinstance(m, Mapping) else None
        if not isinstance(path, str) or not path or Path(path).is_absolute() or not _is_file(folder / path):
            return m
        return {**m, "path": str(folder / path)}

    models = data.get("models")
    if not isinstance(models, list):
        return dict(data)
    return {**data, "models": [resolved(m) for m in models]}


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a readable file's name; False for a name the system refuses (too long, a NUL byte)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


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
    """Re-measure ``candidate`` against ``reference`` on ``cell`` in paired fresh processes and decide.

    A measurement that could not be made (a worker that crashed, outlasted its timeout or lacked the provider, a model
    file that no longer reads, a worker result without the latencies) is an undecided verdict whose advice gives the
    reason: neither a pass nor a failure, nor blamed on the report.
    """
    config = cell_config(data, cell, plan)  # the report's fields: a malformed one is the report's fault
    try:
        return paired_decision(ModelEntry(str(reference), reference), ModelEntry(cell[0], candidate), config, allowed,
                               plan, progress)
    except (WorkerError, ProviderUnavailableError, OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        reason = error_line(exc, with_type=not isinstance(exc, (WorkerError, ProviderUnavailableError)),
                            max_chars=200)
        return LatencyDecision(UNDECIDED, allowed, 0, math.nan, 0.0, math.inf, plan.alpha, plan.level, 0, (),
                               advice=f"the paired measurement could not be made ({reason}); fix that and check "
                                      "again", cells=plan.cells)
