"""`minreal tune`: the fastest deployable model within a quality constraint, measured on the target provider,
against the baselines users would pick instead (the original in fp32, in INT8, and in INT8 with accuracy control).

Order of work, cheapest first: each method's MAC budget is bisected on held-out quality in torch
(:mod:`.search`); only candidates that meet the constraint are exported and quantised; ONNX Runtime's quality of
every file decides which stay; all of those are timed with the short protocol, and only the Pareto front of each
(provider, batch) cell plus the baselines is timed again with the release protocol in fresh processes. The choice
and the verdict come from that confirmation.

Candidates run through the executor's ``map``; both timing passes run through its ``on_target`` (a
:class:`BenchJob` that carries the files' bytes), so a distributed executor can keep latency on the target hardware.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

import minreal.runtime_bench as rb
from minreal.compress import get_method, method_names
from minreal.compress.core.data import Dataset
from minreal.compress.core.recover import held_out_metrics
from minreal.export.int8 import QuantResult, resolve_target
from minreal.export.json_safe import to_jsonable
from minreal.export.settings import VariantConfig
from minreal.export.variant import VariantRecord, export_variant, quantize_variant, relative_to
from minreal.export.verify import feeds_of
from minreal.facts import ARM64_TARGET, CPU_AVX2_TARGET, CPU_VNNI_TARGET
from minreal.runtime_bench.metrics import evaluate_models

from .candidate import (
    CandidateResult,
    CandidateSpec,
    Job,
    LoadedSource,
    evaluate_candidate,
    fingerprint,
    subsample_size,
)
from .config import Constraint, Protocol, Quality, TuneConfig, TuneError
from .executor import Executor, InlineExecutor
from .front import Point, choose, pareto_front
from .halving import Halving, RungEntry, halving_pool, halving_twins, rung_fractions
from .search import BudgetSearch, Probe

__all__ = ["tune", "TuneReport", "Candidate", "TUNE_SCHEMA_VERSION", "default_methods", "with_chains", "CHAINS",
           "BASELINES", "BenchJob",
           "BenchOutcome", "bench_files"]

log = logging.getLogger(__name__)
TUNE_SCHEMA_VERSION = 1
BASELINES = ("original", "original.int8", "original.int8-ac")
Progress = Callable[[str], None]


@dataclass
class Candidate:
    """One deployable file: a baseline or a searched candidate in one precision, with what was measured."""

    label: str
    kind: str
    """``baseline`` or ``structural``."""
    precision: str
    """``fp32``, ``int8`` (post-training) or ``int8-qat`` (ranges trained by quantisation-aware recovery)."""
    onnx: str
    onnx_bytes: int
    method: str = "none"
    mac_ratio: float = 1.0
    recover_epochs: int = 0
    quality: dict[str, Any] = field(default_factory=dict)
    """ONNX Runtime's metrics on the held-out data (accuracy, top1_agreement with the original, mse)."""
    loss: float | None = None
    """What it gives up against the original under the constraint (pp of accuracy, 1 − agreement, MSE)."""
    feasible: bool = False
    screen_ms: dict[str, float] = field(default_factory=dict)
    """p50 by ``provider/bBATCH`` with the short protocol."""
    confirm_ms: dict[str, float] = field(default_factory=dict)
    """p50 by cell with the release protocol (front and baselines only)."""
    confirm_range_ms: dict[str, list[float]] = field(default_factory=dict)
    """[lowest, highest] per-process p50 by cell in the confirmation (the spread over fresh processes)."""
    pt2: str | None = None
    gzip_bytes: int = 0
    """The file (with its external data) gzip-compressed (:func:`minreal.runtime_bench.model_info.gzip_bytes`)."""
    ort_bytes: int | None = None
    """``--format onnx,ort`` with ``--max-size`` or ``--objective size``: the size of its ORT-format file, which
    ``--max-size`` judges too and ``--objective size`` ranks by (converted in a scratch folder); None: not converted
    (no such options, or already infeasible)."""

    @property
    def shipped_bytes(self) -> int:
        """The bytes of the file that ships: the ``.ort`` file where it was converted, else the ``.onnx`` file."""
        return self.onnx_bytes if self.ort_bytes is None else self.ort_bytes


@dataclass
class TuneReport:
    """The versioned ``report.json`` of a tune directory (``kind: "tune"``)."""

    schema_version: int
    kind: str
    created_utc: str
    config: dict[str, Any]
    constraint: str
    reference: dict[str, Any]
    searches: list[dict[str, Any]]
    candidates: list[Candidate]
    front: dict[str, list[str]]
    chosen: str | None
    verdict: str
    counts: dict[str, int]
    wall_s: float
    screen: dict[str, Any] = field(default_factory=dict)
    confirm: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    measured_on: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Where each timing pass ran (``screen``, ``confirm``): ``host`` and ``pid`` of the process that timed it."""
    halving: dict[str, Any] | None = None
    """The recovered candidates' race (:meth:`.halving.Halving.record`): which candidate got which share of the
    recovery cap, its loss there, and whether it went on."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """Wall time by phase: the candidates' ``prepare``, ``realise``, ``recover``, ``measure`` and ``export``
    (summed over candidates, so with several workers they can exceed the search's wall time), and the tune's own
    ``baselines`` (export, quantisation, accuracy control), ``search`` (wall time of all candidate rounds),
    ``ort_quality``, ``ort_sizes`` (``--format onnx,ort`` with ``--max-size``: the feasible files converted to judge
    their ``.ort`` size), ``screen`` and ``confirm``."""
    chosen_ort: dict[str, Any] | None = None
    """With ``--format onnx,ort`` and a chosen model: ``chosen.ort`` and its configuration
    (:func:`minreal.export.ort_format.ort_copy`'s record, with ``gzip_bytes``), checked against ``chosen.onnx``."""


@dataclass(frozen=True)
class BenchJob:
    """One timing pass for :meth:`Executor.on_target`: the files travel as bytes (no shared storage needed)."""

    labels: tuple[str, ...]
    files: tuple[bytes, ...]
    config: rb.BenchConfig
    x: Any
    y: np.ndarray | None


@dataclass
class BenchOutcome:
    """The benchmark report (JSON-safe, model paths as in the job's temporary folder) and where it was measured."""

    report: dict[str, Any]
    host: str
    pid: int


def bench_files(job: BenchJob, progress: Progress | None = None) -> BenchOutcome:
    """Time ``job``'s files here with :func:`minreal.runtime_bench.run_benchmark` (fresh processes; providers must
    run)."""
    with tempfile.TemporaryDirectory(prefix="minreal-tune-bench-") as tmp:
        entries = []
        for i, (label, data) in enumerate(zip(job.labels, job.files)):
            path = Path(tmp) / f"{i}.onnx"
            path.write_bytes(data)
            entries.append(rb.ModelEntry(label, path))
        report = rb.run_benchmark(entries, job.config, job.x, job.y, progress=progress, fail_on_unavailable=True)
        return BenchOutcome(to_jsonable(report), socket.gethostname(), os.getpid())


def default_methods() -> tuple[str, ...]:
    """Every registered method that takes a whole-model MAC budget."""
    return tuple(n for n in method_names() if "mac_ratio" in get_method(n).budgets)


CHAINS = ("depth+magnitude",)
"""Chains tune searches beside the methods whenever all their parts are searched, with no option: depth, then a
width method on what depth left, each taking half of the MAC cut (:data:`.candidate.CHAIN_FIRST_SHARE`). With depth
alone (all of the cut by depth) and the width method alone (none of it), tune measures three allocations of each
budget on the target, and its measured latency and held-out quality choose among them."""


def with_chains(methods: Sequence[str]) -> tuple[str, ...]:
    """``methods`` and the :data:`CHAINS` whose parts are all among them."""
    return (*methods, *(c for c in CHAINS if c not in methods and all(p in methods for p in c.split("+"))))


def _cell(provider: str, batch: int) -> str:
    return f"{provider}/b{batch}"


def tune(model: nn.Module, calib: Dataset, held_out: Dataset, cfg: TuneConfig, folder: Path, cache_dir: Path,
         source: Any = None, executor: Executor | None = None, progress: Progress | None = None) -> TuneReport:
    """Search, measure and choose; every file lands in ``folder`` (``models/``, ``chosen.onnx``, ``chosen.pt2``).

    ``source`` tells workers how to load the inputs again (:class:`~.candidate.SpecSource`); default: the objects
    given (:class:`~.candidate.LoadedSource`, only for an in-process executor). Results are cached in
    ``cache_dir`` by inputs and candidate, so a repeated or interrupted tune resumes.
    """
    t_start, say = time.perf_counter(), progress or log.info
    run = executor or InlineExecutor()
    # "cpu" is the format of the machine the latency is measured on (a Ray cluster's bench node, not this driver)
    cfg = dataclasses.replace(cfg, quant_target=run.on_target(resolve_target, cfg.quant_target))
    if held_out is None or len(held_out) == 0:
        raise TuneError("tune needs held-out data: pass --eval-data (or data with room for a held-out split)")
    methods = cfg.methods or (() if cfg.plan else default_methods())
    for m in methods:
        if "mac_ratio" not in get_method(m).budgets:
            raise TuneError(f"method {m!r} has no whole-model MAC budget, so tune cannot search it; choose from "
                            f"{', '.join(default_methods())}")
    _check_plan_labels(cfg)
    methods = with_chains(methods)
    reference = Quality.from_metrics(held_out_metrics(model, model, held_out))
    if cfg.constraint.score(reference) is None:
        raise TuneError(f"the constraint ({cfg.constraint.describe()}) cannot be measured on this held-out data: "
                        f"{_what_it_needs(cfg.constraint)}")
    models_dir = folder / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    say(f"[tune] baselines: original fp32{f' and INT8 ({cfg.quant_target})' if cfg.int8 else ''}")
    t_baselines = time.perf_counter()
    baselines = _baselines(model, calib, held_out, cfg, models_dir, reference, notes, say)
    job_base = Job(CandidateSpec("", 1.0), source or LoadedSource(model, calib, held_out),
                   fingerprint(model, calib, held_out), Path(cache_dir), cfg.constraint, reference, cfg.providers,
                   cfg.quant_target, cfg.int8, tuple(sorted(cfg.extra.items())),
                   hashlib.sha256((models_dir / "original.onnx").read_bytes()).hexdigest(),
                   tuple((n, tuple(sorted(per.items()))) for n, per in sorted(cfg.dynamic_axes.items())),
                   stats_samples=cfg.stats_samples,
                   deadline=None if cfg.time_budget_s is None
                   else time.time() + cfg.time_budget_s - (time.perf_counter() - t_start))
    phases = {"baselines": time.perf_counter() - t_baselines}
    try:
        t0 = time.perf_counter()
        clock = _Clock(t_start, say, cfg.workers, len(calib))
        searches, halving, results = _search(methods, cfg, job_base, run, t_start, notes, say, clock)
        results += _qat_candidates(searches, results, held_out, models_dir / "original.onnx", cfg, job_base, run,
                                   t_start, notes, say, clock)
        phases["search"] = time.perf_counter() - t0
        candidates = baselines + _structural(results, models_dir, cfg)
        t0 = time.perf_counter()
        _ort_quality(candidates, held_out, cfg.constraint, folder, say)
        _sizes(candidates, cfg, notes, say)
        phases["ort_quality"] = time.perf_counter() - t0
        if cfg.ort is not None and (cfg.max_size_kb is not None or cfg.objective == "size"):  # the .ort file ships
            t0 = time.perf_counter()
            _ort_sizes(candidates, cfg, folder, notes, say, clock)
            phases["ort_sizes"] = time.perf_counter() - t0
        report = _measure_and_choose(candidates, held_out, cfg, folder, say, notes, run, phases)
    except BaseException:
        run.close(abort=True)
        raise
    if executor is None:
        run.close()
    report.searches = [_search_record(k, s) for k, s in searches.items()]
    report.halving = None if halving is None else halving.record()
    report.phases_s = {**_candidate_phases(results), **{k: round(v, 2) for k, v in phases.items()}}
    report.reference = {"torch": dataclasses.asdict(reference)}
    one = 100.0 / len(held_out)
    notes.append(f"held-out data: {len(held_out)} samples, so one sample is {one:.3g} pp of accuracy; "
                 + ("too few to resolve the constraint reliably" if one > 0.5 * _limit_pp(cfg.constraint) else
                    "the same samples judge every candidate (and rank accuracy control's layers)"))
    report.notes = notes
    report.counts = _counts(results, candidates)
    report.wall_s = time.perf_counter() - t_start
    return report


def _limit_pp(c: Constraint) -> float:
    """The constraint's allowance in percentage points of accuracy or agreement (inf for MSE)."""
    if c.max_accuracy_drop is not None:
        return c.max_accuracy_drop
    return 100.0 * (1.0 - c.min_agreement) if c.min_agreement is not None else float("inf")


def _what_it_needs(c: Constraint) -> str:
    return {"accuracy": "--max-accuracy-drop needs integer class labels", "mse": "--max-mse-increase needs float "
            "targets", "agreement": "--min-agreement needs a classifier (outputs with several classes)"}[c.metric]


def _check_plan_labels(cfg: TuneConfig) -> None:
    """Plan variants name files in ``models/``: no baseline's name, nothing that is not a plain file name."""
    for v in cfg.plan:
        if v.label.startswith(("original", ".")) or any(c in v.label for c in "/\\"):
            raise TuneError(f"plan variant label {v.label!r} cannot name a tune candidate: no path separators, no "
                            "leading '.', and no baseline name (original...)")


def _baselines(model: nn.Module, calib: Dataset, held_out: Dataset, cfg: TuneConfig, models_dir: Path,
               reference: Quality, notes: list[str], say: Progress) -> list[Candidate]:
    """The original in fp32 and INT8 and, when INT8 misses the constraint, INT8 with accuracy control."""
    vcfg = VariantConfig(quant_target=cfg.quant_target)
    rec = export_variant(model, held_out.x, models_dir / "original.onnx", vcfg, "original",
                         dynamic_axes=cfg.dynamic_axes or None)
    out = [Candidate("original", "baseline", "fp32", str(models_dir / rec.onnx), rec.onnx_bytes, feasible=True)]
    if cfg.int8:
        q = quantize_variant(rec, models_dir, calib.x, vcfg)
        out.append(Candidate("original.int8", "baseline", "int8", str(models_dir / q.onnx), q.onnx_bytes))
        if cfg.accuracy_control:
            ac_cfg = _saturation_free(q, vcfg, notes, say)
            plain = q if ac_cfg.quant_config() == vcfg.quant_config() else None
            out += _accuracy_controlled(models_dir, calib, held_out, cfg, ac_cfg, notes, say, plain)
    return out


def _saturation_free(q: VariantRecord, vcfg: VariantConfig, notes: list[str], say: Progress) -> VariantConfig:
    """``vcfg``, or with target ``cpu-avx2`` when the original's INT8 file ``q`` can saturate on this CPU (an explicit
    ``--quant-target cpu-vnni`` on x86 without VNNI): accuracy control then starts from the format that cannot. An
    ``arm64`` or ``tensorrt`` file keeps its format (its device does not saturate); ``arm64`` gets a note."""
    if not (q.quantization or {}).get("saturates_here"):
        return vcfg
    if vcfg.quant_target == ARM64_TARGET:
        notes.append("the arm64 INT8 files run here with their int8 activations turned into uint8 (ONNX Runtime on "
                     "x86) and can saturate its int16 step on this CPU (x86 without VNNI), which ARM's kernels do "
                     "not have: the accuracy measured here can understate ARM's")
    if vcfg.quant_target != CPU_VNNI_TARGET:
        return vcfg
    say(f"[tune] the original's INT8 ({vcfg.quant_target}) can saturate on this CPU: accuracy control starts from "
        "cpu-avx2 (7-bit weights, no saturation)")
    notes.append(f"--quant-target {vcfg.quant_target} can saturate ONNX Runtime's int16 step on this CPU (x86 without "
                 "VNNI); the accuracy-controlled INT8 of the original uses cpu-avx2 instead")
    return dataclasses.replace(vcfg, quant_target=CPU_AVX2_TARGET)


def _accuracy_controlled(models_dir: Path, calib: Dataset, held_out: Dataset, cfg: TuneConfig, vcfg: VariantConfig,
                         notes: list[str], say: Progress, plain: VariantRecord | None = None) -> list[Candidate]:
    """The original in INT8 with its most sensitive layers left in float until the constraint holds (none when the
    plain INT8 already meets it: the same file). ``plain``, the original's INT8 made with ``vcfg``'s quantisation
    config, is where accuracy control starts instead of quantising it again."""
    from minreal.export.accuracy_control import quantize_with_accuracy_control

    c = cfg.constraint
    metric, max_drop = {"accuracy": ("accuracy", c.max_accuracy_drop),
                        "agreement": ("agreement", None if c.min_agreement is None else 100 * (1 - c.min_agreement)),
                        "mse": ("mse", c.max_mse_increase)}[c.metric]
    path = models_dir / "original.int8-ac.onnx"
    say(f"[tune] original INT8 with accuracy control ({metric}, allowed drop {max_drop:g})")
    res = quantize_with_accuracy_control(
        models_dir / "original.onnx", path, feeds_of(calib.x[: vcfg.calib_samples]), feeds_of(held_out.x),
        None if held_out.y is None or metric == "agreement" else held_out.y.numpy(), max_drop, vcfg.quant_config(),
        metric=metric, int8=None if plain is None else _quant_result(plain, models_dir))
    if not res.excluded and res.met and vcfg.quant_target != cfg.quant_target:
        notes.append(f"original.int8-ac is the original's INT8 in the saturation-free cpu-avx2 format, every layer "
                     f"quantised: it meets the constraint (drop {res.drop:.3g})")
        return [Candidate("original.int8-ac", "baseline", "int8-ac", str(path), path.stat().st_size)]
    if not res.excluded:
        path.unlink(missing_ok=True)
        notes.append("the original's INT8 already meets the constraint: accuracy control left every layer quantised"
                     if res.met else "accuracy control found no layer whose float fallback helps")
        return []
    notes.append(f"accuracy control left {len(res.excluded)} of the original's layers in float "
                 f"({', '.join(res.excluded_nodes)}); drop {res.drop:.3g} ({'met' if res.met else 'NOT met'})")
    return [Candidate("original.int8-ac", "baseline", "int8-ac", str(path), path.stat().st_size)]


def _quant_result(record: VariantRecord, folder: Path) -> QuantResult:
    """The :class:`QuantResult` an INT8 record holds (as JSON, paths relative to ``folder``), paths made whole."""
    q = record.quantization
    return QuantResult(**{**q, "fp32_path": str(folder / q["fp32_path"]), "out_path": str(folder / q["out_path"])})


def _search(methods: Sequence[str], cfg: TuneConfig, base: Job, run: Executor, t_start: float, notes: list[str],
            say: Progress, clock: "_Clock") -> tuple[dict[tuple[str, int], BudgetSearch], Halving | None,
                                                     list[CandidateResult]]:
    """The plan's fixed variants, then rounds of zero-shot bisection (one step of every unfinished method's search a
    round: every budget realises from the method's one prepared state, so a probe costs a realise, a measurement
    and, when it meets the constraint, an export), then successive halving of the recovered candidates
    (:mod:`.halving`)."""
    searches = {(m, 0): BudgetSearch(cfg.grid) for m in methods}
    fixed = [dataclasses.replace(base, spec=CandidateSpec(v.label, 1.0, e, variant=v))
             for v in cfg.plan for e in cfg.recovery_budgets]
    results: list[CandidateResult] = clock.run_round(run, fixed, "plan variants", base) if fixed else []
    while not _stopped(cfg, t_start, results, notes, say):
        steps = [(k, b) for k, s in searches.items() if (b := s.next_budget()) is not None]
        if not steps:
            break
        jobs = [dataclasses.replace(base, spec=CandidateSpec(m, b, e)) for (m, e), b in steps]
        outcomes = clock.run_round(run, jobs, "zero-shot search round", base)
        for ((m, e), b), res in zip(steps, outcomes):
            if res.skipped:
                continue
            results.append(res)
            search = searches[(m, e)]
            search.record(b, res.feasible, base.constraint.score(Quality.from_metrics(res.quality)))
            if res.error and len(search.probes) >= 2 and all(p.score is None for p in search.probes.values()):
                search.abandoned = res.error
        if _note_skipped(outcomes, notes, say):
            return searches, None, results
    halving = None
    if cfg.recover_epochs and methods and not _stopped(cfg, t_start, results, notes, say):
        halving = _halve(methods, searches, cfg, base, run, clock, results, t_start, notes, say)
    return searches, halving, results


def _halve(methods: Sequence[str], searches: dict[tuple[str, int], BudgetSearch], cfg: TuneConfig, base: Job,
           run: Executor, clock: "_Clock", results: list[CandidateResult], t_start: float, notes: list[str],
           say: Progress) -> Halving:
    """Successive halving of the recovered candidates below each method's zero-shot boundary."""
    fractions = rung_fractions(cfg.halving_eta, cfg.halving_rungs)
    zero_shot = {(r.spec.method, r.spec.mac_ratio): r for r in results
                 if r.spec.variant is None and not r.spec.recover_epochs and not r.error}
    models = {k: r.weights_digest for k, r in zero_shot.items()}
    boundaries = {m: searches[(m, 0)].smallest() for m in methods}
    pool = halving_pool(cfg.grid, boundaries, cfg.halving_per_method, models)
    twins = halving_twins(cfg.grid, boundaries, cfg.halving_per_method, models)
    for m, b, twin in twins:
        notes.append(f"{m}@{b:g} realises the same model as {m}@{twin:g} (MAC ratio "
                     f"{zero_shot[(m, b)].mac_ratio:.3g}): it is recovered once, as {m}@{twin:g}")
        say(f"[tune] {notes[-1]}")
    halving = Halving(fractions, cfg.halving_eta, pool, twins=twins)
    n_calib = clock.calib_samples
    say(f"[tune] recovery by successive halving: {len(pool)} candidate(s) below the zero-shot boundaries, rungs of "
        f"{', '.join(_fraction_text(f) for f in fractions)} of the {cfg.recover_epochs}-epoch recovery cap")
    todo = pool
    for i, fraction in enumerate(fractions):
        if not todo:
            break
        if _stopped(cfg, t_start, results, notes, say):
            break
        jobs = [dataclasses.replace(base, spec=CandidateSpec(m, b, cfg.recover_epochs, fraction=fraction))
                for m, b in todo]
        outcomes = clock.run_round(run, jobs, f"recovery rung {i + 1}/{len(fractions)} "
                                   f"({_fraction_text(fraction)} of the cap)", base)
        entries = []
        for (m, b), res in zip(todo, outcomes):
            samples = n_calib if fraction >= 1 else subsample_size(n_calib, fraction)
            if not res.skipped:
                results.append(res)
            quality = Quality.from_metrics(res.quality)
            loss = None if res.error else base.constraint.loss(quality, base.reference)
            entries.append(RungEntry(m, b, fraction, samples, loss, res.feasible, sum(res.seconds.values()),
                                     "skipped" if res.skipped else "refused" if res.error else "",
                                     None if res.error else base.constraint.score(quality)))
        todo = halving.promote(entries)
        met = [f"{e.method}@{e.budget:g}" for e in entries if e.outcome == "met"]
        say(f"[tune] rung {i + 1}: {', '.join(met) or 'none'} met the constraint"
            + (f"; {', '.join(f'{m}@{b:g}' for m, b in todo)} go on" if todo else ""))
        if _note_skipped(outcomes, notes, say):
            break
    for m in methods:  # each budget's last word: met, or missed at the full cap
        last = [e for rung in halving.rungs for e in rung if e.method == m and e.outcome in ("met", "missed")]
        search = searches.setdefault((m, cfg.recover_epochs), BudgetSearch(cfg.grid))
        for e in sorted(last, key=lambda e: -e.budget):
            search.probes[e.budget] = Probe(e.budget, e.meets, e.score)
    return halving


def _fraction_text(f: float) -> str:
    return "all" if f >= 1 else f"1/{round(1 / f)}" if abs(1 / f - round(1 / f)) < 1e-9 else f"{f:.2g}"


def _stopped(cfg: TuneConfig, t_start: float, results: list[CandidateResult], notes: list[str],
             say: Progress) -> bool:
    """Whether the time budget has run out (noted once)."""
    if not _over_budget(cfg, t_start):
        return False
    if not any("time budget" in n for n in notes):
        notes.append(f"time budget of {cfg.time_budget_s:.0f} s reached: the search stopped early and the "
                     "candidates measured so far were compared")
        say("[tune] time budget reached; comparing what was measured")
    return True


class _Clock:
    """Progress of the search: a line when each probe starts and ends (its phases, its time, the elapsed time and
    an estimate of what is left of the round, from the probes measured so far)."""

    def __init__(self, t_start: float, say: Progress, workers: int = 1, calib_samples: int = 0) -> None:
        self.t_start, self.say, self.workers, self.calib_samples = t_start, say, max(1, workers), calib_samples
        self.fixed: list[float] = []
        """Seconds of finished probes outside recovery (prepare excluded)."""
        self.per_sample_epoch: list[float] = []
        """Recovery seconds per (sample x epoch) of finished recoveries."""

    def estimate(self, job: Job) -> float | None:
        """Seconds ``job`` should take, from the probes so far (None before any)."""
        if not self.fixed:
            return None
        spec = job.spec
        rest = sum(self.fixed) / len(self.fixed)
        if not spec.recover_epochs:
            return rest
        if not self.per_sample_epoch:
            return None
        samples = self.calib_samples if not spec.short else subsample_size(self.calib_samples, spec.fraction)
        return rest + sorted(self.per_sample_epoch)[len(self.per_sample_epoch) // 2] * samples * spec.recover_epochs

    def run_round(self, run: Executor, jobs: list[Job], what: str, base: Job) -> list[CandidateResult]:
        guesses = [self.estimate(j) for j in jobs]
        known = [g for g in guesses if g is not None]
        guess = (f", about {sum(known) / self.workers:.0f} s" + ("" if len(known) == len(guesses) else " + unknown")
                 if known else "")
        self.say(f"[tune] {what}: {len(jobs)} probe(s){guess}; {self.elapsed()}")
        imap = getattr(run, "imap", None)
        stream = imap(evaluate_candidate, jobs) if imap is not None else iter(run.map(evaluate_candidate, jobs))
        for job in jobs[: self.workers]:
            self.say(f"[tune] start {job.spec.label}")
        out = []
        for i, res in enumerate(stream):
            out.append(res)
            self._learn(res)
            left = [g for g in guesses[i + 1:] if g is not None]
            eta = f", about {sum(left) / self.workers:.0f} s left in the round" if left else ""
            self.say(f"[tune] end {res.spec.label}: {_probe_line(res, base)}{_phases(res)}; {self.elapsed()}{eta}")
            nxt = i + self.workers
            if nxt < len(jobs):
                self.say(f"[tune] start {jobs[nxt].spec.label}")
        return out

    def _learn(self, res: CandidateResult) -> None:
        if res.skipped or res.cached or res.error:
            return
        sec = res.seconds
        self.fixed.append(sum(v for k, v in sec.items() if k not in ("prepare", "recover")))
        samples = self.calib_samples if not res.spec.short else subsample_size(self.calib_samples, res.spec.fraction)
        if res.spec.recover_epochs and sec.get("recover") and samples:
            self.per_sample_epoch.append(sec["recover"] / (samples * res.spec.recover_epochs))

    def elapsed(self) -> str:
        return f"{time.perf_counter() - self.t_start:.0f} s elapsed"


def _phases(res: CandidateResult) -> str:
    if res.skipped or res.cached:
        return ""
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in res.seconds.items() if v >= 0.05)
    return f" [{sum(res.seconds.values()):.1f} s{': ' + parts if parts else ''}]"


def _note_skipped(outcomes: list[CandidateResult], notes: list[str], say: Progress) -> bool:
    """Whether the time budget ran out during a round (some jobs skipped); notes which were skipped."""
    skipped = [r.spec.label for r in outcomes if r.skipped]
    if skipped:
        notes.append(f"time budget reached during the search: {len(skipped)} probe(s) not started "
                     f"({', '.join(skipped)}); the candidates measured so far were compared")
        say(f"[tune] time budget reached: {len(skipped)} probe(s) skipped; comparing what was measured")
    return bool(skipped)


def _probe_line(res: CandidateResult, base: Job) -> str:
    if res.error:
        return f"refused: {res.error}"
    loss = base.constraint.loss(Quality.from_metrics(res.quality), base.reference)
    verdict = "meets" if res.feasible else "misses"
    cached = " (cached)" if res.cached else ""
    return (f"MAC ratio {res.mac_ratio:.3f}, loss {loss:.4g} -> {verdict} {base.constraint.describe()}{cached}"
            if loss is not None else f"no {base.constraint.metric} measured")


def _over_budget(cfg: TuneConfig, t_start: float) -> bool:
    return cfg.time_budget_s is not None and time.perf_counter() - t_start > cfg.time_budget_s


def _qat_candidates(searches: dict[tuple[str, int], BudgetSearch], results: list[CandidateResult],
                    held_out: Dataset, original: Path, cfg: TuneConfig, base: Job, run: Executor, t_start: float,
                    notes: list[str], say: Progress, clock: "_Clock") -> list[CandidateResult]:
    """Quantisation-aware recovery at each recovered search's smallest feasible budget (its INT8 only), where the
    post-training INT8 of that recovered model misses the constraint in ONNX Runtime: quantisation-aware training
    changes the ranges, not the structure, so where plain INT8 already meets the constraint it could not give a
    faster file, and its recovery (the full cap again) is not spent."""
    if not (cfg.int8 and cfg.qat and cfg.recover_epochs) or _over_budget(cfg, t_start):
        return []
    specs = []
    for (m, e), s in searches.items():
        if e == 0 or s.smallest() is None:
            continue
        done = next((r for r in results if r.feasible and r.spec.variant is None and not r.spec.qat
                     and (r.spec.method, r.spec.mac_ratio, r.spec.recover_epochs) == (m, s.smallest(), e)), None)
        if done is None:
            continue
        spec = done.spec  # the rung it met the constraint at: its quantisation-aware copy gets the same recovery
        if "int8" in done.files and _int8_meets(done, held_out, original, base):
            notes.append(f"no quantisation-aware recovery for {spec.label}: its post-training INT8 already meets "
                         f"{base.constraint.describe()} in ONNX Runtime")
            continue
        specs.append(dataclasses.replace(spec, qat=True))
    if not specs:
        return []
    results = clock.run_round(run, [dataclasses.replace(base, spec=spec) for spec in specs],
                              "quantisation-aware recovery", base)
    _note_skipped(results, notes, say)
    return [r for r in results if not r.skipped]


def _int8_meets(res: CandidateResult, held_out: Dataset, original: Path, base: Job) -> bool:
    """Whether ``res``'s post-training INT8 file meets the constraint on the held-out data in ONNX Runtime, against
    the ``original`` fp32 file (as the tune judges every file)."""
    y = None if held_out.y is None else held_out.y.numpy()
    ref, m = evaluate_models(["original", res.spec.label], [original, Path(_cached_file(res, "int8"))],
                             feeds_of(held_out.x), y, 64, rb.BenchConfig().threads())
    return base.constraint.holds(Quality.from_metrics(dataclasses.asdict(m)),
                                 Quality.from_metrics(dataclasses.asdict(ref)))


def _candidate_phases(results: list[CandidateResult]) -> dict[str, float]:
    """Seconds the candidates spent, summed by phase (``prepare``, ``realise``, ``recover``, ``measure``,
    ``export``; cached candidates count nothing)."""
    out: dict[str, float] = {}
    for res in results:
        if res.cached or res.skipped:
            continue
        for k, v in res.seconds.items():
            out[k] = out.get(k, 0.0) + v
    return {k: round(v, 2) for k, v in out.items()}


def _structural(results: list[CandidateResult], models_dir: Path, cfg: TuneConfig) -> list[Candidate]:
    """Deployable files of the feasible results, copied from the cache into ``models/``."""
    out = []
    for res in results:
        if not res.feasible or "fp32" not in res.files:
            continue
        spec = res.spec
        kinds = [("int8", "int8-qat")] if spec.qat else [("fp32", "fp32"), *([("int8", "int8")] if cfg.int8 else [])]
        for kind, precision in kinds:
            if kind not in res.files:
                continue
            label = spec.label + (".int8" if kind == "int8" else "")
            path = models_dir / f"{label}.onnx"
            shutil.copyfile(_cached_file(res, kind), path)
            pt2 = None
            if kind == "fp32" and "pt2" in res.files:
                pt2 = str(models_dir / f"{spec.label}.pt2")
                shutil.copyfile(res.files["pt2"], pt2)
            out.append(Candidate(label, "structural", precision, str(path), path.stat().st_size, spec.method,
                                 res.mac_ratio or spec.mac_ratio, spec.recover_epochs, pt2=pt2))
    return out


def _cached_file(res: CandidateResult, kind: str) -> str:
    """A result's file in the candidate cache, which a worker on another machine may have written."""
    path = res.files[kind]
    if not Path(path).is_file():
        raise TuneError(f"{res.spec.label}'s {kind} file {path} is not visible on this machine: a worker elsewhere "
                        "wrote it, so --cache-dir must be on storage that every node mounts at the same path")
    return path


def _ort_quality(candidates: list[Candidate], held_out: Dataset, constraint: Constraint, folder: Path,
                 say: Progress) -> None:
    """ONNX Runtime's quality of every file on the held-out data; feasibility judged on it (what deploys)."""
    say(f"[tune] measuring {len(candidates)} files with ONNX Runtime on {len(held_out)} held-out samples")
    y = None if held_out.y is None else held_out.y.numpy()
    metrics = evaluate_models([c.label for c in candidates], [Path(c.onnx) for c in candidates],
                                 feeds_of(held_out.x), y, 64, rb.BenchConfig().threads())
    reference = Quality.from_metrics(dataclasses.asdict(metrics[0]))
    for c, m in zip(candidates, metrics):
        c.quality = {k: v for k, v in dataclasses.asdict(m).items() if k in ("accuracy", "top1_agreement", "mse")}
        q = Quality.from_metrics(c.quality)
        c.loss = constraint.loss(q, reference)
        c.feasible = c.label == "original" or constraint.holds(q, reference)


def _sizes(candidates: list[Candidate], cfg: TuneConfig, notes: list[str], say: Progress) -> None:
    """Each file's gzip-compressed bytes; ``--max-size``: a file over it is infeasible whatever its quality, the
    original's included (baselines are still timed, as references)."""
    from minreal.runtime_bench.model_info import gzip_bytes, model_files

    for c in candidates:
        c.gzip_bytes = gzip_bytes(model_files(Path(c.onnx)))
    over = [c for c in candidates if not cfg.fits(c.onnx_bytes)]
    for c in over:
        c.feasible = False
    if over:
        note = (f"{len(over)} of {len(candidates)} files exceed --max-size {cfg.max_size_kb:g} KB: "
                + ", ".join(f"{c.label} ({c.onnx_bytes / 1024:.1f} KB)" for c in over[:8])
                + (", ..." if len(over) > 8 else ""))
        notes.append(note)
        say(f"[tune] {note}")


def _ort_sizes(candidates: list[Candidate], cfg: TuneConfig, folder: Path, notes: list[str], say: Progress,
               clock: "_Clock") -> None:
    """``--format onnx,ort`` with ``--max-size`` or ``--objective size``: each file still feasible converted to ORT
    format in a scratch folder inside ``folder`` (removed after; no parity check: :func:`_chosen_ort` checks the
    chosen file's copy) with the settings :func:`_chosen_ort` uses; its ``.ort`` bytes recorded (what ``--objective
    size`` ranks), and a file whose ``.ort`` file is over the limit, or that the converter refuses, is infeasible
    (what ships is the ``.ort`` file)."""
    from minreal.export.errors import OrtConversionError
    from minreal.export.ort_format import convert_to_ort, ort_for_target

    todo, refused, t0 = [c for c in candidates if c.feasible], [], time.perf_counter()
    if not todo:  # every file is out already (the .onnx files' own size, or their quality)
        return
    with tempfile.TemporaryDirectory(prefix=".minreal-ort-sizes-", dir=folder) as scratch:
        for c in todo:
            dst = Path(scratch) / Path(c.onnx).with_suffix(".ort").name
            try:
                c.ort_bytes = convert_to_ort(c.onnx, dst, ort_for_target(cfg.ort, cfg.quant_target)).bytes
            except OrtConversionError as exc:
                c.feasible = False
                refused.append(f"{c.label} ({exc})")
    over = [c for c in todo if c.ort_bytes is not None and not cfg.fits(c.ort_bytes)]
    for c in over:
        c.feasible = False
    why = "judge --max-size on" if cfg.max_size_kb is not None else "rank --objective size by"
    over_text = f"{len(over)} over it, " if cfg.max_size_kb is not None else ""
    say(f"[tune] converted {len(todo) - len(refused)} feasible file(s) to ORT format to {why} their .ort files: "
        f"{over_text}{time.perf_counter() - t0:.1f} s; {clock.elapsed()}")
    if over:
        notes.append(f"{len(over)} of {len(todo)} files exceed --max-size {cfg.max_size_kb:g} KB as .ort (what "
                     "ships with --format onnx,ort), though their .onnx files fit: "
                     + ", ".join(f"{c.label} (.ort {c.ort_bytes / 1024:.1f} KB, .onnx {c.onnx_bytes / 1024:.1f} KB)"
                                 for c in over[:8]) + (", ..." if len(over) > 8 else ""))
        say(f"[tune] {notes[-1]}")
    if refused:
        notes.append(f"ONNX Runtime's converter refused {len(refused)} file(s), so they cannot ship as .ort: "
                     + "; ".join(refused))
        say(f"[tune] {notes[-1]}")


def _bench(candidates: list[Candidate], held_out: Dataset, cfg: TuneConfig, protocol: Protocol, say: Progress,
           run: Executor) -> BenchOutcome:
    """One timing pass on the target hardware (``run.on_target``); the report names the files in ``models/``."""
    bench_cfg = rb.BenchConfig(providers=cfg.providers, batch_sizes=cfg.batch_sizes, warmup=protocol.warmup,
                               min_runs=protocol.min_runs, min_seconds=protocol.min_seconds, repeats=protocol.repeats)
    y = None if held_out.y is None else held_out.y.numpy()
    job = BenchJob(tuple(c.label for c in candidates), tuple(Path(c.onnx).read_bytes() for c in candidates),
                   bench_cfg, feeds_of(held_out.x), y)
    outcome = run.on_target(functools.partial(bench_files, progress=say), job)
    paths = {c.label: c.onnx for c in candidates}
    for model in outcome.report["models"]:
        model["path"] = paths[model["name"]]
    return outcome


def _p50(bench: dict[str, Any]) -> dict[tuple[str, str], float]:
    return {(lat["model"], _cell(lat["provider"], lat["batch_size"])): lat["stats"]["p50_ms"]
            for lat in bench["latency"]}


def _points(candidates: list[Candidate], cell: str, which: str, constraint: Constraint) -> list[Point]:
    out = []
    for c in candidates:
        ms = getattr(c, which).get(cell)
        score = constraint.score(Quality.from_metrics(c.quality))
        if ms is not None and score is not None:
            out.append(Point(c.label, ms, score, c.shipped_bytes, c.feasible))
    return out


def _measure_and_choose(candidates: list[Candidate], held_out: Dataset, cfg: TuneConfig, folder: Path,
                        say: Progress, notes: list[str], run: Executor, phases: dict[str, float]) -> TuneReport:
    """Screen every feasible file, confirm the fronts (and the smallest feasible file for ``--objective size``) and
    the baselines, choose on the first cell, and say plainly what won."""
    feasible = [c for c in candidates if c.feasible or c.kind == "baseline"]
    say(f"[tune] screening {len(feasible)} files ({cfg.screen.min_seconds:g} s per model, 1 process)")
    t0 = time.perf_counter()
    screened = _bench(feasible, held_out, cfg, cfg.screen, say, run)
    phases["screen"] = time.perf_counter() - t0
    screen = screened.report
    for (label, cell), ms in _p50(screen).items():
        next(c for c in feasible if c.label == label).screen_ms[cell] = ms
    cells = [_cell(p, b) for p in cfg.providers for b in cfg.batch_sizes]
    front = {cell: [p.label for p in pareto_front([p for p in _points(feasible, cell, "screen_ms", cfg.constraint)
                                                       if p.feasible])] for cell in cells}
    keep = {c.label for c in feasible if c.kind == "baseline"} | {lb for labels in front.values() for lb in labels}
    smallest = choose(_points(feasible, cells[0], "screen_ms", cfg.constraint), "size")
    if cfg.objective == "size" and smallest is not None:
        keep.add(smallest.label)  # size needs no timing: the smallest feasible file competes whatever its latency
    confirmed = [c for c in feasible if c.label in keep]
    say(f"[tune] confirming {len(confirmed)} files (front and baselines) with the release protocol")
    t0 = time.perf_counter()
    confirmed_run = _bench(confirmed, held_out, cfg, cfg.confirm, say, run)
    phases["confirm"] = time.perf_counter() - t0
    confirm = confirmed_run.report
    _record_confirmation(confirmed, confirm)
    chosen, verdict = _choose(confirmed, candidates, cells[0], cfg, notes)
    say(f"[tune] {verdict}")
    if chosen is not None:
        _write_chosen(chosen, folder)
    chosen_ort = _chosen_ort(chosen, folder, held_out, cfg, notes, say) if cfg.ort is not None else None
    return TuneReport(TUNE_SCHEMA_VERSION, "tune", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
                      to_jsonable(cfg), cfg.describe_limits(), {}, [], candidates, front,
                      None if chosen is None else chosen.label, verdict, {}, 0.0,
                      relative_to(screen, folder), relative_to(confirm, folder),
                      measured_on={name: {"host": o.host, "pid": o.pid}
                                   for name, o in (("screen", screened), ("confirm", confirmed_run))},
                      chosen_ort=chosen_ort)


def _record_confirmation(confirmed: list[Candidate], confirm: dict[str, Any]) -> None:
    """Each confirmed file's p50 and its [fastest, slowest] per-process p50 by cell."""
    by_label = {c.label: c for c in confirmed}
    for lat in confirm["latency"]:
        c, cell = by_label[lat["model"]], _cell(lat["provider"], lat["batch_size"])
        per = lat.get("process_p50_ms") or [lat["stats"]["p50_ms"]]
        c.confirm_ms[cell], c.confirm_range_ms[cell] = lat["stats"]["p50_ms"], [min(per), max(per)]


def _write_chosen(c: Candidate, folder: Path) -> None:
    shutil.copyfile(c.onnx, folder / "chosen.onnx")
    pt2 = c.pt2 if c.precision == "fp32" else None
    if pt2:
        shutil.copyfile(pt2, folder / "chosen.pt2")


def _chosen_ort(chosen: Candidate | None, folder: Path, held_out: Dataset, cfg: TuneConfig, notes: list[str],
                say: Progress) -> dict[str, Any] | None:
    """``chosen.ort`` and ``chosen.required_operators.config`` (``--format onnx,ort``), checked against ``chosen.onnx``
    on held-out rows at the parity batch sizes, converted for the platform of the tune's INT8 target
    (:func:`minreal.export.ort_format.ort_for_target`: ``arm`` for arm64, none otherwise), fp32 or INT8. Nothing chosen:
    nothing converted, and a note says so. With ``--max-size`` the chosen file's ``.ort`` size was judged already
    (:func:`_ort_sizes`); a note says if this conversion's size differs."""
    from minreal.export.ort_format import ort_copy
    from minreal.export.variant import parity_inputs
    from minreal.runtime_bench.model_info import gzip_bytes

    if chosen is None:
        notes.append("--format onnx,ort: no model was chosen, so nothing was converted to ORT format")
        return None
    say("[tune] converting chosen.onnx to ORT format (chosen.ort) and checking it against chosen.onnx")
    feeds = [feeds_of(x) for x in parity_inputs(held_out.x, cfg.dynamic_axes or None)]
    record = ort_copy(folder / "chosen.onnx", feeds, cfg.ort, quant_target=cfg.quant_target)
    if chosen.ort_bytes is not None and record["bytes"] != chosen.ort_bytes:  # same file, same settings: the
        # converter is not known to vary, but --max-size judged the scratch copy, so a difference is told
        fits = "within" if cfg.fits(record["bytes"]) else "WARNING: over"
        note = (f"chosen.ort is {record['bytes']} bytes, not the {chosen.ort_bytes} bytes of the conversion --max-size "
                f"judged ({fits} --max-size {cfg.max_size_kb:g} KB)")
        notes.append(note)
        say(f"[tune] {note}")
    return {**record, "gzip_bytes": gzip_bytes([folder / record["path"]])}


def _choose(confirmed: list[Candidate], candidates: list[Candidate], cell: str, cfg: TuneConfig,
            notes: list[str]) -> tuple[Candidate | None, str]:
    """The chosen file and the one-line verdict: the winner and its margins over the baselines, or plainly that
    nothing structural beats them (and why). A latency win that does not hold in every fresh process against a
    baseline is a tie, and a tie goes to the baseline."""
    best = choose(_points(confirmed, cell, "confirm_ms", cfg.constraint), cfg.objective)
    if best is None:
        return None, f"no model meets {cfg.describe_limits()} on the held-out data, not even the original's"
    by_label = {c.label: c for c in confirmed}
    win, size = by_label[best.label], cfg.objective == "size"
    base = [c for c in confirmed if c.kind == "baseline" and c.feasible and cell in c.confirm_ms]
    unit = "KB" if size else f"ms p50 on {cell}"

    def value(c: Candidate) -> float:
        return c.shipped_bytes / 1024 if size else c.confirm_ms[cell]

    tied = [] if size else [b for b in base if win.kind == "structural"
                            and win.confirm_range_ms[cell][1] >= b.confirm_range_ms[cell][0]]
    if win.kind == "structural" and not tied:
        margins = ", ".join(f"{value(win) / value(b):.2f}x of {b.label}" for b in base)
        spread = "" if size else "; faster in every confirmation process"
        return win, (f"{win.label} wins: {value(win):.4g} {unit} ({margins or 'no baseline measured'}), loss "
                     f"{win.loss:.3g} within {cfg.describe_limits()}{spread}")
    if tied:
        fallback = min(tied, key=value)
        notes.append(f"{win.label} had the lowest p50 ({value(win):.4g} ms) but not in every confirmation process "
                     f"against {', '.join(b.label for b in tied)}: a tie on this machine, which goes to the baseline")
        return fallback, (f"no structural candidate reliably beats the baselines: {fallback.label} is chosen "
                          f"({win.label} was {value(win) / value(fallback):.2f}x of it by p50, within the spread "
                          "over processes)")
    why = _why_not(confirmed, candidates, value, unit, win, notes)
    return win, f"no structural candidate beats the baselines: {win.label} is best ({why})"


def _why_not(confirmed: list[Candidate], candidates: list[Candidate], value: Callable[[Candidate], float],
             unit: str, win: Candidate, notes: list[str]) -> str:
    """Why no structural candidate won: none met the constraint, none reached the confirmation, or the best one's
    number."""
    structural = [c for c in confirmed if c.kind == "structural" and c.feasible]
    if structural:
        best = min(structural, key=value)
        return f"the best structural candidate, {best.label}, needs {value(best):.4g} {unit} vs {value(win):.4g}"
    if not [c for c in candidates if c.kind == "structural"]:
        cut = "; the time budget cut the search short" if any("time budget" in n for n in notes) else ""
        return f"no structural candidate met the constraint in torch (see the searches){cut}"
    if not [c for c in candidates if c.kind == "structural" and c.feasible]:
        return "no structural candidate kept the constraint in ONNX Runtime"
    return "no structural candidate reached the front of the screening"


def _search_record(key: tuple[str, int], s: BudgetSearch) -> dict[str, Any]:
    return {"method": key[0], "recover_epochs": key[1], "monotone": s.monotone, "smallest_feasible": s.smallest(),
            "abandoned": s.abandoned,
            "probes": [dataclasses.asdict(p) for p in sorted(s.probes.values(), key=lambda p: -p.budget)]}


def _counts(results: list[CandidateResult], candidates: list[Candidate]) -> dict[str, int]:
    return {"evaluated": len(results), "cached": sum(r.cached for r in results),
            "refused": sum(r.error is not None for r in results),
            "feasible_in_torch": sum(r.feasible for r in results),
            "files": len(candidates), "screened": sum(bool(c.screen_ms) for c in candidates),
            "screened_out": sum(not c.feasible for c in candidates),
            "confirmed": sum(bool(c.confirm_ms) for c in candidates)}
