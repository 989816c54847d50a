"""The metrics of :func:`minreal.compress.core.recover.held_out_metrics` from two models' outputs: agreement and KL
for classifiers, MSE to the original otherwise, accuracy or MSE with labels, sums and counts all-reduced under a
process group; and the task (classification or regression) they are judged as."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .data import Dataset
from .distributed import all_reduce_sum
from .evaluate import predict

__all__ = ["output_metrics", "held_out_of", "resolve_task"]


def _has_class_labels(y: torch.Tensor | None) -> bool:
    return y is not None and y.dtype in (torch.int64, torch.int32)


def resolve_task(task: str, y: torch.Tensor | None, out: torch.Tensor) -> str:
    """``classification`` or ``regression`` for ``task`` (see :attr:`RecoveryConfig.task`), from the labels ``y``
    when there are any, else from the shape of the original's outputs ``out``."""
    if task != "auto":
        return task
    if y is not None:
        return "classification" if _has_class_labels(y) else "regression"
    return "classification" if out.dim() == 2 and out.shape[1] > 1 else "regression"


def _metric_sums(ref: torch.Tensor, out: torch.Tensor, y: torch.Tensor | None, task: str
                 ) -> dict[str, tuple[float, int]]:
    """Each metric of :func:`~minreal.compress.core.recover.held_out_metrics` as (sum, count): its value is
    sum / count, over any union of parts."""
    ref, out = ref.double(), out.double()
    sums: dict[str, tuple[float, int]] = {}
    if resolve_task(task, y, ref) == "classification":
        sums["agreement"] = (float((out.argmax(1) == ref.argmax(1)).double().sum()), len(out))
        sums["kl"] = (float(F.kl_div(F.log_softmax(out, 1), F.log_softmax(ref, 1), log_target=True,
                                     reduction="sum")), len(out))
    else:
        sums["mse_to_original"] = (float(((out - ref) ** 2).sum()), out.numel())
    if _has_class_labels(y) and out.dim() == 2:
        sums["accuracy"] = (float((out.argmax(1) == y).double().sum()), len(out))
    elif y is not None:
        sums["mse"] = (float(((out - y.double().reshape(out.shape)) ** 2).sum()), out.numel())
    return sums


def output_metrics(ref: torch.Tensor, out: torch.Tensor, y: torch.Tensor | None, task: str) -> dict[str, float]:
    """:func:`~minreal.compress.core.recover.held_out_metrics` from the two models' outputs ``ref`` and ``out`` (all
    ranks' parts together)."""
    sums = _metric_sums(ref, out, y, task)
    totals = all_reduce_sum(torch.tensor([v for pair in sums.values() for v in pair], dtype=torch.float64))
    return {name: float(totals[2 * i] / totals[2 * i + 1]) for i, name in enumerate(sums)}


def held_out_of(teacher: nn.Module, student: nn.Module, data: Dataset, task: str, refs: torch.Tensor | None,
                outputs: torch.Tensor | None = None) -> dict[str, float]:
    """:func:`~minreal.compress.core.recover.held_out_metrics`, taking the teacher's outputs ``refs`` and the
    student's ``outputs`` where already known (None: predicted here)."""
    refs = predict(teacher, data) if refs is None else refs
    return output_metrics(refs, predict(student, data) if outputs is None else outputs, data.y, task)
