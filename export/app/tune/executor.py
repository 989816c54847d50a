"""How tune candidates run: a small executor interface, so a distributed engine can take over later.

An executor maps a picklable function over jobs and returns the results in order. :class:`ProcessExecutor`
(the default) runs them in local worker processes that stay alive across rounds (each loads the model once);
:class:`InlineExecutor` runs them in this process (the Python API with objects in memory, and tests).
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Protocol, Sequence

__all__ = ["Executor", "InlineExecutor", "ProcessExecutor"]


class Executor(Protocol):
    """``map(fn, jobs)`` → results in the order of ``jobs``; ``close()`` releases the workers."""

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]: ...

    def close(self) -> None: ...


class InlineExecutor:
    """Runs every job in this process, one after the other."""

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]:
        return [fn(job) for job in jobs]

    def close(self) -> None:
        return None


class ProcessExecutor:
    """``workers`` local processes (spawned: no state inherited from the parent), reused across rounds."""

    def __init__(self, workers: int = 1) -> None:
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]:
        return list(self.pool.map(fn, jobs))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
