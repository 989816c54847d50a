"""Worker process: times one (provider, batch size) for all models, interleaved.

Run as ``python -m runtime_bench.worker JOB.json RESULT.json``. A fresh process per job keeps
allocator and thread-pool state of one batch size from leaking into the next.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .inputs import Data, input_specs, timing_inputs
from .providers import provider_mismatch
from .sessions import create_session
from .timing import time_interleaved

__all__ = ["WorkerJob", "WorkerResult", "run_job", "main", "save_data", "load_data"]

#: In a saved ``.npz`` of named inputs: the array of input names; the arrays are ``arr_0``, ``arr_1``, ...
_NAMES_KEY = "names"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerJob:
    """One unit of timing work: all models on one provider at one batch size and one shape.

    ``axis_values`` gives each symbolic axis its length for this shape (``{}`` when there are none);
    ``data_path`` is a file written by :func:`save_data`, or None for random inputs.
    """

    names: list[str]
    paths: list[str]
    provider: str
    batch_size: int
    threads: int
    warmup: int
    min_runs: int
    min_seconds: float
    seed: int
    data_path: str | None = None
    axis_values: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerResult:
    """What a worker measured; ``status`` is ``"ok"`` or ``"unavailable"`` (with ``reason``)."""

    pid: int
    status: str
    actual_providers: list[str]
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    reason: str | None = None


def run_job(job: WorkerJob) -> WorkerResult:
    """Create one session per model, check the provider, build inputs and time interleaved."""
    sessions = [create_session(Path(p), job.provider, job.threads) for p in job.paths]
    actual = sessions[0].get_providers()
    for session in sessions:
        reason = provider_mismatch(job.provider, session.get_providers())
        if reason is not None:
            return WorkerResult(os.getpid(), "unavailable", session.get_providers(), reason=reason)
    x = load_data(job.data_path)
    run_fns = []
    for name, path, session in zip(job.names, job.paths, sessions):
        feeds = timing_inputs(input_specs(Path(path)), job.batch_size, x, job.seed, name, job.axis_values)
        run_fns.append(lambda s=session, f=feeds: s.run(None, f))
    latencies = time_interleaved(run_fns, job.warmup, job.min_runs, job.min_seconds)
    return WorkerResult(
        pid=os.getpid(), status="ok", actual_providers=actual, latencies_ms=dict(zip(job.names, latencies))
    )


def save_data(x: Data | None, folder: Path) -> str | None:
    """Save ``x`` for worker processes: an array as ``x.npy``, named arrays as ``x.npz``; None stays None.

    Named arrays are stored positionally with their names beside them, so any input name survives.
    """
    if x is None:
        return None
    if not isinstance(x, Mapping):
        path = Path(folder) / "x.npy"
        np.save(path, x)
        return str(path)
    path = Path(folder) / "x.npz"
    np.savez(path, *[np.asarray(a) for a in x.values()], **{_NAMES_KEY: np.array(list(x), dtype=str)})
    return str(path)


def load_data(path: str | None) -> Data | None:
    """Read what :func:`save_data` wrote (an array, or a dict of named arrays); None for None."""
    if path is None:
        return None
    if not path.endswith(".npz"):
        return np.load(path)
    with np.load(path) as saved:
        return {name: saved[f"arr_{i}"] for i, name in enumerate(saved[_NAMES_KEY].tolist())}


def main(argv: list[str] | None = None) -> int:
    """Entry point: read the job JSON, run it, write the result JSON. Returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m runtime_bench.worker JOB.json RESULT.json\n")
        return 2
    job = WorkerJob(**json.loads(Path(args[0]).read_text()))
    result = run_job(job)
    tmp = Path(args[1]).with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(result)))
    os.replace(tmp, args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
