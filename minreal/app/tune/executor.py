"""How tune candidates run: a small executor interface, so a distributed engine can take over.

An executor maps a picklable function over jobs and returns the results in order, and runs single jobs *on the
target hardware* (the benchmarks: latency is only worth measuring there). :class:`ProcessExecutor` (the default)
runs candidates in local worker processes that stay alive across rounds (each loads the model once) and ignore
Ctrl-C: the parent alone decides, and on an interrupt it terminates them (a job cut short is never cached).
:class:`InlineExecutor` runs them in this process (the Python API with objects in memory, tests). Both take this
machine as the target hardware. :class:`RayExecutor` runs candidates as Ray tasks anywhere on a cluster and the
benchmarks only on a node that carries a custom resource (``ray start --resources '{"minreal_bench": 1}'``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any, Protocol

from .config import TuneError

__all__ = ["Executor", "InlineExecutor", "ProcessExecutor", "RayExecutor", "BENCH_RESOURCE", "require_ray",
           "worker_threads", "WORKER_ENV"]

BENCH_RESOURCE = "minreal_bench"
"""The Ray custom resource that marks nodes of the target hardware (where benchmarks may run)."""
CANCEL_GRACE_S = 5.0
"""How long cancelled Ray tasks get to unwind (remove their temporary folders) before they are killed."""


class Executor(Protocol):
    """``map(fn, jobs)`` → results in the order of ``jobs``; ``on_target(fn, job)`` → ``fn(job)`` run on the target
    hardware; ``close(abort)`` releases the workers (``abort``: at once, dropping running jobs). An executor may
    also have ``imap(fn, jobs)``, the same results as an iterator that yields each as soon as it and those before
    it are done (the tune then reports every probe as it ends)."""

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]: ...

    def on_target(self, fn: Callable[[Any], Any], job: Any) -> Any: ...

    def close(self, abort: bool = False) -> None: ...


class InlineExecutor:
    """Runs every job in this process, one after the other; this machine is the target hardware."""

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]:
        return [fn(job) for job in jobs]

    def imap(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> Iterator[Any]:
        return (fn(job) for job in jobs)

    def on_target(self, fn: Callable[[Any], Any], job: Any) -> Any:
        return fn(job)

    def close(self, abort: bool = False) -> None:
        return None


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_worker(threads: int, log_queue: Any = None) -> None:
    """A worker ignores Ctrl-C (the parent decides), uses ``threads`` torch threads and sends its log records (the
    library's progress: statistics, recovery epochs) to ``log_queue``, which the parent shows as its own."""
    _ignore_interrupts()
    if log_queue is not None:
        import logging.handlers

        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.addHandler(logging.handlers.QueueHandler(log_queue))
        root.setLevel(logging.INFO)
    import torch

    torch.set_num_threads(threads)


class _Relay(logging.Handler):
    """In the parent: a worker's record goes to the parent's logger of the same name, so it is shown (or not) as
    the parent's own records are (progress bars, log lines, levels)."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


def worker_threads(workers: int, cores: int | None = None) -> int:
    """Torch threads per worker so that workers × threads never exceeds the cores (at least 1)."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, workers))


WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Set for the workers unless the user set them: an OpenMP thread that finished its share sleeps instead of
spinning, so workers (and the parent's timing processes) do not take each other's cores."""


class ProcessExecutor:
    """``workers`` local processes (spawned: no state inherited from the parent), reused across rounds, each with
    :func:`worker_threads` torch threads and passive OpenMP waiting (:data:`WORKER_ENV`), their log records shown
    by this process (so a recovery's epochs reach the terminal and logs); target jobs run in this process (which
    starts its own fresh timing processes)."""

    def __init__(self, workers: int = 1) -> None:
        import logging.handlers

        self.workers, self.threads = workers, worker_threads(workers)
        ctx = multiprocessing.get_context("spawn")
        self.log_queue = ctx.Queue()
        self.listener = logging.handlers.QueueListener(self.log_queue, _Relay())
        self.listener.start()
        self.listening = True
        added = {k: v for k, v in {**WORKER_ENV, "OMP_NUM_THREADS": str(self.threads)}.items()
                 if k not in os.environ}
        os.environ.update(added)  # spawned workers take the environment at their start, which is now
        try:
            self.pool = ctx.Pool(workers, initializer=_start_worker, initargs=(self.threads, self.log_queue))
        except BaseException:
            self.listener.stop()
            raise
        finally:
            for k in added:
                os.environ.pop(k, None)

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]:
        return self.pool.map_async(fn, jobs, chunksize=1).get()

    def imap(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> Iterator[Any]:
        return self.pool.imap(fn, jobs, chunksize=1)

    def on_target(self, fn: Callable[[Any], Any], job: Any) -> Any:
        return fn(job)

    def close(self, abort: bool = False) -> None:
        if abort:
            self.pool.terminate()
        else:
            self.pool.close()
        self.pool.join()
        if self.listening:  # the records the workers sent are all shown first
            self.listening = False
            self.listener.stop()


def require_ray() -> ModuleType:
    """The ``ray`` module, or a one-line :class:`TuneError` naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise TuneError("--executor ray needs Ray, which is not installed: pip install 'minreal[ray]'") from None
    return ray


def _in_dir(cwd: str, fn: Callable[[Any], Any], job: Any) -> Any:
    """A candidate job on a Ray worker, from the driver's working directory when this node has it (shared storage:
    relative model, data and cache paths then mean the same files)."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    return fn(job)


def _on_node(fn: Callable[[Any], Any], job: Any) -> tuple[Any, str]:
    """A target job on a Ray worker, with the id of the node it ran on."""
    import ray

    return fn(job), ray.get_runtime_context().get_node_id()


class RayExecutor:
    """Candidate jobs as Ray tasks of one CPU each, anywhere on the cluster (a worker process loads the model once
    and serves many jobs, as the local workers do); target jobs only on a node with the custom resource
    ``bench_resource``, always the same one, holding all of its CPUs while they run (so no candidate job of
    this tune, nor any other Ray task, shares the machine with a timing).

    ``address``: ``auto`` (the cluster this machine belongs to, or ``RAY_ADDRESS``) or ``HOST:PORT`` of the head;
    when this process is already connected to Ray (``ray.init`` by the caller) that connection is used and left
    open. Every node needs minreal installed with the same versions; the candidate cache (and relative input
    paths) must be on storage every node mounts at the same path.
    """

    def __init__(self, address: str | None = "auto", bench_resource: str = BENCH_RESOURCE) -> None:
        self.ray, self.cwd, self.bench_resource = require_ray(), os.getcwd(), bench_resource
        self.pending: list[Any] = []
        self.ran_on: list[str] = []
        """Node ids the target jobs ran on, in order."""
        self.owns = not self.ray.is_initialized()
        if self.owns:
            _connect(self.ray, address)
        try:
            self.bench_node, bench_cpus = _bench_node(self.ray, bench_resource)
        except BaseException:
            self.close()
            raise
        self._task = self.ray.remote(num_cpus=1)(_in_dir)
        self._target = self.ray.remote(num_cpus=bench_cpus, resources={bench_resource: 1})(_on_node)

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]:
        return self._get([self._task.remote(self.cwd, fn, job) for job in jobs])

    def imap(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> Iterator[Any]:
        refs = [self._task.remote(self.cwd, fn, job) for job in jobs]
        for i in range(len(refs)):
            [result] = self._get(refs[i:i + 1], outstanding=refs[i:])
            self.pending = refs[i + 1:]  # still cancelled by an abort while the caller handles this result
            yield result

    def on_target(self, fn: Callable[[Any], Any], job: Any) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        pinned = NodeAffinitySchedulingStrategy(self.bench_node, soft=False)
        [(result, node)] = self._get([self._target.options(scheduling_strategy=pinned).remote(fn, job)])
        self.ran_on.append(node)
        return result

    def _get(self, refs: list[Any], outstanding: list[Any] | None = None) -> list[Any]:
        """The results, or the first failed job's own exception (not Ray's wrapper with a remote traceback);
        ``outstanding`` (default ``refs``) is what an abort meanwhile cancels."""
        self.pending = refs if outstanding is None else outstanding
        try:
            results = self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as exc:
            raise (exc.cause if isinstance(exc.cause, Exception) else RuntimeError(str(exc).splitlines()[0])
                   ) from None
        self.pending = []
        return results

    def close(self, abort: bool = False) -> None:
        """Cancel what is still outstanding (``abort``), give it :data:`CANCEL_GRACE_S` to unwind, then kill it;
        disconnect from the cluster when this executor connected."""
        if abort and self.pending:
            for ref in self.pending:
                self.ray.cancel(ref)  # KeyboardInterrupt in the task: temporary folders are removed
            _, stuck = self.ray.wait(self.pending, num_returns=len(self.pending), timeout=CANCEL_GRACE_S)
            for ref in stuck:
                self.ray.cancel(ref, force=True)
        self.pending = []
        if self.owns and self.ray.is_initialized():
            self.ray.shutdown()


def _connect(ray: ModuleType, address: str | None) -> None:
    try:
        ray.init(address=address, log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise TuneError(f"cannot connect to a Ray cluster at --address {address}: {str(exc).splitlines()[0]} "
                        "(start one with `ray start --head`, or give its head as HOST:PORT)") from None


def _bench_node(ray: ModuleType, resource: str) -> tuple[str, float]:
    """Id and CPU count of the first live node that has ``resource``; TuneError (before any work) without one."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(resource, 0) >= 1]
    if not nodes:
        raise TuneError(f"no live node of the Ray cluster has the resource {resource!r}, so latency cannot be measured "
                        f"on the target hardware: start those nodes with `ray start --resources "
                        f"'{{\"{resource}\": 1}}'` (or name their resource with --bench-resource)")
    return nodes[0]["NodeID"], float(nodes[0]["Resources"].get("CPU", 0.0))
