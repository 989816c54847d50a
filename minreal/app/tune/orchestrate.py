"""`minreal tune`'s entry point, :func:`tune`: the fastest deployable model within a quality constraint, measured on
the target provider, against the baselines users would pick instead (the original in fp32, in INT8, and in INT8
with accuracy control).

Order of work, cheapest first: each method's MAC budget is bisected on held-out quality in torch
(:mod:`.search`); only candidates that meet the constraint are exported and quantised; ONNX Runtime's quality of
every file decides which stay (:mod:`.measure`); all of those are timed with the short protocol, and only the Pareto
front of each (provider, batch) cell plus the baselines is timed again with the release protocol in fresh processes
(:mod:`.choice`). The choice and the verdict come from that confirmation; :mod:`.output` writes the chosen files.

Candidates run through the executor's ``map``; both timing passes run through its ``on_target`` (a
:class:`~.measure.BenchJob` that carries the files' bytes), so a distributed executor can keep latency on the target
hardware. This module only orders those steps: it is named for that, not ``run``, which is the ``minreal run``
command's module (:mod:`minreal.app.commands.run`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torch import nn

from minreal.compress import get_method
from minreal.compress.core.data import Dataset
from minreal.compress.core.recover import held_out_metrics
from minreal.export.int8 import QuantResult, resolve_target
from minreal.export.int8.calibration import calibrations_kept
from minreal.export.json_safe import to_jsonable
from minreal.export.record import VariantRecord
from minreal.export.settings import VariantConfig
from minreal.export.variant import export_variant, quantize_variant, relative_to
from minreal.export.verify import feeds_of
from minreal.facts import ARM64_TARGET, CPU_AVX2_TARGET, CPU_VNNI_TARGET
from minreal.runtime_bench.config import BenchConfig
from minreal.runtime_bench.metrics import reference_outputs_kept

from .candidate import (
    CandidateResult,
    CandidateSpec,
    Job,
    LoadedSource,
    cached_file,
    export_settings,
    fingerprint,
    release_outputs,
)
from .choice import choose_candidate, fronts, to_confirm
from .config import Constraint, Quality, TuneConfig, TuneError
from .executor import Executor, InlineExecutor
from .measure import (
    bench_on_target,
    file_sizes,
    ort_quality,
    ort_sizes,
    p50_by_cell,
    record_confirmation,
    screen_references,
    structure_screen,
)
from .model import TUNE_SCHEMA_VERSION, Candidate, Progress, TuneReport, cell_name
from .output import write_chosen, write_chosen_ort
from .search import Clock, default_methods, qat_candidates, search_record, search_rounds, with_chains

__all__ = ["tune"]

log = logging.getLogger(__name__)


def tune(model: nn.Module, calib: Dataset, held_out: Dataset, cfg: TuneConfig, folder: Path, cache_dir: Path,
         source: Any = None, executor: Executor | None = None, progress: Progress | None = None) -> TuneReport:
    """Search, measure and choose; every file lands in ``folder`` (``models/``, ``chosen.onnx``, ``chosen.pt2``).

    ``source`` tells workers how to load the inputs again (:class:`~.candidate.SpecSource`); default: the objects
    given (:class:`~.candidate.LoadedSource`, only for an in-process executor). Results are cached in
    ``cache_dir`` by inputs and candidate, so a repeated or interrupted tune resumes. The original's outputs on the
    held-out data are computed once in ONNX Runtime, the reference of every file's agreement
    (:func:`~minreal.runtime_bench.metrics.reference_outputs_kept`).
    """
    try:
        with reference_outputs_kept(folder / "models" / "original.onnx"):
            return _tune(model, calib, held_out, cfg, folder, cache_dir, source, executor, progress)
    finally:
        release_outputs()  # this process's, kept for an in-process executor (workers keep theirs per tune inputs)


def _tune(model: nn.Module, calib: Dataset, held_out: Dataset, cfg: TuneConfig, folder: Path, cache_dir: Path,
          source: Any, executor: Executor | None, progress: Progress | None) -> TuneReport:
    t_start, say = time.perf_counter(), progress or log.info
    run = executor or InlineExecutor()
    # "cpu" is the format of the machine the latency is measured on (a Ray cluster's bench node, not this driver)
    cfg = cfg.with_variant(quant_target=run.on_target(resolve_target, cfg.quant_target))
    if held_out is None or len(held_out) == 0:
        raise TuneError("tune needs held-out data: pass --eval-data (or data with room for a held-out split)")
    methods = cfg.methods or (() if cfg.plan else default_methods())
    for m in methods:
        if why := get_method(m).unsearchable:
            raise TuneError(f"tune cannot search method {m!r}: {why} (a plan file's variant runs it as given); "
                            f"choose from {', '.join(default_methods())}")
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
                   fingerprint(model, calib, held_out), Path(cache_dir), cfg.constraint, reference, cfg.bench.providers,
                   cfg.quant_target, cfg.int8, tuple(sorted(cfg.extra.items())),
                   hashlib.sha256((models_dir / "original.onnx").read_bytes()).hexdigest(),
                   tuple((n, tuple(sorted(per.items()))) for n, per in sorted(cfg.dynamic_axes.items())),
                   stats_samples=cfg.stats_samples, export=export_settings(cfg.variant, cfg.int8),
                   deadline=None if cfg.time_budget_s is None
                   else time.time() + cfg.time_budget_s - (time.perf_counter() - t_start))
    phases = {"baselines": time.perf_counter() - t_baselines}
    try:
        t0 = time.perf_counter()
        clock = Clock(t_start, say, cfg.workers, len(calib))
        screen = _structure_screen(baselines, held_out, cfg, folder, say, run, phases)
        searches, halving, results = search_rounds(methods, cfg, job_base, run, t_start, notes, say, clock, screen)
        results += qat_candidates(searches, results, held_out, models_dir / "original.onnx", cfg, job_base, run,
                                   t_start, notes, say, clock)
        phases["search"] = time.perf_counter() - t0
        # the compressed graph holds only where its traced decisions keep their outcome: said once per method, now
        warned = list(dict.fromkeys(f"{r.spec.method}: {w}" for r in results if r.error is None for w in r.warnings))
        for said in warned:
            say(f"[tune] WARNING: {said}")
        candidates = baselines + _structural(results, models_dir, cfg)
        t0 = time.perf_counter()
        ort_quality(candidates, held_out, cfg.constraint, folder, say)
        file_sizes(candidates, cfg, notes, say)
        phases["ort_quality"] = phases.get("ort_quality", 0.0) + time.perf_counter() - t0
        if cfg.ort is not None and (cfg.max_size_kb is not None or cfg.objective == "size"):  # the .ort file ships
            t0 = time.perf_counter()
            ort_sizes(candidates, cfg, folder, notes, say, clock)
            phases["ort_sizes"] = time.perf_counter() - t0
        report = _measure_and_choose(candidates, held_out, cfg, folder, say, notes, run, phases)
    except BaseException:
        run.close(abort=True)
        raise
    if executor is None:
        run.close()
    report.searches = [search_record(k, s) for k, s in searches.items()]
    report.halving = None if halving is None else halving.record()
    report.phases_s = {**_candidate_phases(results), **{k: round(v, 2) for k, v in phases.items()}}
    report.reference = {"torch": dataclasses.asdict(reference)}
    one = 100.0 / len(held_out)
    notes.append(f"held-out data: {len(held_out)} samples, so one sample is {one:.3g} pp of accuracy; "
                 + ("too few to resolve the constraint reliably" if one > 0.5 * _limit_pp(cfg.constraint) else
                    "the same samples judge every candidate (and rank accuracy control's layers)"))
    notes += [f"WARNING: {said}" for said in warned]
    report.notes = notes
    report.counts = _counts(results, candidates)
    report.wall_s = time.perf_counter() - t_start
    return report


class _Screen:
    """The race's structure screen (:class:`.search.StructureScreen`): it compares with the baselines that meet the
    constraint, so their ONNX Runtime quality is measured first (once: the later measurement keeps it); its seconds
    go to ``phases`` (``structure_files``: the jobs exporting the zero-shot structures, summed over jobs;
    ``structure_screen``: timing them)."""

    def __init__(self, baselines: list[Candidate], held_out: Dataset, cfg: TuneConfig, folder: Path, say: Progress,
                 run: Executor, phases: dict[str, float]) -> None:
        self.baselines, self.held_out, self.cfg, self.folder = baselines, held_out, cfg, folder
        self.say, self.run, self.phases = say, run, phases

    def ready(self) -> str | None:
        t0 = time.perf_counter()
        if not self.baselines[0].quality:
            ort_quality(self.baselines, self.held_out, self.cfg.constraint, self.folder, self.say,
                        what="the baselines' quality")
        self.phases["ort_quality"] = self.phases.get("ort_quality", 0.0) + time.perf_counter() - t0
        if screen_references(self.baselines, self.cfg):
            return None
        return "no baseline meets the constraint" + (" within --max-size" if self.cfg.max_size_kb is not None else "")

    def __call__(self, results: list[CandidateResult]) -> dict[tuple[str, float], dict[str, float]]:
        self.phases["structure_files"] = float(sum(sum(r.seconds.values()) for r in results if not r.cached))
        t0 = time.perf_counter()
        out = structure_screen(results, self.baselines, self.held_out, self.cfg, self.say, self.run)
        self.phases["structure_screen"] = time.perf_counter() - t0
        return out


def _structure_screen(baselines: list[Candidate], held_out: Dataset, cfg: TuneConfig, folder: Path, say: Progress,
                      run: Executor, phases: dict[str, float]) -> _Screen | None:
    """The race's structure screen for the latency objective with recovery (:class:`_Screen`), or None."""
    if cfg.objective != "latency" or not cfg.recover_epochs or not cfg.structure_screen:
        return None
    return _Screen(baselines, held_out, cfg, folder, say, run, phases)


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
    """The original in fp32 and INT8 and, when INT8 misses the constraint, INT8 with accuracy control (which finds the
    original's graph calibrated on its rows already: :func:`~minreal.export.int8.calibration.calibrations_kept`)."""
    with calibrations_kept():
        return _baseline_files(model, calib, held_out, cfg, models_dir, notes, say)


def _baseline_files(model: nn.Module, calib: Dataset, held_out: Dataset, cfg: TuneConfig, models_dir: Path,
                    notes: list[str], say: Progress) -> list[Candidate]:
    vcfg = cfg.variant
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
    from minreal.export.variant import calibration_rows

    c = cfg.constraint
    metric, max_drop = {"accuracy": ("accuracy", c.max_accuracy_drop),
                        "agreement": ("agreement", None if c.min_agreement is None else 100 * (1 - c.min_agreement)),
                        "mse": ("mse", c.max_mse_increase)}[c.metric]
    path = models_dir / "original.int8-ac.onnx"
    say(f"[tune] original INT8 with accuracy control ({metric}, allowed drop {max_drop:g})")
    res = quantize_with_accuracy_control(
        models_dir / "original.onnx", path, feeds_of(calibration_rows(calib.x, vcfg.calib_samples)),
        feeds_of(held_out.x),
        None if held_out.y is None or metric == "agreement" else held_out.y.numpy(), max_drop, vcfg.quant_config(),
        metric=metric, int8=None if plain is None else _quant_result(plain, models_dir),
        threads=BenchConfig().threads())  # as every held-out measurement: the original's outputs are computed once
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
            shutil.copyfile(cached_file(res, kind), path)
            pt2 = None
            if kind == "fp32" and "pt2" in res.files:
                pt2 = str(models_dir / f"{spec.label}.pt2")
                shutil.copyfile(res.files["pt2"], pt2)
            out.append(Candidate(label, "structural", precision, str(path), path.stat().st_size, spec.method,
                                 res.mac_ratio or spec.mac_ratio, spec.recover_epochs, pt2=pt2))
    return out


def _measure_and_choose(candidates: list[Candidate], held_out: Dataset, cfg: TuneConfig, folder: Path,
                        say: Progress, notes: list[str], run: Executor, phases: dict[str, float]) -> TuneReport:
    """Screen every feasible file, confirm the fronts (and the smallest feasible file for ``--objective size``) and
    the baselines, choose on the first cell, and say plainly what won."""
    feasible = [c for c in candidates if c.feasible or c.kind == "baseline"]
    say(f"[tune] screening {len(feasible)} files ({cfg.screen.min_seconds:g} s per model, 1 process)")
    t0 = time.perf_counter()
    screened = bench_on_target(feasible, held_out, cfg, cfg.screen, say, run, quality=False)
    phases["screen"] = time.perf_counter() - t0
    screen = screened.report
    for (label, cell), ms in p50_by_cell(screen).items():
        next(c for c in feasible if c.label == label).screen_ms[cell] = ms
    cells = [cell_name(p, b) for p in cfg.bench.providers for b in cfg.bench.batch_sizes]
    front = fronts(feasible, cells, cfg.constraint)
    confirmed = to_confirm(feasible, front, cells[0], cfg)
    say(f"[tune] confirming {len(confirmed)} files (front and baselines) with the release protocol")
    t0 = time.perf_counter()
    confirmed_run = bench_on_target(confirmed, held_out, cfg, cfg.confirm, say, run)
    phases["confirm"] = time.perf_counter() - t0
    confirm = confirmed_run.report
    record_confirmation(confirmed, confirm)
    chosen, verdict = choose_candidate(confirmed, candidates, cells[0], cfg, notes)
    say(f"[tune] {verdict}")
    if chosen is not None:
        write_chosen(chosen, folder)
    chosen_ort = write_chosen_ort(chosen, folder, held_out, cfg, notes, say) if cfg.ort is not None else None
    return TuneReport(TUNE_SCHEMA_VERSION, "tune", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
                      _config_json(cfg), cfg.describe_limits(), {}, [], candidates, front,
                      None if chosen is None else chosen.label, verdict, {}, 0.0,
                      relative_to(screen, folder), relative_to(confirm, folder),
                      measured_on={name: {"host": o.host, "pid": o.pid}
                                   for name, o in (("screen", screened), ("confirm", confirmed_run))},
                      chosen_ort=chosen_ort)


def _config_json(cfg: TuneConfig) -> dict[str, Any]:
    """``report.json``'s config: :meth:`TuneConfig.to_json`'s layout and, only where the tune's export settings
    differ from the defaults (:func:`export_settings`: those its files depend on), ``export`` after them, so that a
    default tune's report keeps its layout."""
    export = export_settings(cfg.variant, cfg.int8)
    return {**to_jsonable(cfg), **({"export": to_jsonable(dict(export))} if export else {})}


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


def _counts(results: list[CandidateResult], candidates: list[Candidate]) -> dict[str, int]:
    return {"evaluated": len(results), "cached": sum(r.cached for r in results),
            "refused": sum(r.error is not None for r in results),
            "feasible_in_torch": sum(r.feasible for r in results),
            "files": len(candidates), "screened": sum(bool(c.screen_ms) for c in candidates),
            "screened_out": sum(not c.feasible for c in candidates),
            "confirmed": sum(bool(c.confirm_ms) for c in candidates)}
