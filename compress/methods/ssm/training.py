"""Seeded training of the SSM classifier with the Hankel regulariser (shared by demo/benchmarks).

The regulariser is the full Hankel nuclear norm or, with a target order / state budget, only its tail
(:func:`hankel_regulariser`). Its weight can follow a schedule (zero for a warm-up fraction of the epochs, then a
linear ramp) and, in target mode, a controller per layer: after every epoch at the full scheduled weight, layer l's
weight is multiplied by tail_l / target_tail, clipped to [1/``gain``, ``gain``], where tail_l = Σ_{i>r} σ_i / Σ σ_i
is its measured tail energy and target_tail = 1 − ``target_energy`` (proportional in log w: up while above the
target, down while below), so the weight needs no grid search, only a starting value, and a layer that meets its
target early is not squeezed further for the sake of a slower one.
Every epoch is reported (weights, losses, train/validation accuracy, per-layer tail energy).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ...core.data import Dataset
from ...core.progress import log_progress
from ...core.train import ProgressFn, task_loss
from .classifier import SSMClassifier, hankel_regulariser, rotation_layers, tail_energies

__all__ = ["HankelRegularisation", "SSMTrainSpec", "SSMEpoch", "SSMTrainResult", "scheduled_weight",
           "controlled_weight", "train_ssm_classifier"]

log = logging.getLogger(__name__)
Penalty = Callable[[nn.Module], torch.Tensor]


@dataclass(frozen=True)
class HankelRegularisation:
    """What the regulariser penalises and how its weight evolves.

    ``target_order`` (r per layer) or ``state_budget`` (total r, equal energy) makes it tail-only (Σ_{i>r} σ_i, or
    the tail energy with ``relative``); with neither, the full nuclear norm. ``warmup`` and ``ramp`` are fractions of
    the epochs (weight 0, then linear up to the weight). ``target_energy`` (needs a target) turns on the controller:
    keep at least this fraction of Σσ in the r states, the weight changed by at most a factor ``gain`` per epoch.
    """

    target_order: int | None = None
    state_budget: int | None = None
    relative: bool = False
    warmup: float = 0.0
    ramp: float = 0.0
    target_energy: float | None = None
    gain: float = 2.0

    def __post_init__(self) -> None:
        if self.target_order is not None and self.state_budget is not None:
            raise ValueError("give target_order (per layer) or state_budget (total), not both")
        if not (0.0 <= self.warmup and 0.0 <= self.ramp and self.warmup + self.ramp <= 1.0):
            raise ValueError(f"warmup and ramp are fractions of the epochs (>= 0, sum <= 1), got {self.warmup}, "
                             f"{self.ramp}")
        if self.target_energy is not None:
            if not 0.0 < self.target_energy < 1.0:
                raise ValueError(f"target_energy is the kept fraction of Σσ, in (0, 1), got {self.target_energy}")
            if self.target_order is None and self.state_budget is None:
                raise ValueError("target_energy needs target_order or state_budget (the r states it refers to)")
        if not self.gain > 1.0:
            raise ValueError(f"the controller gain must be > 1, got {self.gain}")

    @property
    def has_target(self) -> bool:
        return self.target_order is not None or self.state_budget is not None


@dataclass(frozen=True)
class SSMTrainSpec:
    """Architecture and schedule; ``reg_weight`` = 0 trains without the regulariser (in target mode it is the
    controller's starting weight); ``regularisation`` None is the full nuclear norm at a constant weight."""

    features: int = 24
    state: int = 32
    depth: int = 2
    reg_weight: float = 3e-3
    epochs: int = 8
    batch_size: int = 64
    lr: float = 5e-3
    seed: int = 0
    regularisation: HankelRegularisation | None = None


@dataclass
class SSMEpoch:
    """One epoch: the largest layer weight and every layer's, mean task loss and penalty, accuracies, per-layer tail
    energy at the targets."""

    epoch: int
    weight: float
    train_loss: float
    penalty: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float
    tail_energy: dict[str, float] = field(default_factory=dict)
    orders: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    layer_weights: dict[str, float] = field(default_factory=dict)


@dataclass
class SSMTrainResult:
    """Per-epoch history and the epoch whose weights the model holds (see :func:`train_ssm_classifier`);
    ``final_weights`` are the controller's layer weights after the last epoch, ``final_weight`` the largest."""

    selected_epoch: int
    final_weight: float
    history: list[SSMEpoch] = field(default_factory=list)
    final_weights: dict[str, float] = field(default_factory=dict)


def scheduled_weight(epoch: int, epochs: int, weight: float, warmup: float, ramp: float) -> float:
    """Weight of epoch k (0-based): 0 for k < W = round(warmup·E), then weight·min(1, (k − W + 1)/R) with
    R = round(ramp·E) (R = 0: the full weight at once)."""
    start, length = round(warmup * epochs), round(ramp * epochs)
    if epoch < start:
        return 0.0
    return weight if length == 0 else weight * min(1.0, (epoch - start + 1) / length)


def controlled_weight(weight: float, tail: float, target_tail: float, gain: float) -> float:
    """One controller step, proportional in log w: w · clip(tail / target_tail, 1/gain, gain) (up while the
    measured tail energy is above the target tail, down while below, unchanged on target)."""
    return weight * min(gain, max(1.0 / gain, tail / target_tail))


def _train_epoch(model: SSMClassifier, data: Dataset, opt: torch.optim.Optimizer, batch_size: int,
                 gen: torch.Generator, penalty: Penalty | None) -> tuple[float, float, float]:
    """One pass of Adam over shuffled batches; (mean task loss, mean penalty, running train accuracy)."""
    model.train()
    loss_sum, pen_sum, correct, n = 0.0, 0.0, 0, 0
    for xb, yb in data.batches(batch_size, shuffle=True, generator=gen):
        out = model(xb)
        loss = task_loss(out, yb)
        pen = penalty(model) if penalty is not None else torch.zeros(())
        opt.zero_grad(set_to_none=True)
        (loss + pen).backward()
        opt.step()
        loss_sum, pen_sum = loss_sum + float(loss.detach()) * len(xb), pen_sum + float(pen.detach()) * len(xb)
        correct, n = correct + int((out.detach().argmax(1) == yb).sum()), n + len(xb)
    return loss_sum / n, pen_sum / n, correct / n


@torch.no_grad()
def _evaluate(model: SSMClassifier, data: Dataset, batch_size: int) -> tuple[float, float]:
    """(mean task loss, accuracy) in eval mode."""
    model.eval()
    loss_sum, correct = 0.0, 0
    for xb, yb in data.batches(batch_size):
        out = model(xb)
        loss_sum += float(task_loss(out, yb)) * len(xb)
        correct += int((out.argmax(1) == yb).sum())
    return loss_sum / len(data), correct / len(data)


def _penalty(reg: HankelRegularisation, weights: dict[str, float]) -> Penalty | None:
    """The step's regulariser at the layer ``weights`` (None when all are 0: nothing to compute)."""
    if not any(w > 0 for w in weights.values()):
        return None
    return lambda m: hankel_regulariser(m, weights, target_order=reg.target_order, state_budget=reg.state_budget,
                                        relative=reg.relative)


def _run_epoch(model: SSMClassifier, data: Dataset, val: Dataset, opt: torch.optim.Optimizer, gen: torch.Generator,
               spec: SSMTrainSpec, reg: HankelRegularisation, epoch: int, weights: dict[str, float]) -> SSMEpoch:
    """Train one epoch at the layer ``weights``, then measure validation loss/accuracy and the tail energies."""
    t0 = time.perf_counter()
    train_loss, pen, train_acc = _train_epoch(model, data, opt, spec.batch_size, gen, _penalty(reg, weights))
    val_loss, val_acc = _evaluate(model, val, spec.batch_size)
    tails, orders = tail_energies(model, reg.target_order, reg.state_budget) if reg.has_target else ({}, {})
    return SSMEpoch(epoch, max(weights.values(), default=0.0), train_loss, pen, train_acc, val_loss, val_acc, tails,
                    orders, time.perf_counter() - t0, dict(weights))


def _eligible(rec: SSMEpoch, full_weight: bool, reg: HankelRegularisation) -> bool:
    """An epoch may be selected once the schedule has reached its weight and, in target mode, the target is met."""
    meets = reg.target_energy is None or max(rec.tail_energy.values(), default=0.0) <= 1 - reg.target_energy
    return full_weight and meets


def train_ssm_classifier(train_data: Dataset, val: Dataset | None, spec: SSMTrainSpec,
                         progress: ProgressFn | None = None) -> tuple[SSMClassifier, SSMTrainResult]:
    """Build (seeded) and train an :class:`SSMClassifier` with Adam and a cosine learning rate; returns it in eval
    mode with its per-epoch history.

    The model keeps the weights of the best-validation-loss epoch among the eligible ones: the schedule has reached
    its full weight and, in target mode, the measured tail energy meets the target (the last epoch if none is).
    With a constant weight every epoch is eligible (plain best-validation selection).
    """
    torch.manual_seed(spec.seed)
    reg = spec.regularisation or HankelRegularisation()
    if reg.target_energy is not None and not spec.reg_weight > 0:
        raise ValueError("target mode needs a starting reg_weight > 0 (the controller scales it)")
    model = SSMClassifier(train_data.x.shape[-1], spec.features, spec.state, spec.depth, int(train_data.y.max()) + 1)
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.Adam(model.parameters(), lr=spec.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(spec.epochs, 1))
    base = {name: spec.reg_weight for name in rotation_layers(model)}
    result, best = SSMTrainResult(spec.epochs - 1, spec.reg_weight), None
    for epoch in range(spec.epochs):
        ramp = scheduled_weight(epoch, spec.epochs, 1.0, reg.warmup, reg.ramp)
        weights = {name: ramp * w for name, w in base.items()}
        rec = _run_epoch(model, train_data, val if val is not None else train_data, opt, gen, spec, reg, epoch,
                         weights)
        sched.step()
        result.history.append(rec)
        full = spec.reg_weight <= 0 or ramp >= 1.0
        if _eligible(rec, full, reg) and (best is None or rec.val_loss < best[0]):
            best = (rec.val_loss, epoch, copy.deepcopy(model.state_dict()))
        if reg.target_energy is not None and full:
            base = {name: controlled_weight(w, rec.tail_energy[name], 1 - reg.target_energy, reg.gain)
                    for name, w in base.items()}
        log_progress(log, "training (epochs)", epoch + 1, spec.epochs)
        if progress is not None:
            progress(epoch + 1, spec.epochs, {"val_loss": rec.val_loss, "val_accuracy": rec.val_accuracy,
                                              "weight": rec.weight})
    if best is not None:
        result.selected_epoch = best[1]
        model.load_state_dict(best[2])
    result.final_weights, result.final_weight = base, max(base.values(), default=0.0)
    return model.eval(), result
