"""Progress of long loops, reported through logging so that the caller (the CLI) draws the bars.

A record carries ``extra={PROGRESS_KEY: (task, done, total)}``, and a record worth a line of its own (an epoch's
losses) also ``extra={DETAIL_KEY: text}``, with the text in its message too; library code never prints.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TypeVar

from minreal.facts import DETAIL_KEY, PROGRESS_KEY

__all__ = ["log_progress", "tracked"]

T = TypeVar("T")

def log_progress(logger: logging.Logger, task: str, done: int, total: int, detail: str = "") -> None:
    """Report that ``done`` of ``total`` steps of ``task`` are finished; ``detail``: what the step ended with."""
    extra: dict[str, object] = {PROGRESS_KEY: (task, done, total)}
    if detail:
        extra[DETAIL_KEY] = detail
        logger.info("%s: %d/%d: %s", task, done, total, detail, extra=extra)
    else:
        logger.info("%s: %d/%d", task, done, total, extra=extra)


def tracked(items: Iterable[T], total: int, task: str, logger: logging.Logger) -> Iterator[T]:
    """Yield ``items`` and report progress after each one."""
    for i, item in enumerate(items, 1):
        yield item
        log_progress(logger, task, i, total)
