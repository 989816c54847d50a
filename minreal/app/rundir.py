"""The run directory: claimed under a lock, written into a staging folder, committed by one rename.

A run (``minreal run``, ``demo``, ``tune``) claims its ``--out`` with an exclusive lock on a sibling ``.NAME.lock``
file, from the check that the directory may be written to the commit, so two runs never write the same directory.
Everything is written into a staging folder beside the target and renamed into place at the end, so a failed run
leaves no half-written output; ``--overwrite`` replaces only an earlier run directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from minreal.export.atomic import make_dirs, remove_empty_dirs

__all__ = ["RunDirClaim", "RunDirError", "RunDirBusyError", "claim_run_dir", "prepare_run_dir", "commit_run_dir"]

log = logging.getLogger(__name__)


class RunDirError(ValueError):
    """The output directory cannot be used as asked."""


class RunDirBusyError(RuntimeError):
    """Another process holds the lock of the output directory (it is writing the same run)."""


@dataclass(frozen=True)
class RunDirClaim:
    """A run directory this process holds the lock of, and the staging folder the run is written into."""

    out_dir: Path
    staging: Path
    overwrite: bool


def _is_run_dir(path: Path) -> bool:
    """A directory minreal wrote: its report.json has this tool's run schema (or it is empty)."""
    if not any(path.iterdir()):
        return True
    try:
        data = json.loads((path / "report.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "schema_version" in data and ("cases" in data or data.get("kind") == "tune")


@contextlib.contextmanager
def claim_run_dir(out_dir: Path, overwrite: bool, inputs: Sequence[Path] = ()) -> Iterator[RunDirClaim]:
    """Hold ``out_dir`` for this process until the block ends, with a staging folder to write the run into.

    Creates the parent folder, takes a non-blocking exclusive lock on ``.NAME.lock`` beside ``out_dir``
    (:class:`RunDirBusyError` if another process holds it), then checks ``out_dir`` may be written
    (:func:`prepare_run_dir`). The lock spans that check and the commit (:func:`commit_run_dir`). On leaving,
    the lock file is removed, and so are an uncommitted staging folder and the parent folders this call
    created that are still empty.
    """
    out_dir = Path(out_dir)
    _check_not_input(out_dir, inputs)
    try:
        created = make_dirs(out_dir.resolve().parent)
    except OSError as exc:
        raise RunDirError(f"cannot write output directory {out_dir}: {exc.strerror or exc}") from None
    try:
        with _locked(out_dir):
            _remove_stale_staging(out_dir)
            staging = prepare_run_dir(out_dir, overwrite, inputs)
            try:
                yield RunDirClaim(out_dir, staging, overwrite)
            finally:
                shutil.rmtree(staging, ignore_errors=True)  # gone already once committed
    finally:
        remove_empty_dirs(created)


def _remove_stale_staging(out_dir: Path) -> None:
    """Staging folders of ``out_dir`` left by a killed run (SIGKILL, power loss): safe to delete once we hold
    the lock, since any run writing into one would hold it."""
    for stale in out_dir.resolve().parent.glob(f".{glob.escape(out_dir.resolve().name)}.staging-*"):
        log.info("removing %s, left by an interrupted run", stale)
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _locked(out_dir: Path) -> Iterator[None]:
    """Hold the lock file of ``out_dir`` for the block, then remove it."""
    lock = out_dir.resolve().with_name(f".{out_dir.resolve().name}.lock")
    fd = _acquire(lock, out_dir)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()
        os.close(fd)


def _acquire(lock: Path, out_dir: Path) -> int:
    """Open and lock ``lock`` without waiting; retry if a finishing holder removed the file meanwhile."""
    busy = RunDirBusyError(f"output directory {out_dir} is being written by another minreal run (lock file {lock} "
                           "is held); wait for it to finish or choose another --out")
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise RunDirError(f"cannot write output directory {out_dir}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise busy from None
        if _same_file(fd, lock):
            return fd
        os.close(fd)
    raise busy


def _same_file(fd: int, path: Path) -> bool:
    try:
        st, here = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def _check_not_input(out_dir: Path, inputs: Sequence[Path]) -> None:
    resolved = out_dir.resolve()
    for path in inputs:
        if resolved == Path(path).resolve() or resolved in Path(path).resolve().parents:
            raise RunDirError(f"output directory {out_dir} contains the input {path}; choose another --out")


def _check_target(out_dir: Path, overwrite: bool) -> None:
    """``out_dir`` is absent, or (with ``overwrite``) an earlier run directory."""
    if out_dir.exists() and not out_dir.is_dir():
        raise RunDirError(f"output path {out_dir} exists and is not a directory")
    if out_dir.exists() and not overwrite:
        raise RunDirError(f"output directory {out_dir} already exists; pass --overwrite to replace it")
    if out_dir.exists() and not _is_run_dir(out_dir):
        raise RunDirError(f"{out_dir} is not a minreal run directory (no run report.json); --overwrite replaces "
                          "only earlier runs, choose another --out")


def prepare_run_dir(out_dir: Path, overwrite: bool, inputs: Sequence[Path] = ()) -> Path:
    """Check that ``out_dir`` may be written and return a fresh staging folder beside it.

    ``--overwrite`` replaces only an earlier run directory (never a folder of other files), and the run
    directory may not contain any of ``inputs``. Call it under :func:`claim_run_dir` (which does), so the
    answer still holds at the commit.
    """
    out_dir = Path(out_dir)
    _check_not_input(out_dir, inputs)
    _check_target(out_dir, overwrite)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    except OSError as exc:
        raise RunDirError(f"cannot write output directory {out_dir}: {exc.strerror or exc}") from None
    mask = os.umask(0)
    os.umask(mask)
    staging.chmod(0o777 & ~mask)  # mkdtemp makes it private; a run directory follows the user's umask
    return staging


def commit_run_dir(claim: RunDirClaim) -> None:
    """Move the finished staging folder onto the run directory (replacing an old run only now).

    ``rename`` silently replaces an empty directory, so the target is checked again first: something
    that is not this tool (which respects the lock) may have created it meanwhile.
    """
    out_dir = claim.out_dir
    _check_target(out_dir, claim.overwrite)
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{int(time.time())}")
        out_dir.rename(old)
        claim.staging.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        claim.staging.rename(out_dir)
