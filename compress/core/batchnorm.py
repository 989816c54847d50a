"""BatchNorm running statistics re-estimated exactly over a data set (:func:`recalibrate_batchnorm`), also under a
process group (batches dealt out to the ranks, the averages all-reduced). Used after each recovery epoch."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .data import Dataset
from .distributed import all_reduce_sum, world
from .inputs import call

__all__ = ["recalibrate_batchnorm"]


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, data: Dataset, batch_size: int) -> None:
    """Re-estimate BatchNorm running statistics as exact averages over ``data`` (momentum=None), then eval. A last
    batch of one sample (which BatchNorm cannot normalise in training mode) joins the one before.

    Under a process group ``data`` is the whole data on every rank: the batches are dealt out to the ranks in
    turn and each layer's averages, weighted by its number of batches, are all-reduced (the same statistics)."""
    if len(data) > 1 and len(data) % batch_size == 1:
        batch_size += 1
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    if not bns:
        return
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    rank, size = world() or (0, 1)
    try:
        for idx in torch.arange(len(data)).split(batch_size)[rank::size]:
            call(model, data.x[idx])
    finally:
        for m, momentum in zip(bns, saved):
            m.momentum = momentum
        model.eval()
    if size > 1:
        _average_batchnorm([m for m in bns if m.running_mean is not None])


def _average_batchnorm(bns: list[_BatchNorm]) -> None:
    """Each rank's cumulative averages over its own k batches, weighted by k and all-reduced: the average over
    every rank's batches (a rank with none contributes nothing)."""
    counts = torch.tensor([float(m.num_batches_tracked) for m in bns], dtype=torch.float64)
    parts = [torch.cat([m.running_mean, m.running_var]).double() * k for m, k in zip(bns, counts)]
    flat = all_reduce_sum(torch.cat([counts, *parts]))
    offset = len(bns)
    for m, k in zip(bns, flat[:len(bns)]):
        n = m.running_mean.numel()
        block = flat[offset:offset + 2 * n] / k.clamp_min(1)
        offset += 2 * n
        m.running_mean.copy_(block[:n])
        m.running_var.copy_(block[n:])
        m.num_batches_tracked.fill_(int(k))
