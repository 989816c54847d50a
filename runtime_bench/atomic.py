"""Atomic file output: write to a temporary file in the destination folder, then ``os.replace``.

A reader never sees a half-written file, and a writer that raises leaves nothing behind. The
written file gets the usual permissions (``0o666`` less the process umask), not ``mkstemp``'s 0600.
This module imports only the standard library; :mod:`export.atomic` re-exports it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text"]

logger = logging.getLogger(__name__)


def _current_umask() -> int:
    """Return the process umask without changing it for longer than one call."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove_quietly(path: Path) -> None:
    """Delete ``path`` and a sidecar external-data file a writer may have left next to it."""
    for leftover in (path, path.with_name(path.name + ".data")):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it onto ``path`` when the block succeeds.

    The temporary file lives in the same folder (so ``os.replace`` is atomic) and keeps the
    destination's suffix (so tools that infer a format from it behave). If the block raises, the
    temporary file (and a ``.data`` sidecar next to it) is deleted and ``path`` is left untouched.

    Args:
        path: final destination; its parent folder must exist.

    Yields:
        The temporary path to write to (it exists, empty, when the block starts).

    Example:
        >>> with atomic_path("model.onnx") as tmp:  # doctest: +SKIP
        ...     onnx.save(model, tmp)
    """
    final = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=f".tmp{final.suffix}", dir=final.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, final)
    except BaseException:
        _remove_quietly(tmp)
        raise
    logger.debug("wrote %s atomically", final)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and return the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (``encoding``, default UTF-8) and return the path."""
    return atomic_write_bytes(path, text.encode(encoding))
