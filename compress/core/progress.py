"""Progress of long loops, reported through logging so that the caller (the CLI) draws the bars.

A record carries ``extra={PROGRESS_KEY: (task, done, total)}``; library code never prints.
"""

from __future__ import annotations

import logging
from typing import Iterable, Iterator, TypeVar

from runtime_bench.facts import PROGRESS_KEY

__all__ = ["PROGRESS_KEY", "log_progress", "tracked"]

T = TypeVar("T")


def log_progress(logger: logging.Logger, task: str, done: int, total: int) -> None:
    """Report that ``done`` of ``total`` steps of ``task`` are finished."""
    logger.info("%s: %d/%d", task, done, total, extra={PROGRESS_KEY: (task, done, total)})


def tracked(items: Iterable[T], total: int, task: str, logger: logging.Logger) -> Iterator[T]:
    """Yield ``items`` and report progress after each one."""
    for i, item in enumerate(items, 1):
        yield item
        log_progress(logger, task, i, total)
