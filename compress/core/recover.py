"""Recovery after compression: a short knowledge distillation from the original, shared by every method.

The compressed model (the student) is trained in place towards the original (the teacher), mixed with the label
loss when labels exist; AdamW with a linear warm-up and a cosine schedule, BatchNorm statistics recalibrated after
each epoch (on at most :data:`RECALIBRATION_SAMPLES` training samples), early stopping on a held-out split of the
data with the best weights kept. The architecture never changes.

What a step costs beyond the student's forward and backward pass is kept small: the teacher (frozen, in eval mode;
the recovery does not augment) runs once per split and its outputs are reused by every epoch, every validation and
the before/after metrics (not when features are matched, whose hooks need its forward at each step, nor beyond
:data:`CACHE_LIMIT` values); the student's held-out outputs of the validation passes give the metrics (a float
recovery's); the best weights are copied once per improving epoch. Each epoch ends with one progress record of task
:data:`EPOCH_TASK` carrying its training loss, validation loss and metrics and the elapsed seconds as its detail
(:mod:`minreal.compress.core.progress`).

Optionally the student also matches the teacher's intermediate features at named state points
(:mod:`minreal.compress.core.recover_features`).

With ``int8`` set the recovery is quantisation-aware (:mod:`minreal.compress.core.qat`): the student trains with weights
and layer inputs fake-quantised in that target's INT8 format, and the activation ranges kept with the best weights are
returned for the INT8 export to reuse.

Under ``torch.distributed`` the recovery runs data-parallel: how the ranks share the data, the statistics and the
decisions is told in :mod:`minreal.compress.core.recover_parallel`.

References
----------
.. [1] Loshchilov & Hutter 2017, eq. 5: the cosine schedule after the warm-up.
.. [2] Hinton et al. (2015): the distillation loss (:mod:`minreal.compress.core.train`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .batchnorm import recalibrate_batchnorm
from .data import Dataset
from .distributed import all_reduce_sum, is_writer, rank_seed, shard, shard_bounds
from .errors import CompressionError
from .evaluate import eval_mode, kept_like, predict
from .heldout import held_out_of, output_metrics, resolve_task
from .inputs import Inputs, call, count
from .progress import log_progress
from .qat import FakeQuant, fake_quant
from .recover_features import _FeatureMatch, feature_points
from .recover_options import RecoveryConfig
from .recover_parallel import (
    StopRequest,
    agree_ranges,
    data_parallel,
    mean_over_ranks,
    rank_share,
    reported,
    require_same_everywhere,
    world_size,
)
from .train import distillation_loss, task_loss

__all__ = ["RecoveryResult", "recover", "recovery_split", "held_out_metrics"]

log = logging.getLogger(__name__)
TASK = "recovery (steps)"
EPOCH_TASK = "recovery (epochs)"
MIN_SPLIT = 20  # below this many samples nothing is held out: early stopping and metrics use all of the data


@dataclass
class RecoveryResult:
    """What the recovery cost and what it gained, measured on its held-out split before and after.

    ``before``/``after`` hold ``agreement`` (top-1, classifiers) and ``kl`` (classifiers, at T=1) or
    ``mse_to_original`` to the original, and ``accuracy`` or ``mse`` when labels exist.
    """

    epochs: int = 0
    steps: int = 0
    wall_s: float = 0.0
    samples_seen: int = 0
    held_out_samples: int = 0
    held_out_is_training_data: bool = False
    best_epoch: int = 0
    """Epoch whose weights were kept (0: the zero-shot weights were never beaten)."""
    stopped_early: bool = False
    interrupted: bool = False
    feature_points: list[str] = field(default_factory=list)
    """State points whose features were matched."""
    feature_points_skipped: dict[str, str] = field(default_factory=dict)
    """Requested points not matched, each with the reason (absent, or output shape differs)."""
    int8_target: str | None = None
    """Target whose INT8 format the recovery fake-quantised in (None: it trained in float)."""
    activation_ranges: dict[str, dict] = field(default_factory=dict)
    """Input range of each fake-quantised layer by module name (``qat.ActivationRange`` as a dict): those of the
    epoch whose weights were kept."""
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    world_size: int = 1
    """Processes that trained together (torch.distributed ranks; 1: one process)."""
    batchnorm_frozen: bool = False
    """BatchNorm statistics were kept frozen while training (re-estimated after each epoch): always under DDP,
    in one process with ``freeze_batchnorm=True`` (``--recover-freeze-bn``), the way to get the DDP result."""


def _loss(out: torch.Tensor, ref: torch.Tensor, y: torch.Tensor | None, cfg: RecoveryConfig,
          features: "_FeatureMatch | None" = None) -> torch.Tensor:
    """(1 − α)·distillation + α·label loss (the distillation alone without labels), plus the weighted
    feature-matching term when state points are matched."""
    distill = distillation_loss(out, ref, cfg.temperature, cfg.task == "classification")
    loss = distill if y is None or cfg.alpha == 0 else (1 - cfg.alpha) * distill + cfg.alpha * task_loss(out, y)
    if features is not None and features.points and cfg.feature_weight > 0:
        loss = loss + cfg.feature_weight * features.loss()
    return loss


CACHE_LIMIT = 50_000_000
"""Largest number of teacher output values kept in memory for a whole split (beyond it, recomputed per batch)."""


@torch.no_grad()
def _teacher_outputs(teacher: nn.Module, data: Dataset, whole: int, gather: bool = False) -> torch.Tensor | None:
    """The teacher's outputs on all of ``data``, computed once (the teacher is frozen and in eval mode and the
    recovery does not augment, so they are the same every epoch); None when ``whole`` samples' outputs (the whole
    split: every rank decides alike) exceed :data:`CACHE_LIMIT` values. ``gather``: every rank computes its shard
    only and the shards are all-reduced into the whole."""
    with eval_mode(teacher):
        probe = call(teacher, data.x[:1])
    if probe.numel() * whole > CACHE_LIMIT:
        return None
    if not gather or world_size() == 1:
        return predict(teacher, data, 256)
    start, stop = shard_bounds(len(data))
    whole_out = torch.zeros((len(data), *probe.shape[1:]), dtype=torch.float64)
    whole_out[start:stop] = predict(teacher, shard(data), 256).double()
    return all_reduce_sum(whole_out).to(probe.dtype)  # the other rows are zeros: the sum is exact


def _indexed(data: Dataset, batch_size: int) -> Iterator[tuple[Inputs, torch.Tensor | None, torch.Tensor]]:
    """``(x, y, indices)`` batches of ``data`` in order."""
    for xb, idx in Dataset(data.x, torch.arange(len(data))).batches(batch_size):
        yield xb, (None if data.y is None else data.y[idx]), idx


@torch.no_grad()
def _validate(teacher: nn.Module, student: nn.Module, val: Dataset, cfg: RecoveryConfig,
              features: _FeatureMatch | None = None, cached: torch.Tensor | None = None
              ) -> tuple[float, torch.Tensor]:
    """(the training objective on the held-out split, the early-stopping criterion; the student's outputs on it, in
    eval mode as :func:`predict` gives them). Under a process group ``val`` is this rank's part and the objective's
    sum and count are all-reduced."""
    total, n, outputs = 0.0, 0, []
    with eval_mode(student):
        for xb, yb, idx in _indexed(val, 256):
            ref = call(teacher, xb) if cached is None else cached[idx]
            outputs.append(call(student, xb))
            total += float(_loss(outputs[-1], ref, yb, cfg, features)) * len(xb)
            n += len(xb)
    return mean_over_ranks(total, n), torch.cat(outputs)


def _schedule(total_steps: int, warmup: float) -> Callable[[int], float]:
    """Linear warm-up over ``warmup``·steps, then cosine decay to 0 (Loshchilov & Hutter 2017, eq. 5)."""
    n_warm = int(round(warmup * total_steps))

    def factor(step: int) -> float:
        if step < n_warm:
            return (step + 1) / n_warm
        progress = (step - n_warm) / max(total_steps - n_warm, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def _step(student: nn.Module, teacher: nn.Module, xb: torch.Tensor, yb: torch.Tensor | None,
          opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler, cfg: RecoveryConfig,
          features: _FeatureMatch | None = None, ref: torch.Tensor | None = None, weight: float = 1.0,
          tally: "_Tally | None" = None) -> None:
    """One optimiser step on one batch (``ref``: the teacher's outputs on it, when already known; ``weight``: the
    factor on the loss, a rank's share of the batch times the world size under DDP; ``tally``: where the batch's
    loss is added up)."""
    if ref is None:
        with torch.no_grad():
            ref = call(teacher, xb)
    loss = _loss(call(student, xb), ref, yb, cfg, features)
    opt.zero_grad(set_to_none=True)
    (loss if weight == 1.0 else loss * weight).backward()
    opt.step()
    sched.step()
    if tally is not None:
        tally.add(float(loss.detach()), count(xb))


class _Tally:
    """A running sum of per-sample means and their sample counts; :meth:`mean` over all ranks."""

    def __init__(self) -> None:
        self.total, self.n = 0.0, 0

    def add(self, mean: float, n: int) -> None:
        self.total, self.n = self.total + mean * n, self.n + n

    def mean(self) -> float:
        return mean_over_ranks(self.total, self.n)


RECALIBRATION_SAMPLES = 2048
"""Most training samples over which BatchNorm statistics are re-estimated after each epoch: a seeded subset, the
same every epoch (all of them when fewer). Per-channel statistics average over every position of every sample, so
a few thousand samples fix them closely, while a pass over a large split costs a third of an epoch's steps."""


def _recalibration_set(train: Dataset, seed: int) -> Dataset:
    """At most :data:`RECALIBRATION_SAMPLES` of ``train`` (seeded, in their order; the same on every rank)."""
    if len(train) <= RECALIBRATION_SAMPLES:
        return train
    idx = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:RECALIBRATION_SAMPLES]
    idx = idx.sort().values
    return Dataset(train.x[idx], None if train.y is None else train.y[idx])


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@torch.no_grad()
def held_out_metrics(teacher: nn.Module, student: nn.Module, data: Dataset, batch_size: int = 256,
                     task: str = "auto", teacher_outputs: torch.Tensor | None = None) -> dict[str, float]:
    """Agreement and KL (T=1) with the teacher for classifiers, MSE to it otherwise; accuracy or MSE with labels
    (``task`` as :attr:`RecoveryConfig.task`). Under a process group ``data`` is this rank's part and the metrics
    are those of all ranks' parts together (sums and counts all-reduced). ``teacher_outputs``: the teacher's
    ``predict`` on ``data`` computed once by a caller that judges many students on the same data; a model judged
    against itself runs once."""
    out = predict(student, data, batch_size)
    if teacher_outputs is not None:
        ref = teacher_outputs
    else:
        ref = out if student is teacher else predict(teacher, data, batch_size)
    return output_metrics(ref, out, data.y, task)


def recovery_split(data: Dataset, cfg: RecoveryConfig) -> tuple[Dataset, Dataset, bool]:
    """(training split, held-out split, whether the held-out split is the training data itself): the split
    :func:`recover` makes of ``data`` (seeded by ``cfg.seed``), for a caller that must keep its held-out part out of
    its own statistics."""
    if cfg.val_fraction == 0 or len(data) < MIN_SPLIT:
        return data, data, True
    train, val = data.split(cfg.val_fraction, cfg.seed)
    return train, val, False


class _Threads:
    """``torch.set_num_threads`` capped at the cores this process may use, restored on exit."""

    def __enter__(self) -> None:
        self.saved = torch.get_num_threads()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, min(self.saved, cores)))

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.saved)


def _epochs(n: int, cfg: RecoveryConfig, ranks: int = 1) -> Iterator[tuple[int, Iterator[torch.Tensor]]]:
    """(epoch number from 1, index batches): one seeded permutation of the ``n`` training samples per epoch, the
    same on every rank, cut into batches of ``cfg.batch_size``; ``steps`` ends the last epoch part-way. A batch of
    one sample (which BatchNorm cannot normalise) is skipped unless it is all the data, and under DDP a batch with
    fewer samples than ``ranks``."""
    per_epoch = math.ceil(n / cfg.batch_size)
    total = cfg.steps or cfg.epochs * per_epoch
    least = 1 if n == 1 and ranks == 1 else max(2, ranks)
    gen = torch.Generator().manual_seed(cfg.seed)
    for epoch in range(1, math.ceil(total / per_epoch) + 1):
        left = total - (epoch - 1) * per_epoch
        order = torch.randperm(n, generator=gen)
        yield epoch, (idx for idx in order.split(cfg.batch_size)[:min(left, per_epoch)] if len(idx) >= least)


def _train_mode(model: nn.Module, freeze_batchnorm: bool) -> None:
    """Training mode; BatchNorm layers stay in eval mode (normalising by their running statistics) when frozen."""
    model.train()
    if freeze_batchnorm:
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.eval()


def recover(original: nn.Module, compressed: nn.Module, data: Dataset, config: RecoveryConfig,
            state_points: Sequence[str] = ()) -> RecoveryResult:
    """Distil ``original`` into ``compressed`` in place on ``data`` within the budget of ``config``.

    ``state_points``: the method's own state points (the layers it changed), matched when ``config.features``
    is ``("auto",)``. The first KeyboardInterrupt ends the training early: the best weights so far are kept and
    the result says ``interrupted``; a second one while finishing propagates. The architecture (state-dict keys
    and shapes) never changes; ``compressed`` is left in eval mode.

    Under a process group of more than one rank every rank calls this with the same arguments (the whole data)
    and it trains data-parallel (see the module's notes); every rank ends with the same weights and result.
    """
    t0 = time.perf_counter()
    teacher = copy.deepcopy(original).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    # where the caller keeps the original's outputs, the teacher's are the same (named only while it trains)
    with reported(), kept_like(teacher, original):
        result = _recover(teacher, compressed, data, config, state_points)
    result.wall_s = time.perf_counter() - t0
    return result


def _recover(teacher: nn.Module, compressed: nn.Module, data: Dataset, config: RecoveryConfig,
             state_points: Sequence[str]) -> RecoveryResult:
    """:func:`recover` with the original's frozen copy ``teacher``."""
    shapes = _shapes(compressed)
    require_same_everywhere(data, teacher)
    train, val, same = recovery_split(data, config)
    config = _resolved(config, teacher, data, min(len(train), len(val)))
    val_part = shard(val)  # this rank's part of the held-out split (all of it in one process)
    result = RecoveryResult(held_out_samples=len(val), held_out_is_training_data=same, world_size=world_size(),
                            batchnorm_frozen=bool(config.freeze_batchnorm) and config.enabled)
    val_refs = _teacher_outputs(teacher, val_part, len(val))  # for the metrics and the held-out objective alike
    reuse = config.enabled and config.int8 is None  # float training: its held-out passes give the student's outputs
    if not reuse:
        result.before = held_out_of(teacher, compressed, val_part, config.task, val_refs)
    outputs: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
    if config.enabled:
        result.feature_points, result.feature_points_skipped = _matched_points(teacher, compressed, config,
                                                                               state_points, train)
        with _Threads(), torch.random.fork_rng(devices=[]), \
                _FeatureMatch(teacher, compressed, result.feature_points) as features, \
                _quantisation_aware(compressed, train, config, result) as quant:
            torch.manual_seed(rank_seed(config.seed))
            outputs = _train(teacher, compressed, train, val_part, config, result, features, quant, val_refs)
    compressed.eval()
    if _shapes(compressed) != shapes:
        raise CompressionError("internal error: recovery changed the model's architecture (state-dict keys or "
                               "shapes); please report it")
    if reuse:  # without an output from before the first step no step was taken: the weights are the starting ones
        result.before = held_out_of(teacher, compressed, val_part, config.task, val_refs, outputs[0])
    result.after = held_out_of(teacher, compressed, val_part, config.task, val_refs, outputs[1] if reuse else None)
    return result


def _matched_points(teacher: nn.Module, student: nn.Module, config: RecoveryConfig, state_points: Sequence[str],
                    train: Dataset) -> tuple[list[str], dict[str, str]]:
    """:func:`feature_points` of the requested points (``("auto",)``: the method's ``state_points``); refuses a
    named point that is not a module of both models."""
    names = list(state_points) if config.features == ("auto",) else list(config.features)
    kept, skipped = feature_points(teacher, student, names, train.x[:2])
    absent = [n for n, why in skipped.items() if n in config.features and why.startswith("not a submodule")]
    if absent:
        raise CompressionError(f"`RecoveryConfig.features` (--recover-features {absent[0]!r}) is not a module of "
                               "both the original and the compressed model; give module names as in "
                               "model.named_modules(), or 'auto'", fields=("features",))
    return kept, skipped


def _resolved(config: RecoveryConfig, teacher: nn.Module, data: Dataset, smallest_split: int) -> RecoveryConfig:
    """``config`` with its task decided (:func:`resolve_task`) and its BatchNorm treatment; refuses a label-only
    loss without labels, and under DDP batch statistics or a split smaller than the number of ranks."""
    if config.enabled and config.alpha == 1.0 and data.y is None:
        raise CompressionError("`RecoveryConfig.alpha` (--recover-alpha 1) trains on the labels alone and the data "
                               "has none; lower it (0 = distillation from the original, which needs inputs only)",
                               fields=("alpha",))
    size = world_size()
    if size > 1 and config.freeze_batchnorm is False and config.enabled:
        raise CompressionError(f"recovery under torch.distributed ({size} ranks) freezes BatchNorm statistics "
                               "(SyncBatchNorm runs on GPUs only); leave freeze_batchnorm unset or True, or run in "
                               "one process")
    if size > 1 and smallest_split < size:
        raise CompressionError(f"a recovery split of {smallest_split} samples cannot be shared out among {size} "
                               f"ranks; give at least {size} samples per split (see `RecoveryConfig.val_fraction`) "
                               "or use fewer ranks", fields=("val_fraction",))
    with torch.no_grad(), eval_mode(teacher):
        probe = call(teacher, data.x[:2])
    freeze = size > 1 if config.freeze_batchnorm is None else config.freeze_batchnorm
    return dataclasses.replace(config, task=resolve_task(config.task, data.y, probe), freeze_batchnorm=freeze)


@contextlib.contextmanager
def _quantisation_aware(student: nn.Module, train: Dataset, cfg: RecoveryConfig, result: RecoveryResult
                        ) -> Iterator[FakeQuant | None]:
    """Fake-quantise ``student`` in ``cfg.int8``'s format for the block (nothing when None), ranges calibrated on
    ``train``'s inputs (each rank's shard, ranges agreed); then the ranges go into ``result``. They are buffers of
    the layers while the block runs, so loading the best epoch's state dict restores that epoch's ranges with its
    weights."""
    if cfg.int8 is None:
        yield None
        return
    with fake_quant(student, cfg.int8, calibration=shard(train).inputs(256)) as fq:
        agree_ranges(fq)
        yield fq
        result.activation_ranges = {name: asdict(r) for name, r in fq.ranges().items()}
    result.int8_target = cfg.int8


def _train(teacher: nn.Module, student: nn.Module, train: Dataset, val: Dataset, cfg: RecoveryConfig,
           result: RecoveryResult, features: _FeatureMatch, quant: FakeQuant | None, val_refs: torch.Tensor | None
           ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The training loop of :func:`recover`; fills the budget fields of ``result``; best weights loaded. Under DDP
    ``train`` is the whole training split and ``val`` this rank's part of the held-out one, ``val_refs`` the
    teacher's outputs on it (None: too many to keep). Returns the student's outputs on ``val`` before the first step
    and with the weights kept (None where an interrupt came first)."""
    per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = cfg.steps or cfg.epochs * per_epoch
    net, writer = data_parallel(student, train.x[:2]), is_writer()
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(total, cfg.warmup))
    recalibration = _recalibration_set(train, cfg.seed)
    cached = None if features.points else val_refs  # matched features need the teacher's forward (its hooks)
    report = _EpochReport(math.ceil(total / per_epoch), val, val_refs, cfg.task)
    best_loss, best_state = math.inf, copy.deepcopy(student.state_dict())
    outputs: list[torch.Tensor | None] = [None, None]  # before the first step, of the best epoch
    with StopRequest(world_size() > 1 and cfg.catch_interrupt) as stop:
        try:
            report.start()
            refs = None if features.points else _teacher_outputs(teacher, train, len(train), gather=True)
            best_loss, outputs[0] = _validate(teacher, student, val, cfg, features, cached)
            outputs[1] = outputs[0]
            if cfg.freeze_batchnorm:  # the statistics the steps normalise by: those of the starting weights
                recalibrate_batchnorm(student, recalibration, cfg.batch_size)
            for epoch, batches in _epochs(len(train), cfg, world_size()):
                _train_mode(student, bool(cfg.freeze_batchnorm))
                tally = _Tally()
                for idx in batches:
                    xb, yb, ref, weight = rank_share(train, idx, refs)
                    _step(net, teacher, xb, yb, opt, sched, cfg, features, ref, weight, tally)
                    agree_ranges(quant)
                    result.steps += 1
                    result.samples_seen += len(idx)
                    _progress(result.steps, total)
                    if stop.agreed():
                        raise KeyboardInterrupt
                recalibrate_batchnorm(student, recalibration, cfg.batch_size)
                result.epochs = epoch
                loss, out = _validate(teacher, student, val, cfg, features, cached)
                report.epoch(epoch, tally.mean(), loss, out)
                if loss < best_loss:
                    best_loss, best_state, result.best_epoch = loss, copy.deepcopy(student.state_dict()), epoch
                    outputs[1] = out
                elif epoch - result.best_epoch >= cfg.patience:
                    result.stopped_early = True
                    if writer:
                        log.info("recovery stopped early at epoch %d (best %d)", epoch, result.best_epoch)
                    break
        except KeyboardInterrupt:
            if not cfg.catch_interrupt or stop.aborted:
                raise
            result.interrupted = True
            if writer:
                log.warning("recovery interrupted after %d steps; keeping the best weights so far (epoch %d)",
                            result.steps, result.best_epoch)
        result.interrupted = stop.agreed() or result.interrupted  # a SIGINT after the last step, on any rank
    if result.steps < total:  # ended early: close the task (a full run's last step did)
        _progress(total, total)
    report.end(result)
    student.load_state_dict(best_state)
    return outputs[0], outputs[1]


class _EpochReport:
    """One progress record per epoch (task :data:`EPOCH_TASK`, by the writer): the epoch, the training loss (mean
    over its samples), the held-out objective and metrics, and the seconds since the training began; in a log file
    a line each, where the steps' records are thinned out. Every rank calls it (the metrics are all-reduced)."""

    def __init__(self, epochs: int, val: Dataset, refs: torch.Tensor | None, task: str) -> None:
        self.epochs, self.val, self.refs, self.task = epochs, val, refs, task
        self.started = time.perf_counter()

    def start(self) -> None:
        """Open the task as the training begins (a log's elapsed seconds count from here)."""
        self.started = time.perf_counter()
        if is_writer():
            log_progress(log, EPOCH_TASK, 0, self.epochs)

    def epoch(self, epoch: int, train_loss: float, val_loss: float, outputs: torch.Tensor) -> None:
        """Report epoch ``epoch`` (from 1): its mean training loss, held-out objective and held-out outputs."""
        metrics = {} if self.refs is None else output_metrics(self.refs, outputs, self.val.y, self.task)
        parts = [f"training loss {train_loss:.4g}", f"validation loss {val_loss:.4g}",
                 *(f"{name} {value:.4g}" for name, value in metrics.items()),
                 f"{time.perf_counter() - self.started:.0f} s"]
        if is_writer():
            log_progress(log, EPOCH_TASK, epoch, self.epochs, detail=", ".join(parts))

    def end(self, result: RecoveryResult) -> None:
        """Close the task when the training ended before its last epoch (early stop, interrupt)."""
        if result.epochs < self.epochs and is_writer():
            why = "interrupted" if result.interrupted else "stopped early" if result.stopped_early else "ended"
            log_progress(log, EPOCH_TASK, self.epochs, self.epochs,
                         detail=f"{why} after epoch {result.epochs}; weights of epoch {result.best_epoch} kept, "
                                f"{time.perf_counter() - self.started:.0f} s")


def _progress(done: int, total: int) -> None:
    """The recovery's progress, reported by the writer (rank 0) only."""
    if is_writer():
        log_progress(log, TASK, done, total)
