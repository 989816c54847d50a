"""Paired, interleaved fresh processes of a reference and a candidate model, decided at a stated error rate.

Pair ``i`` is one fresh worker process that times both models interleaved (:func:`time_interleaved`), the
reference first in even pairs and the candidate first in odd ones (ABAB..., BABA...), both on the process's one
shared intra-op thread pool (:func:`minreal.runtime_bench.sessions.share_thread_pool`: with a pool per session, a
loaded machine slows whichever model's threads the scheduler left beside the load); its ratio is the candidate's p50
over the reference's in that process. The sign test's bounds assume independent pairs: each pair is a fresh
process, but load that drifts between neighbouring pairs weakens that (``benchmarks/gate_power.py`` resamples blocks
of neighbouring pairs to keep such drift in its error rates). An order effect (whichever model a process times
first) only makes the bounds conservative: the order alternates, so such pairs fall on each side of the true ratio
as often. :func:`minreal.runtime_bench.decision.sequential_decision` adds pairs until the verdict is decided, the cap
or the time budget.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .bench import _provider_options, _spawn
from .config import BenchConfig, ModelEntry, shape_label
from .decision import DecisionPlan, LatencyDecision, sequential_decision
from .errors import ProviderUnavailableError
from .inputs import input_specs
from .providers import provider_name
from .worker import WorkerJob, WorkerResult

__all__ = ["paired_decision", "pair_ratios", "TIMEOUT_MARGIN_S"]

#: Seconds a paired worker may run past the remaining time budget (process start, imports, session creation).
TIMEOUT_MARGIN_S = 30.0

logger = logging.getLogger(__name__)


def paired_decision(reference: ModelEntry, candidate: ModelEntry, config: BenchConfig, allowed: float,
                    plan: DecisionPlan, progress: Callable[[str], None] | None = None,
                    clock: Callable[[], float] = time.monotonic) -> LatencyDecision:
    """Decide whether ``candidate``'s latency is within ``allowed`` times ``reference``'s on the first provider, batch
    size and shape of ``config`` (each process measures for ``plan.pair_seconds`` per model, seeded random inputs).

    Each worker may run for the time budget left plus :data:`TIMEOUT_MARGIN_S`; after the first pair, a progress
    line says so when the pairs the first look needs cannot fit in the budget at that pair's wall time.

    Raises
    ------
    ProviderUnavailableError
        The provider did not run in a worker.
    WorkerError
        A worker crashed or outlasted its timeout.
    """
    notify = progress or logger.info
    where = " ".join(filter(None, [config.providers[0], f"batch {config.batch_sizes[0]}",
                                   shape_label(config.shapes()[0])]))
    what = f"{candidate.name} vs {reference.name} ({where})"
    start = clock()

    def timeout() -> float:
        return max(plan.time_budget_s - (clock() - start), 0.0) + TIMEOUT_MARGIN_S

    with pair_ratios(reference, candidate, config, plan.pair_seconds, timeout) as next_ratio:

        def measured(i: int) -> float:
            notify(f"paired process {i + 1} (of at most {plan.max_pairs}): {what}")
            ratio = next_ratio(i)
            if i == 0:
                notify(_first_look_note(clock() - start, plan, what) or f"one pair of {what} took "
                       f"{clock() - start:.3g} s")
            return ratio

        return sequential_decision(measured, allowed, plan, clock=clock)


def _first_look_note(pair_s: float, plan: DecisionPlan, what: str) -> str:
    """A line saying that the pairs the first look needs cannot fit in the time budget at ``pair_s`` per pair (the
    verdict will be undecided); ``""`` when they fit."""
    first = plan.schedule()[0]
    if pair_s <= 0 or first * pair_s <= plan.time_budget_s:
        return ""
    fit = max(int(math.floor(plan.time_budget_s / pair_s)), 1)
    outcome = ("expect undecided: fewer than the sign test needs to decide at all" if fit < plan.least_pairs()
               else "the look comes early, on fewer pairs")
    return (f"one pair of {what} took {pair_s:.3g} s: the first look needs {first} pairs "
            f"(about {first * pair_s:.3g} s), but --gate-seconds {plan.time_budget_s:g} fits about {fit}; {outcome} "
            "(raise --gate-seconds, or lower --pair-seconds)")


@contextmanager
def pair_ratios(reference: ModelEntry, candidate: ModelEntry, config: BenchConfig, pair_seconds: float,
                timeout: Callable[[], float] | None = None) -> Iterator[Callable[[int], float]]:
    """A function that measures pair ``i`` in a fresh process (reference first for even ``i``, candidate first for odd;
    both on the process's shared thread pool) and returns its ratio, on the first provider, batch size and shape of
    ``config``; valid inside the ``with``.
    ``timeout()`` gives each worker's time limit when it starts (else ``config.worker_timeout_s``)."""
    provider, batch, shape = config.providers[0], config.batch_sizes[0], config.shapes()[0]
    pair = (ModelEntry("reference", reference.path), ModelEntry("candidate", candidate.path))
    with tempfile.TemporaryDirectory(prefix="minreal-gate-") as tmp:
        options = _provider_options(provider, pair, config, Path(tmp))
        specs = {m.name: input_specs(m.path) for m in pair}  # read here once: the workers then never import onnx

        def next_ratio(i: int) -> float:
            order = pair if i % 2 == 0 else pair[::-1]
            job = WorkerJob(names=[m.name for m in order],
                            paths=[str(m.path) for m in order], provider=provider_name(provider), batch_size=batch,
                            threads=config.threads(), warmup=config.warmup, min_runs=config.min_runs,
                            min_seconds=pair_seconds, seed=config.seed, axis_values=shape,
                            provider_options=[options[m.name] for m in order], specs=[specs[m.name] for m in order],
                            shared_pool=True)
            limit = timeout() if timeout is not None else config.worker_timeout_s
            return _ratio(_spawn(job, Path(tmp) / f"pair-{i}", limit), provider)

        yield next_ratio


def _ratio(result: WorkerResult, provider: str) -> float:
    """The candidate's p50 over the reference's in one process."""
    if result.status != "ok":
        raise ProviderUnavailableError(f"provider {provider} did not run in the paired gate's worker: "
                                       f"{result.reason or 'no reason given'}")
    latencies = result.latencies_ms
    return float(np.median(latencies["candidate"]) / np.median(latencies["reference"]))
