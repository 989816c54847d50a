"""`minreal tune`: the fastest deployable model within a quality constraint, measured on the target provider,
against the baselines users would pick instead (the original in fp32, in INT8, and in INT8 with accuracy control).

Order of work, cheapest first: each method's MAC budget is bisected on held-out quality in torch
(:mod:`.search`); only candidates that meet the constraint are exported and quantised; ONNX Runtime's quality of
every file decides which stay; all of those are timed with the short protocol, and only the Pareto front of each
(provider, batch) cell plus the baselines is timed again with the release protocol in fresh processes. The choice
and the verdict come from that confirmation.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from torch import nn

import runtime_bench as rb
from runtime_bench.metrics import evaluate_models
from compress import get_method, method_names
from compress.core.data import Dataset
from compress.core.recover import held_out_metrics
from export.variant import VariantConfig, export_variant, quantize_variant, relative_to, to_jsonable
from .candidate import CandidateResult, CandidateSpec, Job, LoadedSource, evaluate_candidate, fingerprint
from .config import Constraint, Protocol, Quality, TuneConfig, TuneError
from .executor import Executor, InlineExecutor
from .front import Point, choose, pareto_front
from .search import BudgetSearch

__all__ = ["tune", "TuneReport", "Candidate", "TUNE_SCHEMA_VERSION", "default_methods", "BASELINES"]

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


def default_methods() -> tuple[str, ...]:
    """Every registered method that takes a whole-model MAC budget."""
    return tuple(n for n in method_names() if "mac_ratio" in get_method(n).budgets)


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
    if held_out is None or len(held_out) == 0:
        raise TuneError("tune needs held-out data: pass --eval-data (or data with room for a held-out split)")
    methods = cfg.methods or (() if cfg.plan else default_methods())
    for m in methods:
        if "mac_ratio" not in get_method(m).budgets:
            raise TuneError(f"method {m!r} has no whole-model MAC budget, so tune cannot search it; choose from "
                            f"{', '.join(default_methods())}")
    models_dir = folder / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    reference = Quality.from_metrics(held_out_metrics(model, model, held_out))
    notes: list[str] = []
    say(f"[tune] baselines: original fp32 and INT8 ({cfg.quant_target})")
    baselines = _baselines(model, calib, held_out, cfg, models_dir, reference, notes, say)
    job_base = Job(CandidateSpec("", 1.0), source or LoadedSource(model, calib, held_out),
                   fingerprint(model, calib, held_out), Path(cache_dir), cfg.constraint, reference, cfg.providers,
                   cfg.quant_target, cfg.int8, tuple(sorted(cfg.extra.items())))
    run = executor or InlineExecutor()
    try:
        searches, results = _search(methods, cfg, job_base, run, t_start, notes, say)
        results += _qat_candidates(searches, cfg, job_base, run, say)
    finally:
        if executor is None:
            run.close()
    candidates = baselines + _structural(results, models_dir, cfg)
    _ort_quality(candidates, held_out, cfg.constraint, folder, say)
    report = _measure_and_choose(candidates, held_out, cfg, folder, say)
    report.searches = [_search_record(k, s) for k, s in searches.items()]
    report.reference = {"torch": dataclasses.asdict(reference)}
    report.notes = notes + report.notes
    report.counts = _counts(results, candidates)
    report.wall_s = time.perf_counter() - t_start
    return report


def _baselines(model: nn.Module, calib: Dataset, held_out: Dataset, cfg: TuneConfig, models_dir: Path,
               reference: Quality, notes: list[str], say: Progress) -> list[Candidate]:
    """The original in fp32 and INT8 and, when INT8 misses the constraint, INT8 with accuracy control."""
    vcfg = VariantConfig(quant_target=cfg.quant_target)
    rec = export_variant(model, held_out.x, models_dir / "original.onnx", vcfg, "original")
    out = [Candidate("original", "baseline", "fp32", str(models_dir / rec.onnx), rec.onnx_bytes, feasible=True)]
    if cfg.int8:
        q = quantize_variant(rec, models_dir, calib.x, vcfg)
        out.append(Candidate("original.int8", "baseline", "int8", str(models_dir / q.onnx), q.onnx_bytes))
        if cfg.accuracy_control:
            out += _accuracy_controlled(models_dir, calib, held_out, cfg, vcfg, notes, say)
    return out


def _accuracy_controlled(models_dir: Path, calib: Dataset, held_out: Dataset, cfg: TuneConfig, vcfg: VariantConfig,
                         notes: list[str], say: Progress) -> list[Candidate]:
    """The original in INT8 with its most sensitive layers left in float until the constraint holds (none when the
    plain INT8 already meets it: the same file)."""
    from export.accuracy_control import quantize_with_accuracy_control

    c = cfg.constraint
    metric, max_drop = {"accuracy": ("accuracy", c.max_accuracy_drop),
                        "agreement": ("agreement", None if c.min_agreement is None else 100 * (1 - c.min_agreement)),
                        "mse": ("mse", c.max_mse_increase)}[c.metric]
    path = models_dir / "original.int8-ac.onnx"
    say(f"[tune] original INT8 with accuracy control ({metric}, allowed drop {max_drop:g})")
    res = quantize_with_accuracy_control(
        models_dir / "original.onnx", path, calib.x[: vcfg.calib_samples].numpy(), held_out.x.numpy(),
        None if held_out.y is None or metric == "agreement" else held_out.y.numpy(), max_drop, vcfg.quant_config(),
        metric=metric)
    if not res.excluded:
        path.unlink(missing_ok=True)
        notes.append("the original's INT8 already meets the constraint: accuracy control left every layer quantised"
                     if res.met else "accuracy control found no layer whose float fallback helps")
        return []
    notes.append(f"accuracy control left {len(res.excluded)} of the original's layers in float "
                 f"({', '.join(res.excluded_nodes)}); drop {res.drop:.3g} ({'met' if res.met else 'NOT met'})")
    return [Candidate("original.int8-ac", "baseline", "int8-ac", str(path), path.stat().st_size)]


def _search(methods: Sequence[str], cfg: TuneConfig, base: Job, run: Executor, t_start: float, notes: list[str],
            say: Progress) -> tuple[dict[tuple[str, int], BudgetSearch], list[CandidateResult]]:
    """Rounds of bisection steps, one step of every unfinished (method, recovery) search per round."""
    searches = {(m, e): BudgetSearch(cfg.grid) for m in methods for e in cfg.recovery_budgets}
    fixed = [dataclasses.replace(base, spec=CandidateSpec(v.label, 1.0, e, variant=v))
             for v in cfg.plan for e in cfg.recovery_budgets]
    results: list[CandidateResult] = run.map(evaluate_candidate, fixed) if fixed else []
    for res in results:
        say(f"[tune] plan variant {res.spec.label}: {_probe_line(res, base)}")
    while True:
        if cfg.time_budget_s is not None and time.perf_counter() - t_start > cfg.time_budget_s:
            notes.append(f"time budget of {cfg.time_budget_s:.0f} s reached: the search stopped early and the "
                         "candidates measured so far were compared")
            say("[tune] time budget reached; comparing what was measured")
            break
        steps = [(k, b) for k, s in searches.items() if (b := s.next_budget()) is not None]
        if not steps:
            break
        jobs = [dataclasses.replace(base, spec=CandidateSpec(m, b, e)) for (m, e), b in steps]
        for ((m, e), b), res in zip(steps, run.map(evaluate_candidate, jobs)):
            results.append(res)
            search = searches[(m, e)]
            search.record(b, res.feasible, base.constraint.score(Quality.from_metrics(res.quality)))
            say(f"[tune] {res.spec.label}: {_probe_line(res, base)}")
            if res.error and len(search.probes) >= 2 and all(p.score is None for p in search.probes.values()):
                search.abandoned = res.error
    return searches, results


def _probe_line(res: CandidateResult, base: Job) -> str:
    if res.error:
        return f"refused: {res.error}"
    loss = base.constraint.loss(Quality.from_metrics(res.quality), base.reference)
    verdict = "meets" if res.feasible else "misses"
    cached = " (cached)" if res.cached else ""
    return (f"MAC ratio {res.mac_ratio:.3f}, loss {loss:.4g} -> {verdict} {base.constraint.describe()}{cached}"
            if loss is not None else f"no {base.constraint.metric} measured")


def _qat_candidates(searches: dict[tuple[str, int], BudgetSearch], cfg: TuneConfig, base: Job, run: Executor,
                    say: Progress) -> list[CandidateResult]:
    """Quantisation-aware recovery at each recovered search's smallest feasible budget (its INT8 only)."""
    if not (cfg.int8 and cfg.qat and cfg.recover_epochs):
        return []
    specs = [CandidateSpec(m, s.smallest(), e, qat=True) for (m, e), s in searches.items()
             if e > 0 and s.smallest() is not None]
    results = run.map(evaluate_candidate, [dataclasses.replace(base, spec=spec) for spec in specs])
    for res in results:
        say(f"[tune] {res.spec.label}: {_probe_line(res, base)}")
    return results


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
            shutil.copyfile(res.files[kind], path)
            pt2 = None
            if kind == "fp32" and "pt2" in res.files:
                pt2 = str(models_dir / f"{spec.label}.pt2")
                shutil.copyfile(res.files["pt2"], pt2)
            out.append(Candidate(label, "structural", precision, str(path), path.stat().st_size, spec.method,
                                 res.mac_ratio or spec.mac_ratio, spec.recover_epochs, pt2=pt2))
    return out


def _ort_quality(candidates: list[Candidate], held_out: Dataset, constraint: Constraint, folder: Path,
                 say: Progress) -> None:
    """ONNX Runtime's quality of every file on the held-out data; feasibility judged on it (what deploys)."""
    say(f"[tune] measuring {len(candidates)} files with ONNX Runtime on {len(held_out)} held-out samples")
    y = None if held_out.y is None else held_out.y.numpy()
    metrics = evaluate_models([c.label for c in candidates], [Path(c.onnx) for c in candidates],
                                 held_out.x.numpy(), y, 64, rb.BenchConfig().threads())
    reference = Quality.from_metrics(dataclasses.asdict(metrics[0]))
    for c, m in zip(candidates, metrics):
        c.quality = {k: v for k, v in dataclasses.asdict(m).items() if k in ("accuracy", "top1_agreement", "mse")}
        q = Quality.from_metrics(c.quality)
        c.loss = constraint.loss(q, reference)
        c.feasible = c.label == "original" or constraint.holds(q, reference)


def _bench(candidates: list[Candidate], held_out: Dataset, cfg: TuneConfig, protocol: Protocol,
           say: Progress) -> dict[str, Any]:
    bench_cfg = rb.BenchConfig(providers=cfg.providers, batch_sizes=cfg.batch_sizes, warmup=protocol.warmup,
                               min_runs=protocol.min_runs, min_seconds=protocol.min_seconds, repeats=protocol.repeats)
    y = None if held_out.y is None else held_out.y.numpy()
    entries = [rb.ModelEntry(c.label, Path(c.onnx)) for c in candidates]
    report = rb.run_benchmark(entries, bench_cfg, held_out.x.numpy(), y, progress=say, fail_on_unavailable=True)
    return to_jsonable(report)


def _p50(bench: dict[str, Any]) -> dict[tuple[str, str], float]:
    return {(lat["model"], _cell(lat["provider"], lat["batch_size"])): lat["stats"]["p50_ms"]
            for lat in bench["latency"]}


def _points(candidates: list[Candidate], cell: str, which: str, constraint: Constraint) -> list[Point]:
    out = []
    for c in candidates:
        ms = getattr(c, which).get(cell)
        score = constraint.score(Quality.from_metrics(c.quality))
        if ms is not None and score is not None:
            out.append(Point(c.label, ms, score, c.onnx_bytes, c.feasible))
    return out


def _measure_and_choose(candidates: list[Candidate], held_out: Dataset, cfg: TuneConfig, folder: Path,
                        say: Progress) -> TuneReport:
    feasible = [c for c in candidates if c.feasible or c.kind == "baseline"]
    say(f"[tune] screening {len(feasible)} files ({cfg.screen.min_seconds:g} s per model, 1 process)")
    screen = _bench(feasible, held_out, cfg, cfg.screen, say)
    for (label, cell), ms in _p50(screen).items():
        next(c for c in feasible if c.label == label).screen_ms[cell] = ms
    cells = [_cell(p, b) for p in cfg.providers for b in cfg.batch_sizes]
    front = {cell: [p.label for p in pareto_front([p for p in _points(feasible, cell, "screen_ms", cfg.constraint)
                                                       if p.feasible])] for cell in cells}
    keep = {c.label for c in feasible if c.kind == "baseline"} | {lb for labels in front.values() for lb in labels}
    confirmed = [c for c in feasible if c.label in keep]
    say(f"[tune] confirming {len(confirmed)} files (front and baselines) with the release protocol")
    confirm = _bench(confirmed, held_out, cfg, cfg.confirm, say)
    for (label, cell), ms in _p50(confirm).items():
        next(c for c in confirmed if c.label == label).confirm_ms[cell] = ms
    for lat in confirm["latency"]:
        per = lat.get("process_p50_ms") or [lat["stats"]["p50_ms"]]
        c = next(c for c in confirmed if c.label == lat["model"])
        c.confirm_range_ms[_cell(lat["provider"], lat["batch_size"])] = [min(per), max(per)]
    chosen = choose(_points(confirmed, cells[0], "confirm_ms", cfg.constraint), cfg.objective)
    verdict = _verdict(confirmed, candidates, chosen, cells[0], cfg)
    say(f"[tune] {verdict}")
    if chosen is not None:
        _write_chosen(next(c for c in candidates if c.label == chosen.label), folder)
    return TuneReport(TUNE_SCHEMA_VERSION, "tune", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
                      to_jsonable(cfg), cfg.constraint.describe(), {}, [], candidates, front,
                      None if chosen is None else chosen.label, verdict, {}, 0.0,
                      relative_to(screen, folder), relative_to(confirm, folder))


def _write_chosen(c: Candidate, folder: Path) -> None:
    shutil.copyfile(c.onnx, folder / "chosen.onnx")
    pt2 = c.pt2 if c.precision == "fp32" else None
    if pt2:
        shutil.copyfile(pt2, folder / "chosen.pt2")


def _verdict(confirmed: list[Candidate], candidates: list[Candidate], chosen: Point | None, cell: str,
             cfg: TuneConfig) -> str:
    """One line: the winner and its margin over INT8-of-original, or plainly that nothing structural beats the
    baselines (and why)."""
    if chosen is None:
        return f"no model meets {cfg.constraint.describe()} on the held-out data, not even the original's INT8"
    by_label = {c.label: c for c in confirmed}
    win = by_label[chosen.label]
    key = "onnx_bytes" if cfg.objective == "size" else "latency"

    def value(c: Candidate) -> float | None:
        return float(c.onnx_bytes) if key == "onnx_bytes" else c.confirm_ms.get(cell)

    base = [by_label[lb] for lb in ("original.int8", "original") if lb in by_label and by_label[lb].feasible]
    ref = base[0] if base else by_label.get("original")
    unit = "bytes" if key == "onnx_bytes" else f"ms p50 on {cell}"
    if win.kind == "structural":
        margins = ", ".join(f"{value(win) / value(b):.2f}x of {b.label}" for b in base if value(b))
        return (f"{win.label} wins: {value(win):.4g} {unit} ({margins or 'no baseline measured'}), loss "
                f"{win.loss:.3g} within {cfg.constraint.describe()}{_spread_note(win, base, cell, key)}")
    structural = [c for c in confirmed if c.kind == "structural" and c.feasible and value(c) is not None]
    if not [c for c in candidates if c.kind == "structural"]:
        why = "no structural candidate met the constraint (see searches)"
    elif structural:
        best = min(structural, key=value)
        why = f"the best structural candidate, {best.label}, needs {value(best):.4g} {unit} vs {value(win):.4g}"
    else:
        why = "no structural candidate kept the constraint in ONNX Runtime or reached the front"
    return f"no structural candidate beats the baselines: {win.label} is best ({why})"


def _spread_note(win: Candidate, base: list[Candidate], cell: str, key: str) -> str:
    """Whether a latency win holds in every fresh process: the winner's slowest process beats each baseline's
    fastest (else it is within the noise of this machine, and said so)."""
    if key != "latency" or cell not in win.confirm_range_ms:
        return ""
    close = [b.label for b in base if cell in b.confirm_range_ms
             and win.confirm_range_ms[cell][1] >= b.confirm_range_ms[cell][0]]
    if not close:
        return "; faster in every confirmation process"
    return (f"; NOT beyond the spread over processes against {', '.join(close)}: treat it as a tie on this "
            "machine and confirm with more --repeats/--min-seconds")


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
