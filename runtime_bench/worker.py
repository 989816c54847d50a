"""Worker process: times one (provider, batch size) for all models, interleaved.

Run as ``python -m minreal.runtime_bench.worker JOB.json RESULT.json``. A fresh process per job keeps
allocator and thread-pool state of one batch size from leaking into the next. Its start-up is part of every paired
gate's time, so a job whose input specs the parent read imports neither onnx nor torch.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from minreal.facts import PROVIDERS

from .errors import BenchInputError
from .inputs import Data, InputSpec, input_specs, timing_inputs
from .placement import measure_placements
from .providers import provider_mismatch
from .runtime import onnxruntime_module
from .sessions import create_session, share_thread_pool
from .timing import time_interleaved

__all__ = ["WorkerJob", "WorkerResult", "run_job", "main", "save_data", "load_data", "job_from_dict"]

#: In a saved ``.npz`` of named inputs: the array of input names; the arrays are ``arr_0``, ``arr_1``, ...
_NAMES_KEY = "names"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerJob:
    """One unit of timing work: all models on one provider at one batch size and one shape.

    ``axis_values`` gives each symbolic axis its length for this shape (``{}`` when there are none);
    ``data_path`` is a file written by :func:`save_data`, or None for random inputs. With ``placement``,
    each model also runs once, after the timing, in a separate profiled session
    (:func:`minreal.runtime_bench.placement.measure_placement`). ``specs`` holds each model's inputs
    (:func:`minreal.runtime_bench.inputs.input_specs`) as the parent read them, so the worker need not import onnx
    to read them again; empty, the worker reads them from the files. With ``shared_pool``, all models run on one
    intra-op thread pool of ``threads`` threads (:func:`minreal.runtime_bench.sessions.share_thread_pool`; a process
    makes it at most once, and every later session of that process must run on it, so only in a fresh worker
    process): the paired gate's jobs, whose ratio must not depend on where the scheduler put each session's own
    threads. ``shared_pool`` with ``placement`` is refused (BenchInputError): placement's profiled sessions run on
    pools of their own, which onnxruntime refuses in a process with the shared pool.
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
    provider_options: list[dict[str, str]] = field(default_factory=list)
    io_binding: bool = False
    placement: bool = False
    specs: list[list[InputSpec]] = field(default_factory=list)
    shared_pool: bool = False

    def __post_init__(self) -> None:
        if self.shared_pool and self.placement:
            raise BenchInputError("`WorkerJob.shared_pool` with `WorkerJob.placement`: placement's profiled sessions "
                                  "run on pools of their own, which onnxruntime refuses beside the shared pool; "
                                  "measure placement in a job without shared_pool")


def job_from_dict(fields: Mapping[str, Any]) -> WorkerJob:
    """The :class:`WorkerJob` that ``asdict(job)`` (as JSON) came from, its input specs rebuilt."""
    specs = [[InputSpec(**{**s, "shape": tuple(s["shape"])}) for s in model] for model in fields.get("specs", [])]
    return WorkerJob(**{**fields, "specs": specs})


@dataclass(frozen=True)
class WorkerResult:
    """What a worker measured; ``status`` is ``"ok"`` or ``"unavailable"`` (with ``reason``).

    ``session_s`` (session creation) and ``first_run_ms`` (the first call, where TensorRT builds or loads its
    engine for the shape) are per model and never part of ``latencies_ms``. With I/O binding,
    ``device_latencies_ms`` holds the device-only latencies (inputs and outputs resident on the device) and
    ``latencies_ms`` the ones with host copies, timed interleaved in the same loop. ``placements`` holds, by
    model, a :class:`minreal.runtime_bench.placement.Placement` as a dict (jobs with ``placement``).
    """

    pid: int
    status: str
    actual_providers: list[str]
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    reason: str | None = None
    session_s: dict[str, float] = field(default_factory=dict)
    first_run_ms: dict[str, float] = field(default_factory=dict)
    device_latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    placements: dict[str, dict[str, Any]] = field(default_factory=dict)


def _open(job: WorkerJob) -> tuple[list[Any], dict[str, float]]:
    """One session per model with its provider options (on the process's shared thread pool with ``shared_pool``);
    seconds each took to create."""
    sessions, seconds = [], {}
    options = job.provider_options or [{} for _ in job.paths]
    if job.shared_pool:
        share_thread_pool(job.threads)
    for name, path, opts in zip(job.names, job.paths, options):
        t0 = time.perf_counter()
        sessions.append(create_session(Path(path), job.provider, job.threads, provider_options=opts,
                                       shared_pool=job.shared_pool))
        seconds[name] = time.perf_counter() - t0
    return sessions, seconds


def _device(provider: str, options: Mapping[str, str]) -> tuple[str, int]:
    """ONNX Runtime's device name and id for I/O binding on ``provider``."""
    return ("cuda", int(options.get("device_id", 0))) if provider != PROVIDERS["cpu"] else ("cpu", 0)


def device_runner(session: Any, feeds: Mapping[str, np.ndarray], device: tuple[str, int]) -> Callable[[], object]:
    """A zero-argument call running ``session`` on inputs copied to ``device`` once, its outputs left there
    (ONNX Runtime I/O binding): what a pipeline that keeps tensors on the GPU pays per call."""
    ort = onnxruntime_module()
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), *device))
    for out in session.get_outputs():
        binding.bind_output(out.name, device[0], device[1])

    def run() -> object:
        session.run_with_iobinding(binding)
        return binding

    return run


def run_job(job: WorkerJob) -> WorkerResult:
    """Create one session per model, check the provider, build inputs and time interleaved.

    The first call of every model is timed on its own (the engine build of TensorRT happens there) before the
    warm-up; with ``io_binding`` the device-resident calls are interleaved with the host-copy ones.
    """
    sessions, session_s = _open(job)
    actual = sessions[0].get_providers()
    for session in sessions:
        reason = provider_mismatch(job.provider, session.get_providers())
        if reason is not None:
            return WorkerResult(os.getpid(), "unavailable", session.get_providers(), reason=reason)
    x = load_data(job.data_path)
    run_fns, device_fns, first_run_ms, all_feeds = [], [], {}, []
    options = job.provider_options or [{} for _ in job.paths]
    specs = job.specs or [input_specs(Path(path)) for path in job.paths]
    for name, model_specs, session, opts in zip(job.names, specs, sessions, options):
        feeds = timing_inputs(model_specs, job.batch_size, x, job.seed, name, job.axis_values)
        run_fns.append(lambda s=session, f=feeds: s.run(None, f))
        all_feeds.append(feeds)
        first_run_ms[name] = _timed_once(run_fns[-1])
        if job.io_binding:
            device_fns.append(device_runner(session, feeds, _device(job.provider, opts)))
    latencies = time_interleaved(run_fns + device_fns, job.warmup, job.min_runs, job.min_seconds)
    n = len(run_fns)
    placements = measure_placements(job.names, job.paths, job.provider, job.threads, all_feeds,
                                    options) if job.placement else {}
    return WorkerResult(
        pid=os.getpid(), status="ok", actual_providers=actual, latencies_ms=dict(zip(job.names, latencies[:n])),
        session_s=session_s, first_run_ms=first_run_ms,
        device_latencies_ms=dict(zip(job.names, latencies[n:])) if job.io_binding else {}, placements=placements,
    )


def _timed_once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


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
        sys.stderr.write("usage: python -m minreal.runtime_bench.worker JOB.json RESULT.json\n")
        return 2
    job = job_from_dict(json.loads(Path(args[0]).read_text()))
    result = run_job(job)
    tmp = Path(args[1]).with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(result)))
    os.replace(tmp, args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
