"""Worker process: times one (provider, batch size) for all models, interleaved.

Run as ``python -m runtime_bench.worker JOB.json RESULT.json``. A fresh process per job keeps
allocator and thread-pool state of one batch size from leaking into the next.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .inputs import input_specs, timing_inputs
from .providers import provider_mismatch
from .sessions import create_session
from .timing import time_interleaved

__all__ = ["WorkerJob", "WorkerResult", "run_job", "main"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerJob:
    """One unit of timing work: all models on one provider at one batch size."""

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
    x = np.load(job.data_path) if job.data_path else None
    run_fns = []
    for name, path, session in zip(job.names, job.paths, sessions):
        feeds = timing_inputs(input_specs(Path(path)), job.batch_size, x, job.seed, name)
        run_fns.append(lambda s=session, f=feeds: s.run(None, f))
    latencies = time_interleaved(run_fns, job.warmup, job.min_runs, job.min_seconds)
    return WorkerResult(
        pid=os.getpid(), status="ok", actual_providers=actual, latencies_ms=dict(zip(job.names, latencies))
    )


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
