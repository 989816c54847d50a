"""Training and distillation loop shared by the methods that train (seeded, early stopping, progress).

References
----------
.. [1] Hinton et al. (2015), eq. 1–2: the distillation loss of :func:`distillation_loss` and its mix with the task loss.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .data import Dataset
from .inputs import call
from .progress import log_progress

__all__ = ["TrainConfig", "TrainResult", "TrainHooks", "train", "task_loss", "distillation_loss", "ProgressFn"]

log = logging.getLogger(__name__)
ProgressFn = Callable[[int, int, dict], None]  # (epoch, total epochs, metrics)


@dataclass
class TrainConfig:
    """Optimiser schedule; ``alpha``/``temperature`` apply only when a teacher is given.

    Notes
    -----
    The names ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``patience``, ``alpha``, ``temperature`` and
    ``seed`` are :class:`minreal.compress.core.recover_options.RecoveryConfig`'s too, for another loop and not the
    same facts: ``alpha`` weighs the distillation here (``alpha·distillation + (1 - alpha)·labels``, Hinton et al.
    eq. 1) and the labels there, ``weight_decay`` is Adam's L2 term here and AdamW's decoupled decay there, and the
    defaults of ``epochs``, ``lr``, ``patience`` and ``alpha`` differ (training from scratch, not a recovery of
    trained weights). They are declared in each on purpose (its docstring says the same).
    """

    epochs: int = 30
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    patience: int = 8
    alpha: float = 0.7
    temperature: float = 4.0
    seed: int = 0


@dataclass
class TrainResult:
    """Best validation loss/metric and the per-epoch history."""

    best_epoch: int
    best_val_loss: float
    history: list[dict] = field(default_factory=list)


def task_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer labels, mean squared error otherwise."""
    if y.dtype in (torch.int64, torch.int32):
        return F.cross_entropy(out, y)
    return F.mse_loss(out, y.reshape(out.shape).to(out.dtype))


def distillation_loss(out: torch.Tensor, teacher_out: torch.Tensor, temperature: float,
                      classifier: bool) -> torch.Tensor:
    """Hinton et al. (2015) eq. 2: T²·KL(p_T ‖ q_T) on softened logits for a classifier; MSE to the teacher
    otherwise."""
    if not classifier:
        return F.mse_loss(out, teacher_out)
    t = temperature
    kl = F.kl_div(F.log_softmax(out / t, 1), F.log_softmax(teacher_out / t, 1), log_target=True,
                  reduction="batchmean")
    return kl * t * t


def _distill_loss(out: torch.Tensor, teacher_out: torch.Tensor, y: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """Hinton et al. (2015) eq. 1: α·distillation + (1 − α)·task loss; integer labels make it a classifier."""
    classifier = y.dtype in (torch.int64, torch.int32)
    return (cfg.alpha * distillation_loss(out, teacher_out, cfg.temperature, classifier)
            + (1 - cfg.alpha) * task_loss(out, y))


class TrainHooks:
    """Callbacks of :func:`train`, e.g. a regulariser whose weight follows a schedule or a controller; subclass and
    override what you need (the defaults add nothing, watch nothing and allow every epoch)."""

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        """A term added to this step's loss (None: nothing to add)."""
        return None

    def after_step(self, out: torch.Tensor, y: torch.Tensor, loss: torch.Tensor,
                   extra: torch.Tensor | None) -> None:
        """Sees every step's outputs, targets, task loss and extra term (e.g. for running metrics)."""

    def after_epoch(self, model: nn.Module, epoch: int, val_loss: float) -> bool:
        """Called after each epoch's validation; returns whether the epoch may be selected (the weights
        :func:`train` keeps are those of the best selectable epoch, or of the last epoch if none is)."""
        return True


class _ExtraLoss(TrainHooks):
    """The hooks of a plain ``extra_loss`` callable."""

    def __init__(self, loss: Callable[[nn.Module], torch.Tensor]) -> None:
        self.loss = loss

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        return self.loss(model)


@torch.no_grad()
def _val_loss(model: nn.Module, val: Dataset, batch_size: int) -> float:
    model.eval()
    total, n = 0.0, 0
    for xb, yb in val.batches(batch_size):
        total += float(task_loss(call(model, xb), yb)) * len(xb)
        n += len(xb)
    return total / max(n, 1)


def train(model: nn.Module, data: Dataset, val: Dataset | None, cfg: TrainConfig,
          teacher: nn.Module | None = None, extra_loss: Callable[[nn.Module], torch.Tensor] | None = None,
          progress: ProgressFn | None = None, *, hooks: TrainHooks | None = None) -> TrainResult:
    """Train ``model`` in place with Adam and a cosine learning rate; keep the weights of the best validation epoch
    (early stopping after ``cfg.patience`` epochs without a better one).

    ``extra_loss(model)`` (e.g. a regulariser) is added to every step's loss; ``hooks`` (not with ``extra_loss``)
    add a term to every step's loss, see every step, and decide which epochs may be selected
    (:class:`TrainHooks`); with hooks and no selectable epoch the last epoch's weights are kept, and only selectable
    epochs count towards early stopping.
    """
    if data.y is None:
        raise ValueError("training needs labelled data (targets y)")
    if extra_loss is not None:
        if hooks is not None:
            raise ValueError("give extra_loss or hooks (whose extra_loss it would be), not both")
        hooks = _ExtraLoss(extra_loss)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(cfg.epochs, 1))
    if teacher is not None:
        teacher.eval()
    best = TrainResult(-1, float("inf"))
    best_state = copy.deepcopy(model.state_dict())
    for epoch in range(cfg.epochs):
        model.train()
        for xb, yb in data.batches(cfg.batch_size, shuffle=True, generator=gen):
            out = call(model, xb)
            if teacher is None:
                loss = task_loss(out, yb)
            else:
                with torch.no_grad():
                    t_out = call(teacher, xb)
                loss = _distill_loss(out, t_out, yb, cfg)
            extra = hooks.extra_loss(model) if hooks is not None else None
            opt.zero_grad(set_to_none=True)
            (loss if extra is None else loss + extra).backward()
            opt.step()
            if hooks is not None:
                hooks.after_step(out.detach(), yb, loss.detach(), None if extra is None else extra.detach())
        sched.step()
        vl = _val_loss(model, val if val is not None else data, cfg.batch_size)
        best.history.append({"epoch": epoch, "val_loss": vl})
        log_progress(log, "training (epochs)", epoch + 1, cfg.epochs)
        if progress is not None:
            progress(epoch + 1, cfg.epochs, {"val_loss": vl})
        if hooks is not None and not hooks.after_epoch(model, epoch, vl):
            continue
        if vl < best.best_val_loss:
            best.best_epoch, best.best_val_loss = epoch, vl
            best_state = copy.deepcopy(model.state_dict())
        elif epoch - best.best_epoch >= cfg.patience:
            log.info("early stop at epoch %d (best %d)", epoch, best.best_epoch)
            log_progress(log, "training (epochs)", cfg.epochs, cfg.epochs)
            break
    if best.best_epoch >= 0 or hooks is None:
        model.load_state_dict(best_state)
    else:
        best.best_epoch, best.best_val_loss = len(best.history) - 1, best.history[-1]["val_loss"]
    model.eval()
    return best


