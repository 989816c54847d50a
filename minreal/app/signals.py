"""Signals of the command line: SIGTERM becomes :class:`Terminated`, raised in the main thread, so a terminated
command removes what it had started to write exactly as Ctrl-C (KeyboardInterrupt) does."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Terminated", "sigterm_raises"]


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so the same cleanup runs as for Ctrl-C (KeyboardInterrupt)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` in the main thread; the previous handler is put
    back afterwards. Outside the main thread (where Python cannot install handlers) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
