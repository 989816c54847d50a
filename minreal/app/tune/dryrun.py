"""`minreal tune --dry-run`: the search plan and its estimated time, from a short probe of the model.

The probe times, on this machine, one forward pass of the model in evaluation mode and one training step (forward,
backward and an optimiser step at the recovery batch size) on the calibration data. Every phase of the plan is then
counted in those units: statistics (``prepare``) as the forward passes over the statistics samples measured per
method (:data:`PREPARE_PASSES`), each probe's held-out measurement as one forward pass over the held-out data,
each recovery as its training steps (every rung as if nothing met the constraint early: an upper bound), each
timing as its protocol's seconds per file, cell and process. Workers share the cores (each gets cores ÷ workers
threads), so the estimate does not shrink with them. It is an estimate with a stated basis, not a promise: exports
are counted as a constant (:data:`EXPORT_S`) and the methods' own work beyond statistics (decompositions,
partition refinement) is not counted, nor are ORT-format conversions (``--format onnx,ort``): the plan names them,
but ONNX Runtime's converter took 0.02-0.07 s a file for a small CNN (0.2 MB) and a CIFAR ResNet-20 (1.1 MB) on 2
cores, and checking ``chosen.ort`` against ``chosen.onnx`` about as long.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.inputs import call
from minreal.compress.core.recover_options import RecoveryConfig

from .config import TuneConfig
from .halving import halving_pool, rung_fractions

__all__ = ["Probe", "PlanEstimate", "probe_model", "estimate_plan"]

PREPARE_PASSES = {"factorize": 27.0, "svd": 0.0, "magnitude": 0.0}
"""Forward passes over the statistics samples a method's ``prepare`` costs, where measured: factorize's float64
second moments of every conv's im2col patches cost 27 plain forward passes on the pretrained ResNet-32 (242 s for
7,000 CIFAR images, forward 1.27 ms per image, 2 cores); svd and magnitude read only the weights. Measured before
factorize took layers with fewer outputs than inputs from the o × o Gram of their outputs (no im2col): an upper
bound since, not remeasured."""
DEFAULT_PREPARE_PASSES = 3.0
"""Other methods: importances and partitions from about one to three passes with hooks."""
EXPORT_S = 4.0
"""Seconds to export one candidate (fp32 ONNX with its parity check, INT8 calibration, .pt2), on small models."""
PROCESS_START_S = 1.5
"""Seconds a fresh timing process takes to start and load a file."""
VAL_FRACTION = RecoveryConfig.val_fraction
RECOVERY_BATCH = RecoveryConfig.batch_size


@dataclass(frozen=True)
class Probe:
    """Seconds per sample of one forward pass (evaluation) and of one training step, measured here."""

    forward_s: float
    train_s: float
    samples: int


def probe_model(model: nn.Module, data: Dataset, batch: int = RECOVERY_BATCH, repeats: int = 3) -> Probe:
    """Time the model's forward pass and one training step on the first ``batch`` samples (the best of
    ``repeats``, after one warm-up); the model itself is not changed."""
    x = data.x[: min(batch, len(data))]
    n = len(data.x[: min(batch, len(data))])
    model.eval()
    with torch.no_grad():
        call(model, x)
        fwd = min(_timed(lambda: call(model, x)) for _ in range(repeats))
    student = copy.deepcopy(model).train()
    opt = torch.optim.SGD([p for p in student.parameters() if p.requires_grad], lr=0.0)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = call(student, x)
        (out if isinstance(out, torch.Tensor) else out[0]).float().square().mean().backward()
        opt.step()

    step()
    train = min(_timed(step) for _ in range(repeats))
    return Probe(fwd / n, train / n, n)


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclass
class PlanEstimate:
    """The plan in lines and the estimated seconds by phase."""

    lines: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def estimate_plan(cfg: TuneConfig, methods: Sequence[str], calib: int, held_out: int, probe: Probe) -> PlanEstimate:
    """What the tune will run and about how long each phase takes (``calib``/``held_out``: sample counts)."""
    est = PlanEstimate()
    cells = len(cfg.bench.providers) * len(cfg.bench.batch_sizes)
    fwd_held = probe.forward_s * held_out
    files_base = 1 + (2 if cfg.int8 else 0)
    est.lines.append(f"probe: forward {1e3 * probe.forward_s:.3g} ms/sample, training step "
                     f"{1e3 * probe.train_s:.3g} ms/sample (batch {probe.samples}, this machine)")
    est.seconds["baselines"] = 2 * EXPORT_S + (fwd_held * 4 if cfg.int8 and cfg.accuracy_control else 0.0)
    est.lines.append(f"baselines: the original in fp32{', INT8 and INT8 with accuracy control' if cfg.int8 else ''}")
    grid = len(cfg.grid)
    per_search = math.ceil(math.log2(grid + 1)) + 1
    probes = len(methods) * per_search
    stats = min(calib, cfg.stats_samples) if cfg.stats_samples else calib
    passes = sum(PREPARE_PASSES.get(m, DEFAULT_PREPARE_PASSES) for m in methods)
    est.seconds["prepare"] = passes * probe.forward_s * stats
    est.seconds["zero-shot"] = probes * (fwd_held + EXPORT_S / 2)
    est.lines.append(f"zero-shot bisection: {len(methods)} method(s) ({', '.join(methods) or '-'}) over {grid} MAC "
                     f"ratios ({', '.join(f'{g:g}' for g in cfg.grid)}): at most {per_search} probes each, every "
                     f"budget realised from one prepare per method (statistics on {stats} samples)")
    recovered = 0.0
    if cfg.recover_epochs and methods:
        fractions = rung_fractions(cfg.halving_eta, cfg.halving_rungs)
        pool = len(halving_pool(cfg.grid, {m: None for m in methods}, cfg.halving_per_method))
        train = calib * (1 - VAL_FRACTION)
        alive, parts, last = pool, [], pool
        for f in fractions:  # as if no candidate met the constraint before the full cap (then none extends)
            recovered += alive * f * cfg.recover_epochs * train * (probe.train_s + probe.forward_s) + alive * fwd_held
            parts.append(f"{alive} at {f:.2g}")
            last, alive = alive, math.ceil(alive / cfg.halving_eta)
        est.lines.append(f"recovery: successive halving of up to {pool} candidate(s) ({cfg.halving_per_method} budgets "
                         f"per method below its zero-shot boundary), {cfg.recover_epochs}-epoch cap: "
                         f"{'; '.join(parts)} of the cap; a method whose smallest raced budget meets the constraint "
                         "early races its next budget at the next rung (not counted here)"
                         + ("; first, each method's smallest pool budget is exported and timed beside the "
                            "baselines, and a method whose structure there is not faster than a baseline that meets "
                            "the constraint does not race (counted here as if every one raced)"
                            if cfg.objective == "latency" and cfg.structure_screen else ""))
        if cfg.objective == "latency" and cfg.structure_screen:  # one export per method, one timing pass
            timed = files_base + len(methods) * (2 if cfg.int8 else 1)
            est.seconds["structure screen"] = (len(methods) * EXPORT_S + timed * cells
                                               * (cfg.screen.min_seconds * cfg.screen.repeats + PROCESS_START_S))
        if cfg.int8 and cfg.qat:
            qat = last * cfg.recover_epochs * train * (probe.train_s * 1.5 + probe.forward_s)
            est.seconds["quantisation-aware"] = qat
            est.lines.append("quantisation-aware recovery (the full cap) for each recovered winner whose plain INT8 "
                             "misses the constraint (counted here as if every one did)")
    est.seconds["recovery"] = recovered
    files = files_base + 2 * (len(methods) * (2 if cfg.recover_epochs else 1))
    est.seconds["ort_quality"] = files * fwd_held
    est.seconds["screen"] = files * cells * (cfg.screen.min_seconds * cfg.screen.repeats + PROCESS_START_S)
    confirmed = files_base + 2
    est.seconds["confirm"] = confirmed * cells * cfg.confirm.repeats * (cfg.confirm.min_seconds + PROCESS_START_S)
    est.lines.append(f"timing: about {files} file(s) screened ({cfg.screen.min_seconds:g} s, {cells} cell(s)), the "
                     f"fronts and baselines confirmed ({cfg.confirm.min_seconds:g} s x {cfg.confirm.repeats} fresh "
                     "processes)")
    if cfg.ort is not None:
        est.lines.append(_ort_line(cfg))
    if cfg.time_budget_s is not None:
        est.lines.append(f"time budget: {cfg.time_budget_s:.0f} s (checked before every probe)")
    return est


def _ort_line(cfg: TuneConfig) -> str:
    """What ``--format onnx,ort`` adds to the plan: the chosen file's conversion and, with ``--max-size`` or
    ``--objective size``, every feasible file's."""
    line = ("ORT format (--format onnx,ort): chosen.onnx converted to chosen.ort with its required-operators "
            "configuration, and checked against chosen.onnx")
    if cfg.max_size_kb is None and cfg.objective == "size":
        return (f"{line}; --objective size ranks the .ort files: every file that meets the quality constraint is "
                "converted to ORT format first (in a scratch folder)")
    if cfg.max_size_kb is None:
        return line
    return (f"{line}; --max-size {cfg.max_size_kb:g} KB judges the .ort files too: every file that meets the quality "
            "constraint and fits as .onnx is converted to ORT format first (in a scratch folder), and one whose .ort "
            "file is larger is infeasible")
