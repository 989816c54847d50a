"""Atomic file output for the export stages, plus a guard against overwriting the input.

The atomic writers live in :mod:`runtime_bench.atomic` (which never imports torch) and are
re-exported here, so ``from export.atomic import atomic_path`` keeps working. Other stages reuse
:func:`atomic_path` for every file they produce.
"""

from __future__ import annotations

import os
from pathlib import Path

from export.errors import SameFileError
from runtime_bench.atomic import atomic_path, atomic_write_bytes, atomic_write_text

__all__ = ["SameFileError", "atomic_path", "atomic_write_bytes", "atomic_write_text", "ensure_distinct"]


def ensure_distinct(path_in: str | os.PathLike[str], path_out: str | os.PathLike[str]) -> None:
    """Raise :class:`SameFileError` if ``path_out`` would overwrite the input ``path_in``."""
    if Path(path_in).resolve() == Path(path_out).resolve():
        raise SameFileError(f"output path {path_out} is the input file; choose a different output path")
