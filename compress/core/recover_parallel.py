"""The recovery under ``torch.distributed``: how ranks share the data, the statistics and the decisions.

Under ``torch.distributed`` (a process group of more than one rank, from ``torchrun`` and
:func:`minreal.compress.core.distributed.init_from_env`, or set up by the caller) the recovery runs data-parallel.
Every rank passes the same whole data; each epoch draws one seeded permutation, the same on every rank, and cuts it
into the single-process batches of ``batch_size``; each rank trains on its contiguous share of every batch
(``batch_size / world`` samples; when that does not divide, the shares differ by one sample and each rank's loss is
weighted by its share of the batch, so the gradient DistributedDataParallel averages is still the batch's mean); a
batch with fewer samples than ranks is skipped. Two things agree with a single process only in distribution: dropout
masks (each rank draws its own) and the variance normalising a matched feature (each rank's share's). The teacher's
outputs are computed once, for each rank's share of each split only, the held-out objective and metrics are
all-reduced as sums and counts, and every decision (early stopping, the first Ctrl-C) is the same on all ranks.
BatchNorm statistics are *frozen* during the steps (:attr:`RecoveryConfig.freeze_batchnorm`): SyncBatchNorm runs on
GPUs only, and frozen statistics need no collective per layer and no minimum share size; they are re-estimated exactly
over the recalibration set before the first epoch and after each (batches dealt out to the ranks, averages
all-reduced). The recovery writes no files; a caller saving its result does so on
:func:`minreal.compress.core.distributed.is_writer` only. An exception on one rank is logged with its rank and raised;
the others fail at their next collective (at the latest after the process group's timeout), so every rank exits
non-zero.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

import torch
from torch import nn

from .data import Dataset
from .distributed import all_reduce_max, all_reduce_sum, shard, world
from .errors import CompressionError
from .evaluate import eval_mode
from .inputs import Inputs, args_of, call
from .qat import FakeQuant

__all__ = ["world_size", "rank_share", "mean_over_ranks", "data_parallel", "agree_ranges", "StopRequest", "reported",
           "require_same_everywhere"]

log = logging.getLogger("minreal.compress.core.recover")  # the recovery's own logger: one place to configure


def rank_share(train: Dataset, idx: torch.Tensor, refs: torch.Tensor | None
           ) -> tuple[Inputs, torch.Tensor | None, torch.Tensor | None, float]:
    """This rank's contiguous share of the batch ``idx`` of ``train`` (all of it in one process): inputs, labels,
    cached teacher outputs, and the loss weight share/batch × world, so that DistributedDataParallel's average of
    the ranks' gradients is the gradient of the batch's mean loss."""
    mine = shard(idx)
    weight = len(mine) * world_size() / len(idx)
    return train.x[mine], None if train.y is None else train.y[mine], None if refs is None else refs[mine], weight


def world_size() -> int:
    w = world()
    return 1 if w is None else w[1]



def mean_over_ranks(total: float, n: int) -> float:
    """``total / n`` over all ranks (sums all-reduced under a process group)."""
    total, n = all_reduce_sum(torch.tensor([total, n], dtype=torch.float64)).tolist()
    return total / max(n, 1)



def data_parallel(student: nn.Module, probe: Inputs) -> nn.Module:
    """``student`` in DistributedDataParallel under a process group (rank 0's weights and buffers broadcast, its
    buffers again before each step's forward: a few small tensors, equal on every rank anyway since BatchNorm
    statistics are frozen and averaged by the recalibration and fake-quantisation ranges agreed after each step;
    gradients averaged), else itself."""
    if world_size() == 1:
        return student
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(student, find_unused_parameters=_has_unused_parameters(student, probe))


def _has_unused_parameters(model: nn.Module, probe: Inputs) -> bool:
    """Whether a trainable parameter gets no gradient from the output (DDP must then look for them at each step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.enable_grad(), eval_mode(model):
        grads = torch.autograd.grad(call(model, probe).sum(), params, allow_unused=True)
    return any(g is None for g in grads)


def agree_ranges(quant: FakeQuant | None) -> None:
    """Under DDP, each fake-quantised layer's range becomes the union of the ranks' (least minimum, greatest
    maximum). After calibration on the shards that is the exact range over all of them; after a step it is the
    single-process moving average, since every rank moved from the same range towards its share's extremes (only
    within the step each rank quantised with its own share's update)."""
    if quant is None or world_size() == 1:
        return
    lows, highs = quant.range_buffers()
    both = all_reduce_max(torch.cat([-torch.stack(lows), torch.stack(highs)]).double())
    for buf, value in zip(lows + highs, torch.cat([-both[:len(lows)], both[len(lows):]])):
        buf.fill_(value)


class StopRequest:
    """Under DDP, the first SIGINT on any rank ends the training on every rank after the same step: the handler
    only records it, the ranks agree on it after each step (a max all-reduce), and a second SIGINT raises a
    KeyboardInterrupt that aborts (``aborted``)."""

    def __init__(self, active: bool) -> None:
        self.active, self.requested, self.aborted, self.installed = active, False, False, False

    def __enter__(self) -> "StopRequest":
        if self.active and threading.current_thread() is threading.main_thread():
            self.saved, self.installed = signal.signal(signal.SIGINT, self._handle), True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            signal.signal(signal.SIGINT, self.saved)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            self.aborted = True
            raise KeyboardInterrupt
        self.requested = True

    def agreed(self) -> bool:
        """Whether any rank was asked to stop (a collective under DDP: every rank calls it after every step)."""
        if not self.active:
            return False
        return bool(all_reduce_max(torch.tensor([int(self.requested)], dtype=torch.int64)).item())


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Under a process group, log an exception with this rank's number before it propagates."""
    try:
        yield
    except Exception as exc:
        w = world()
        if w is not None and w[1] > 1:
            log.error("recovery failed on rank %d of %d: %s: %s; the other ranks fail at their next collective (at "
                      "the latest after the process group's timeout)", w[0], w[1], type(exc).__name__, exc)
        raise


def require_same_everywhere(data: Dataset, teacher: nn.Module) -> None:
    """Under a process group, refuse different data or originals on the ranks (their shares would not tile one
    dataset): sample counts and float64 checksums of the inputs and of the original's parameters are compared."""
    if world_size() == 1:
        return
    local = torch.tensor([len(data), sum(float(t.double().sum()) for t in args_of(data.x)),
                          sum(float(p.double().sum()) for p in teacher.parameters())], dtype=torch.float64)
    extremes = all_reduce_max(torch.cat([local, -local]))
    if not torch.allclose(extremes[:3], -extremes[3:], rtol=1e-9, atol=0.0, equal_nan=True):
        raise CompressionError("recovery under torch.distributed needs the same whole data and the same original "
                               "model on every rank (each rank takes its share itself), but their sample counts or "
                               "checksums differ; pass every rank all of the data")
