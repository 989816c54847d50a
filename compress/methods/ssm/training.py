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

import logging
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ...core.data import Dataset
from ...core.evaluate import predict
from ...core.train import ProgressFn, TrainConfig, TrainHooks, train
from .classifier import SSMClassifier, hankel_regulariser, rotation_layers, tail_energies

__all__ = ["HankelRegularisation", "SSMTrainSpec", "SSMEpoch", "SSMTrainResult", "scheduled_weight",
           "controlled_weight", "train_ssm_classifier"]

log = logging.getLogger(__name__)


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


class _HankelHooks(TrainHooks):
    """:class:`~minreal.compress.core.train.TrainHooks` of :func:`train_ssm_classifier`: the scheduled (and controlled)
    layer weights of the penalty, running train accuracy and mean penalty, the per-epoch record and eligibility."""

    def __init__(self, model: SSMClassifier, spec: SSMTrainSpec, reg: HankelRegularisation, val: Dataset) -> None:
        self.spec, self.reg, self.val = spec, reg, val
        self.base = {name: spec.reg_weight for name in rotation_layers(model)}
        self.history: list[SSMEpoch] = []
        self._start(0)

    def _start(self, epoch: int) -> None:
        self.ramp = scheduled_weight(epoch, self.spec.epochs, 1.0, self.reg.warmup, self.reg.ramp)
        self.weights = {name: self.ramp * w for name, w in self.base.items()}
        self.sums, self.t0 = [0.0, 0.0, 0, 0], time.perf_counter()  # task loss, penalty, correct, samples

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        if not any(w > 0 for w in self.weights.values()):
            return None
        reg = self.reg
        return hankel_regulariser(model, self.weights, target_order=reg.target_order, state_budget=reg.state_budget,
                                  relative=reg.relative)

    def after_step(self, out: torch.Tensor, y: torch.Tensor, loss: torch.Tensor, extra: torch.Tensor | None) -> None:
        n, s = len(y), self.sums
        s[0], s[1] = s[0] + float(loss) * n, s[1] + (0.0 if extra is None else float(extra) * n)
        s[2], s[3] = s[2] + int((out.argmax(1) == y).sum()), s[3] + n

    def after_epoch(self, model: nn.Module, epoch: int, val_loss: float) -> bool:
        """Record the epoch, say whether it may be selected, then step the controller and the schedule."""
        reg, (loss, pen, correct, n) = self.reg, self.sums
        tails, orders = tail_energies(model, reg.target_order, reg.state_budget) if reg.has_target else ({}, {})
        rec = SSMEpoch(epoch, max(self.weights.values(), default=0.0), loss / n, pen / n, correct / n, val_loss,
                       _accuracy(model, self.val, self.spec.batch_size), tails, orders, time.perf_counter() - self.t0,
                       dict(self.weights))
        self.history.append(rec)
        full = self.spec.reg_weight <= 0 or self.ramp >= 1.0
        if reg.target_energy is not None and full:
            self.base = {name: controlled_weight(w, tails[name], 1 - reg.target_energy, reg.gain)
                         for name, w in self.base.items()}
        log.info("epoch %d: weight %.3g, val loss %.4f, val accuracy %.4f%s", epoch, rec.weight, val_loss,
                 rec.val_accuracy, "".join(f", tail {k} {v:.4f}" for k, v in tails.items()))
        self._start(epoch + 1)
        return _eligible(rec, full, reg)


def _accuracy(model: nn.Module, data: Dataset, batch_size: int) -> float:
    """Accuracy in eval mode."""
    return float((predict(model, data, batch_size).argmax(1) == data.y).double().mean())


def _eligible(rec: SSMEpoch, full_weight: bool, reg: HankelRegularisation) -> bool:
    """An epoch may be selected once the schedule has reached its weight and, in target mode, the target is met."""
    meets = reg.target_energy is None or max(rec.tail_energy.values(), default=0.0) <= 1 - reg.target_energy
    return full_weight and meets


def train_ssm_classifier(train_data: Dataset, val: Dataset | None, spec: SSMTrainSpec,
                         progress: ProgressFn | None = None) -> tuple[SSMClassifier, SSMTrainResult]:
    """Build (seeded) and train an :class:`SSMClassifier` by :func:`minreal.compress.core.train.train` (Adam, cosine
    learning rate, no early stopping); returns it in eval mode with its per-epoch history.

    The model keeps the weights of the best-validation-loss epoch among the eligible ones: the schedule has reached
    its full weight and, in target mode, the measured tail energy meets the target (the last epoch if none is).
    With a constant weight every epoch is eligible (plain best-validation selection).
    """
    torch.manual_seed(spec.seed)
    reg = spec.regularisation or HankelRegularisation()
    if reg.target_energy is not None and not spec.reg_weight > 0:
        raise ValueError("target mode needs a starting reg_weight > 0 (the controller scales it)")
    model = SSMClassifier(train_data.x.shape[-1], spec.features, spec.state, spec.depth, int(train_data.y.max()) + 1)
    hooks = _HankelHooks(model, spec, reg, val if val is not None else train_data)
    cfg = TrainConfig(epochs=spec.epochs, batch_size=spec.batch_size, lr=spec.lr, patience=spec.epochs + 1,
                      seed=spec.seed)
    best = train(model, train_data, val, cfg, hooks=hooks, progress=progress)
    result = SSMTrainResult(best.best_epoch, max(hooks.base.values(), default=0.0), hooks.history, dict(hooks.base))
    return model.eval(), result
