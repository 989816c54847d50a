"""Statistics passes under ``torch.distributed``: shard the calibration data by rank, all-reduce the sums.

A statistics pass (input second moments, Gramians, activation norms, per-layer errors) takes its *whole*
calibration data, runs on :func:`shard` of it, and reduces its float64 (or int64) accumulators — sums and
counts, or maxima — once at the end with :func:`all_reduce_sum` / :func:`all_reduce_max`, never averages of
averages. Every rank then holds the same reduced statistics and may run the same (identical) decompositions;
only the :func:`is_writer` (rank 0) writes files — cache entries and outputs.

With no process group initialised every helper is a no-op (:func:`shard` returns its argument, the reductions
return their tensor untouched, :func:`is_writer` is true), so a single process computes exactly what it computed
before. A process group is used when one is initialised, by :func:`init_from_env` (a ``torchrun`` launch) or by
the caller (DDP recovery, say): gloo on CPU, NCCL when CUDA is available.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterator
from typing import TypeVar

import torch
import torch.distributed as dist

from .data import Dataset

__all__ = ["TORCHRUN_VARS", "DistributedSetupError", "world", "parallel", "is_writer", "shard_bounds", "shard",
           "all_reduce_sum", "all_reduce_max", "sum_count", "all_agree", "rank_seed", "launched_by_torchrun",
           "default_backend", "init_from_env", "process_group"]

log = logging.getLogger(__name__)

#: Environment variables ``torchrun`` sets for every worker (``env://`` initialisation reads them).
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_REDUCIBLE = (torch.float64, torch.int64)

T = TypeVar("T")


class DistributedSetupError(RuntimeError):
    """The process group cannot be set up, or the data cannot be shared out, as asked; says what to do."""


def world() -> tuple[int, int] | None:
    """``(rank, world size)`` of the initialised default process group, or None when there is none."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


def parallel() -> bool:
    """Whether a process group of more than one rank is initialised (the statistics are then sharded)."""
    w = world()
    return w is not None and w[1] > 1


def is_writer() -> bool:
    """Whether this process writes files: rank 0 of the process group, or a single process."""
    w = world()
    return w is None or w[0] == 0


def shard_bounds(n: int) -> tuple[int, int]:
    """This rank's contiguous ``[start, stop)`` of ``n`` samples; the ranks' ranges, in rank order, tile ``0..n``.

    Raises
    ------
    DistributedSetupError
        fewer samples than processes (a rank would hold none).
    """
    w = world()
    if w is None:
        return 0, n
    rank, size = w
    if n < size:
        raise DistributedSetupError(f"{n} calibration samples cannot be shared out among {size} processes; give "
                                    f"at least {size} samples or run in one process")
    return rank * n // size, (rank + 1) * n // size


def shard(data: T) -> T:
    """This rank's contiguous slice of a :class:`~minreal.compress.core.data.Dataset` or of inputs (tensor or
    :class:`~minreal.compress.core.inputs.NamedInputs`), in the global sample order; ``data`` itself unless
    :func:`parallel`."""
    if not parallel():
        return data
    start, stop = shard_bounds(len(data))  # type: ignore[arg-type]
    if isinstance(data, Dataset):
        return Dataset(data.x[start:stop], None if data.y is None else data.y[start:stop])  # type: ignore[return-value]
    return data[start:stop]  # type: ignore[index]


def _device() -> torch.device:
    """Where collectives run: the current CUDA device for NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _all_reduce(t: torch.Tensor, op: "dist.ReduceOp") -> torch.Tensor:
    if t.dtype not in _REDUCIBLE:
        raise TypeError(f"reduce float64 accumulators (or int64 counts), got {t.dtype}; accumulate with .double()")
    if not parallel():
        return t
    dev = _device()
    buf = t if t.device == dev and t.is_contiguous() else t.to(dev).contiguous()
    dist.all_reduce(buf, op=op)
    if buf is not t:
        t.copy_(buf)
    return t


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` (float64 or int64) over the ranks, in place; returns ``t``. A no-op without a group."""
    return _all_reduce(t, dist.ReduceOp.SUM)


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of ``t`` (float64 or int64) over the ranks, in place; returns ``t``."""
    return _all_reduce(t, dist.ReduceOp.MAX)


def sum_count(n: int) -> int:
    """The sum of an integer count over the ranks (exact, int64)."""
    return int(all_reduce_sum(torch.tensor([n], dtype=torch.int64)).item())


def all_agree(flag: bool) -> bool:
    """True only when ``flag`` is true on every rank (collective: every rank must call it)."""
    return bool(-all_reduce_max(torch.tensor([-int(flag)], dtype=torch.int64)).item())


def rank_seed(seed: int) -> int:
    """``seed`` in one process; a distinct seed per rank under a group (independent random probes per shard)."""
    w = world()
    return seed if w is None else seed + 1_000_003 * w[0]


def launched_by_torchrun() -> bool:
    """Whether the ``torchrun`` environment (:data:`TORCHRUN_VARS`) is present."""
    return all(v in os.environ for v in TORCHRUN_VARS)


def default_backend() -> str:
    """``"nccl"`` when CUDA (and NCCL) is available, else ``"gloo"``."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init_from_env(backend: str | None = None, timeout_s: float = 1800.0) -> tuple[int, int]:
    """Initialise the default process group from the ``torchrun`` environment; returns ``(rank, world size)``.

    Parameters
    ----------
    backend : str | None
        ``"gloo"`` or ``"nccl"``; default :func:`default_backend`. With NCCL the process uses the CUDA
        device ``LOCAL_RANK``.
    timeout_s : float
        how long a collective waits for the other ranks before failing.

    An already initialised group is kept as it is. Call this when the user asks for a distributed run, or when
    :func:`launched_by_torchrun` says the process was started by ``torchrun``.

    Raises
    ------
    DistributedSetupError
        torch.distributed is unavailable or the ``torchrun`` variables are missing.
    """
    w = world()
    if w is not None:
        return w
    if not dist.is_available():
        raise DistributedSetupError("this PyTorch build has no torch.distributed; run in one process")
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise DistributedSetupError(f"a distributed run needs the torchrun environment (missing {', '.join(missing)}); "
                                    "start it as `torchrun --nproc-per-node N ...` or run in one process")
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    rank, size = world()  # type: ignore[misc]
    log.info("process group initialised: rank %d of %d (%s)", rank, size, backend)
    return rank, size


@contextlib.contextmanager
def process_group(backend: str | None = None, timeout_s: float = 1800.0) -> Iterator[tuple[int, int]]:
    """:func:`init_from_env` for a ``with`` block; destroys the group on exit if this block created it."""
    created = world() is None
    w = init_from_env(backend, timeout_s)
    try:
        yield w
        if created:  # every rank done before any tears its connections down (not on error: a peer may be gone)
            dist.barrier()
    finally:
        if created and world() is not None:
            dist.destroy_process_group()
