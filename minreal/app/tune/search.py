"""The search: which methods tune searches (:func:`default_methods`, :func:`with_chains`), and the rounds that search
them through the executor (:func:`search_rounds`): the plan's fixed variants, zero-shot bisection of every method's
MAC budget, successive halving of the recovered candidates (:mod:`.halving`), and quantisation-aware recovery where
plain INT8 misses (:func:`qat_candidates`), with a progress line per probe (:class:`Clock`).

:class:`BudgetSearch` is one method's bisection on accuracy: the smallest MAC ratio of a grid that meets the
constraint. Accuracy is assumed to fall as the budget shrinks. The bisection checks that assumption with one extra
probe: the first budget past the failed boundary that it did not evaluate; when a smaller budget passes where a
larger one failed, it evaluates the rest of the grid instead (and says so).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import minreal.runtime_bench as rb
from minreal.compress import get_method, method_names
from minreal.compress.core.data import Dataset
from minreal.export.verify import feeds_of
from minreal.runtime_bench.metrics import evaluate_models

from .candidate import CandidateResult, CandidateSpec, Job, cached_file, evaluate_candidate, subsample_size
from .config import Quality, TuneConfig
from .executor import Executor
from .halving import Halving, RungEntry, halving_pool, halving_twins, rung_fractions
from .model import Progress

__all__ = ["BudgetSearch", "Probe", "default_methods", "CHAINS", "with_chains", "search_rounds", "qat_candidates",
           "search_record", "Clock", "StructureScreen"]

SCREEN_MARGIN = 0.10
"""A method is left out of the race only when its structure's fastest file takes at least ``1 + SCREEN_MARGIN`` times
the fastest baseline's p50 in every cell: the screen is one short pass (repeated screens of one file on the digits
moved by up to 4 %), and a rank method's budgets are not strictly monotone in latency (on the pretrained ResNet-32,
svd@0.9's INT8 ran 6 % faster than svd@0.8's at batch 1, 14 % at batch 32, ``benchmarks/real_models_screen.json`` at
commit 7addb0f)."""


class StructureScreen(Protocol):
    """Times the files of ``files_only`` results on the target (:func:`.measure.structure_screen`)."""

    def ready(self) -> str | None:
        """Why the screen cannot compare anything (no baseline meets the constraint), or None."""

    def __call__(self, results: list[CandidateResult]) -> dict[tuple[str, float], dict[str, float]]:
        """For each ``(method, budget)``, by cell, the p50 of its fastest file over that of the fastest baseline
        that meets the constraint."""


@dataclass
class Probe:
    """One evaluated budget: whether it met the constraint and its score (None: the method refused it)."""

    budget: float
    ok: bool
    score: float | None


@dataclass
class BudgetSearch:
    """State of the search over ``grid`` (descending MAC ratios) for one (method, recovery) pair.

    Invariant while monotone: every grid index below ``lo`` met the constraint, every index from ``hi`` on failed.
    """

    grid: tuple[float, ...]
    probes: dict[float, Probe] = field(default_factory=dict)
    lo: int = 0
    hi: int = -1
    monotone: bool = True
    checked: bool = False
    abandoned: str | None = None
    """Why the search stopped before the grid told anything (the method refused every budget it was given)."""

    def __post_init__(self) -> None:
        self.grid = tuple(sorted(self.grid, reverse=True))
        self.hi = len(self.grid)

    def next_budget(self) -> float | None:
        """The next budget to evaluate, or None when the search is over."""
        if self.abandoned:
            return None
        if not self.monotone:
            rest = [g for g in self.grid if g not in self.probes]
            return rest[0] if rest else None
        if self.lo < self.hi:
            return self.grid[(self.lo + self.hi) // 2]
        if not self.checked:
            self.checked = True
            probed = self._probed_indices()
            beyond = [i for i in range(self.hi + 1, len(self.grid)) if i not in probed]
            if self.lo > 0 and beyond:  # the first unprobed budget past the failed boundary must fail too
                return self.grid[beyond[0]]
        return None

    def record(self, budget: float, ok: bool, score: float | None) -> None:
        """Take the result of :meth:`next_budget`'s budget; detect a violation of monotonicity."""
        self.probes[budget] = Probe(budget, ok, score)
        i = self.grid.index(budget)
        if self.monotone and self.lo < self.hi:
            if ok:
                self.lo = i + 1
            else:
                self.hi = i
        if self._violated():
            self.monotone = False

    def _probed_indices(self) -> set[int]:
        return {self.grid.index(b) for b in self.probes}

    def _violated(self) -> bool:
        """A smaller budget met the constraint where a larger one did not."""
        failed = [b for b, p in self.probes.items() if not p.ok]
        return any(p.ok and any(p.budget < f for f in failed) for p in self.probes.values())

    def passing(self) -> list[float]:
        """Budgets evaluated that met the constraint, smallest first."""
        return sorted(b for b, p in self.probes.items() if p.ok)

    def smallest(self) -> float | None:
        """The smallest budget that met the constraint (None: none did)."""
        passing = self.passing()
        return passing[0] if passing else None


def default_methods() -> tuple[str, ...]:
    """Every registered method tune can search: a whole-model MAC budget and two phases
    (:attr:`~minreal.compress.core.spec.MethodSpec.searchable`)."""
    return tuple(n for n in method_names() if get_method(n).searchable)


CHAINS = ("depth+magnitude",)
"""Chains tune searches beside the methods whenever all their parts are searched, with no option: depth, then a
width method on what depth left, each taking half of the MAC cut (:data:`.candidate.CHAIN_FIRST_SHARE`). With depth
alone (all of the cut by depth) and the width method alone (none of it), tune measures three allocations of each
budget on the target, and its measured latency and held-out quality choose among them."""


def with_chains(methods: Sequence[str]) -> tuple[str, ...]:
    """``methods`` and the :data:`CHAINS` whose parts are all among them."""
    return (*methods, *(c for c in CHAINS if c not in methods and all(p in methods for p in c.split("+"))))


def search_rounds(methods: Sequence[str], cfg: TuneConfig, base: Job, run: Executor, t_start: float,
                  notes: list[str], say: Progress, clock: Clock, screen: StructureScreen | None = None
                  ) -> tuple[dict[tuple[str, int], BudgetSearch], Halving | None, list[CandidateResult]]:
    """The plan's fixed variants, then rounds of zero-shot bisection (one step of every unfinished method's search a
    round: every budget realises from the method's one prepared state, so a probe costs a realise, a measurement
    and, when it meets the constraint, an export), then successive halving of the recovered candidates
    (:mod:`.halving`), whose pool ``screen`` first times (None: every structure of the pool races)."""
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
        halving = _halve(methods, searches, cfg, base, run, clock, results, t_start, notes, say, screen)
    return searches, halving, results


def _halve(methods: Sequence[str], searches: dict[tuple[str, int], BudgetSearch], cfg: TuneConfig, base: Job,
           run: Executor, clock: Clock, results: list[CandidateResult], t_start: float, notes: list[str],
           say: Progress, screen: StructureScreen | None = None) -> Halving:
    """Successive halving of the recovered candidates below each method's zero-shot boundary, of those whose
    structure ``screen`` finds faster than a baseline (:func:`_screened`)."""
    fractions = rung_fractions(cfg.halving_eta, cfg.halving_rungs)
    zero_shot = {(r.spec.method, r.spec.mac_ratio): r for r in results
                 if r.spec.variant is None and not r.spec.recover_epochs and not r.error}
    models = {k: r.weights_digest for k, r in zero_shot.items()}
    boundaries = {m: searches[(m, 0)].smallest() for m in methods}
    pool = halving_pool(cfg.grid, boundaries, cfg.halving_per_method, models)
    twins = halving_twins(cfg.grid, boundaries, cfg.halving_per_method, models)
    halving = Halving(fractions, cfg.halving_eta, pool, twins=twins, grid=tuple(cfg.grid))
    if screen is not None and pool:
        halving.pool = pool = _screened(halving, cfg, base, run, clock, screen, results, t_start, notes, say)
    for m, b, twin in twins:
        if any(k == m for k, _ in pool):  # a method the screen left out recovers nothing, its twins included
            notes.append(f"{m}@{b:g} realises the same model as {m}@{twin:g} (MAC ratio "
                         f"{zero_shot[(m, b)].mac_ratio:.3g}): it is recovered once, as {m}@{twin:g}")
            say(f"[tune] {notes[-1]}")
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
        extended = [f"{m}@{b:g}" for m, b, rung in halving.extended if rung == i + 1]
        say(f"[tune] rung {i + 1}: {', '.join(met) or 'none'} met the constraint"
            + (f"; {', '.join(f'{m}@{b:g}' for m, b in todo)} go on" if todo else "")
            + (f" ({', '.join(extended)} by extension: the smallest budget of its method met early)"
               if extended else ""))
        if _note_skipped(outcomes, notes, say):
            break
    for m in methods:  # each budget's last word: met, or missed at the full cap
        last = [e for rung in halving.rungs for e in rung if e.method == m and e.outcome in ("met", "missed")]
        search = searches.setdefault((m, cfg.recover_epochs), BudgetSearch(cfg.grid))
        for e in sorted(last, key=lambda e: -e.budget):
            search.probes[e.budget] = Probe(e.budget, e.meets, e.score)
    return halving


def _screened(halving: Halving, cfg: TuneConfig, base: Job, run: Executor, clock: Clock, screen: StructureScreen,
              results: list[CandidateResult], t_start: float, notes: list[str], say: Progress
              ) -> list[tuple[str, float]]:
    """The pool less the methods whose structure is clearly slower than the fastest baseline that meets the
    constraint in every cell (:data:`SCREEN_MARGIN`): each method's smallest pool budget is exported as its zero-shot
    model (``files_only``), and ``screen`` times its files beside the baselines. A method whose structure there no
    recovery can make faster than a file the user already has races none of its budgets.

    Only the smallest budget is timed, to keep the screen cheap (an export each): that assumes a method's larger
    budgets are no faster, which holds for depth and the width methods (the same layers, wider or more of them) but
    only roughly for rank methods (a rank rounded to its multiple can make a larger budget a few per cent faster),
    hence the margin. A method whose files could not be made races as before (its refusal is the race's to record);
    when the time budget runs out, or no baseline meets the constraint, nothing is left out (the notes say so)."""
    why = screen.ready()
    if why is not None:
        notes.append(f"no structure screen before the race: {why}; every budget of the pool races")
        say(f"[tune] {notes[-1]}")
        return halving.pool
    smallest = {m: min(b for k, b in halving.pool if k == m) for m, _ in halving.pool}
    jobs = [dataclasses.replace(base, spec=CandidateSpec(m, b, files_only=True)) for m, b in smallest.items()]
    outcomes = clock.run_round(run, jobs, "structure files of the race's pool (each method's smallest budget)", base)
    if _note_skipped(outcomes, notes, say) or _stopped(cfg, t_start, results, notes, say):
        return halving.pool  # the race itself stops at its first rung
    made = [r for r in outcomes if not r.error]
    ratios = screen(made) if made else {}
    limit = 1.0 + SCREEN_MARGIN
    out = {m for m, b in smallest.items() if ratios.get((m, b)) and min(ratios[(m, b)].values()) >= limit}
    halving.screened = [{"method": m, "budget": b, "ratio": ratios.get((m, b)), "raced": m not in out}
                        for m, b in halving.pool]
    if out:
        timed = [f"{m}@{smallest[m]:g} ({min(ratios[(m, smallest[m])].values()):.2f}x)" for m in sorted(out)]
        notes.append(f"{len(out)} of {len(smallest)} methods race none of their budgets: their fastest structure in "
                     f"the race's pool takes at least {limit:g}x the p50 of the fastest baseline that meets the "
                     f"constraint in every cell (their fastest file; the smallest ratio): {', '.join(timed)}; "
                     "recovery changes weights, not structure")
        say(f"[tune] {notes[-1]}")
    return [(m, b) for m, b in halving.pool if m not in out]


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


class Clock:
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
        if res.skipped or res.cached or res.error or res.spec.files_only:
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
    if res.spec.files_only:
        return f"MAC ratio {res.mac_ratio:.3f}, {' and '.join(sorted(res.files))} files to time its structure" + (
            " (cached)" if res.cached else "")
    loss = base.constraint.loss(Quality.from_metrics(res.quality), base.reference)
    verdict = "meets" if res.feasible else "misses"
    cached = " (cached)" if res.cached else ""
    return (f"MAC ratio {res.mac_ratio:.3f}, loss {loss:.4g} -> {verdict} {base.constraint.describe()}{cached}"
            if loss is not None else f"no {base.constraint.metric} measured")


def _over_budget(cfg: TuneConfig, t_start: float) -> bool:
    return cfg.time_budget_s is not None and time.perf_counter() - t_start > cfg.time_budget_s


def qat_candidates(searches: dict[tuple[str, int], BudgetSearch], results: list[CandidateResult],
                   held_out: Dataset, original: Path, cfg: TuneConfig, base: Job, run: Executor, t_start: float,
                   notes: list[str], say: Progress, clock: Clock) -> list[CandidateResult]:
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
    ref, m = evaluate_models(["original", res.spec.label], [original, Path(cached_file(res, "int8"))],
                             feeds_of(held_out.x), y, 64, rb.BenchConfig().threads())
    return base.constraint.holds(Quality.from_metrics(dataclasses.asdict(m)),
                                 Quality.from_metrics(dataclasses.asdict(ref)))


def search_record(key: tuple[str, int], s: BudgetSearch) -> dict[str, Any]:
    return {"method": key[0], "recover_epochs": key[1], "monotone": s.monotone, "smallest_feasible": s.smallest(),
            "abandoned": s.abandoned,
            "probes": [dataclasses.asdict(p) for p in sorted(s.probes.values(), key=lambda p: -p.budget)]}
