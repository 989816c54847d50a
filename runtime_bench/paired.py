"""Paired, interleaved fresh processes of a reference and a candidate model, decided at a stated error rate.

Pair ``i`` is one fresh worker process that times both models interleaved (:func:`time_interleaved`), the
reference first in even pairs and the candidate first in odd ones (ABAB..., BABA...); its ratio is the candidate's
p50 over the reference's in that process. :func:`minreal.runtime_bench.decision.sequential_decision` adds pairs
until the verdict is decided, the cap or the time budget.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .bench import _provider_options, _spawn
from .config import BenchConfig, ModelEntry
from .decision import DecisionPlan, LatencyDecision, sequential_decision
from .errors import ProviderUnavailableError
from .inputs import input_specs
from .providers import provider_name
from .worker import WorkerJob, WorkerResult

__all__ = ["paired_decision", "pair_ratios"]

logger = logging.getLogger(__name__)


def paired_decision(reference: ModelEntry, candidate: ModelEntry, config: BenchConfig, allowed: float,
                    plan: DecisionPlan, progress: Callable[[str], None] | None = None) -> LatencyDecision:
    """Decide whether ``candidate``'s latency is within ``allowed`` times ``reference``'s on the first provider, batch
    size and shape of ``config`` (each process measures for ``plan.pair_seconds`` per model, seeded random inputs).

    Raises
    ------
    ProviderUnavailableError
        The provider did not run in a worker.
    """
    notify = progress or logger.info
    with pair_ratios(reference, candidate, config, plan.pair_seconds) as next_ratio:

        def measured(i: int) -> float:
            notify(f"paired process {i + 1} (of at most {plan.max_pairs}): {candidate.name} vs {reference.name}")
            return next_ratio(i)

        return sequential_decision(measured, allowed, plan)


@contextmanager
def pair_ratios(reference: ModelEntry, candidate: ModelEntry, config: BenchConfig,
                pair_seconds: float) -> Iterator[Callable[[int], float]]:
    """A function that measures pair ``i`` in a fresh process (reference first for even ``i``, candidate first for odd)
    and returns its ratio, on the first provider, batch size and shape of ``config``; valid inside the ``with``."""
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
                            provider_options=[options[m.name] for m in order], specs=[specs[m.name] for m in order])
            return _ratio(_spawn(job, Path(tmp) / f"pair-{i}", config.worker_timeout_s), provider)

        yield next_ratio


def _ratio(result: WorkerResult, provider: str) -> float:
    """The candidate's p50 over the reference's in one process."""
    if result.status != "ok":
        raise ProviderUnavailableError(f"provider {provider} did not run in the paired gate's worker: "
                                       f"{result.reason or 'no reason given'}")
    latencies = result.latencies_ms
    return float(np.median(latencies["candidate"]) / np.median(latencies["reference"]))
