"""How tune candidates run: a small executor interface, so a distributed engine can take over later.

An executor maps a picklable function over jobs and returns the results in order. :class:`ProcessExecutor`
(the default) runs them in local worker processes that stay alive across rounds (each loads the model once) and
ignore Ctrl-C: the parent alone decides, and on an interrupt it terminates them (a job cut short is never
cached). :class:`InlineExecutor` runs them in this process (the Python API with objects in memory, tests).
"""

from __future__ import annotations

import multiprocessing
import signal
from typing import Any, Callable, Protocol, Sequence

__all__ = ["Executor", "InlineExecutor", "ProcessExecutor"]


class Executor(Protocol):
    """``map(fn, jobs)`` → results in the order of ``jobs``; ``close(abort)`` releases the workers (``abort``:
    at once, dropping running jobs)."""

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]: ...

    def close(self, abort: bool = False) -> None: ...


class InlineExecutor:
    """Runs every job in this process, one after the other."""

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]:
        return [fn(job) for job in jobs]

    def close(self, abort: bool = False) -> None:
        return None


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessExecutor:
    """``workers`` local processes (spawned: no state inherited from the parent), reused across rounds."""

    def __init__(self, workers: int = 1) -> None:
        self.pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_ignore_interrupts)

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]:
        return self.pool.map_async(fn, jobs, chunksize=1).get()

    def close(self, abort: bool = False) -> None:
        if abort:
            self.pool.terminate()
        else:
            self.pool.close()
        self.pool.join()
