"""Capture what a third-party call prints, at the Python and at the file-descriptor level.

The ONNX exporters print progress lines, graph dumps and C++ diagnostics ("Torch IR graph at
exception") straight to stdout/stderr, which breaks ``--json`` output and ignores ``-q``.
:func:`captured_output` swaps ``sys.stdout``/``sys.stderr`` for in-memory buffers *and* points file
descriptors 1 and 2 at a temporary file for the duration of the block, so output written by C/C++
code is caught too. Everything captured is handed back as text, for error messages and debug logs.

File descriptors are process-wide: while the block runs, output from other threads is captured as
well. The block is meant to wrap a single blocking call (one exporter run).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Captured", "captured_output"]


@dataclass
class Captured:
    """Text captured by :func:`captured_output`; filled in when the block exits (even by raising)."""

    text: str = ""


def _flush_all() -> None:
    """Flush Python's streams and the C stdio buffers so no output crosses the redirection."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def _fd_capture(sink: int) -> Iterator[None]:
    """Point fds 1 and 2 at ``sink`` inside the block; restore the originals afterwards."""
    saved: list[tuple[int, int]] = []
    try:
        for fd in (1, 2):
            try:
                saved.append((fd, os.dup(fd)))
            except OSError:  # fd not open (e.g. a daemon); nothing to redirect
                continue
            os.dup2(sink, fd)
        yield
    finally:
        _flush_all()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


@contextlib.contextmanager
def captured_output() -> Iterator[Captured]:
    """Capture stdout and stderr (Python objects and fds 1/2) of the block.

    Yields
    ------
    Captured
        A :class:`Captured` whose ``text`` holds everything printed (Python output first, then
        fd-level output), available once the block has exited.

    Examples
    --------
    >>> with captured_output() as out:
    ...     print("noise")
    >>> out.text
    'noise\\n'
    """
    captured = Captured()
    buffer = io.StringIO()
    _flush_all()
    with tempfile.TemporaryFile(mode="w+b") as sink:
        try:
            with _fd_capture(sink.fileno()), contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                yield captured
        finally:
            sink.seek(0)
            raw = sink.read().decode("utf-8", errors="replace")
            captured.text = buffer.getvalue() + raw
