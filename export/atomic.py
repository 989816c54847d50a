"""Folders for the export stages' output, plus a guard against overwriting the input.

The atomic writers themselves live in :mod:`minreal.runtime_bench.atomic` (which never imports torch); every stage
imports :func:`~minreal.runtime_bench.atomic.atomic_path` from there for each file it produces.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from minreal.export.errors import SameFileError

__all__ = ["ensure_distinct", "make_dirs", "remove_empty_dirs"]


def ensure_distinct(path_in: str | os.PathLike[str], path_out: str | os.PathLike[str]) -> None:
    """Raise :class:`SameFileError` if ``path_out`` would overwrite the input ``path_in``."""
    if Path(path_in).resolve() == Path(path_out).resolve():
        raise SameFileError(f"output path {path_out} is the input file; choose a different output path")


def make_dirs(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return the folders this call created, outermost first."""
    created = []
    for path in [*reversed(Path(folder).parents), Path(folder)]:
        if path.is_dir():
            continue
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise
            continue
        created.append(path)
    return created


def remove_empty_dirs(created: Sequence[Path]) -> None:
    """Remove the folders of ``created`` (outermost first, as :func:`make_dirs` returns) that are empty."""
    for path in reversed(created):
        with contextlib.suppress(OSError):
            path.rmdir()
