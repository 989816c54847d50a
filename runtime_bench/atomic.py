"""Atomic file output: write to a temporary file in the destination folder, then ``os.replace``.

A reader never sees a half-written file, and a writer that raises leaves nothing behind. The
written file gets the usual permissions (``0o666`` less the process umask), not ``mkstemp``'s 0600.
This module imports only the standard library, and every layer above imports its writers from here.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["OutputWriteError", "atomic_path", "atomic_write_bytes", "atomic_write_text", "write_error"]

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


#: errno → what the user can do about a failed write.
_WRITE_HINTS = {
    errno.EACCES: "check the folder's permissions or choose another output path",
    errno.EPERM: "check the folder's permissions or choose another output path",
    errno.EROFS: "the file system is read-only; choose another output path",
    errno.ENOSPC: "free disk space or choose another output path",
    errno.EDQUOT: "the disk quota is exceeded; free space or choose another output path",
    errno.EFBIG: "the file is too large for this file system; choose another output path",
}


class OutputWriteError(OSError):
    """An output file could not be written; the one-line message names the file, the cause and what to do."""

    def __str__(self) -> str:  # OSError would prefix "[Errno N]" and append the file name again
        return str(self.strerror)


def write_error(final: Path, exc: OSError) -> OutputWriteError:
    """The one-line :class:`OutputWriteError` for ``exc`` raised while writing ``final`` (what failed, what to do)."""
    hint = _WRITE_HINTS.get(exc.errno or 0, "choose another output path")
    return OutputWriteError(exc.errno, f"cannot write {final}: {exc.strerror or exc}; {hint}", str(final))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it onto ``path`` when the block succeeds.

    The temporary file lives in the same folder (so ``os.replace`` is atomic) and keeps the
    destination's suffix (so tools that infer a format from it behave). If the block raises, the
    temporary file (and a ``.data`` sidecar next to it) is deleted and ``path`` is left untouched.

    Parameters
    ----------
    path : str | os.PathLike[str]
        final destination; its parent folder must exist.

    Yields
    ------
    Path
        The temporary path to write to (it exists, empty, when the block starts).

    Raises
    ------
    OutputWriteError
        creating, filling or moving the file failed for lack of permission, space or a
        writable file system (errno EACCES, EPERM, EROFS, ENOSPC, EDQUOT, EFBIG); the message names ``path``.

    Examples
    --------
    >>> with atomic_path("model.onnx") as tmp:  # doctest: +SKIP
    ...     onnx.save(model, tmp)
    """
    final = Path(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=f".tmp{final.suffix}", dir=final.parent)
    except OSError as exc:
        raise write_error(final, exc) from exc
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, final)
    except OSError as exc:
        _remove_quietly(tmp)
        if exc.errno in _WRITE_HINTS and not isinstance(exc, OutputWriteError):
            raise write_error(final, exc) from exc
        raise
    except BaseException:
        _remove_quietly(tmp)
        raise
    logger.debug("wrote %s atomically", final)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and return the path."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (``encoding``, default UTF-8) and return the path."""
    return atomic_write_bytes(path, text.encode(encoding))
