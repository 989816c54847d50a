"""The one timing loop of minreal, and latency statistics.

Every latency number in the project comes from :func:`time_interleaved`; do not write a second loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LatencyStats", "time_interleaved", "latency_stats", "ratio_summary", "RatioSummary"]


def time_interleaved(
    run_fns: Sequence[Callable[[], object]],
    warmup: int,
    min_runs: int,
    min_seconds: float,
    clock: Callable[[], float] = time.perf_counter,
) -> list[list[float]]:
    """Time several callables interleaved (A B A B ...) so that drift affects all alike.

    Each callable is first called ``warmup`` times (interleaved, results discarded). Then rounds of
    one timed call per callable run until at least ``min_runs`` rounds are done *and* the
    measurement window has lasted at least ``min_seconds``.

    Parameters
    ----------
    run_fns : Sequence[Callable[[], object]]
        Zero-argument callables, one per model.
    warmup : int
        Discarded calls per callable.
    min_runs : int
        Minimum measured calls per callable.
    min_seconds : float
        Minimum wall time of the measurement window, in seconds.
    clock : Callable[[], float]
        Monotonic clock in seconds (injectable for tests).

    Returns
    -------
    list[list[float]]
        Per callable, the measured latencies in milliseconds (warm-up excluded).
    """
    for _ in range(warmup):
        for fn in run_fns:
            fn()
    latencies: list[list[float]] = [[] for _ in run_fns]
    start = clock()
    rounds = 0
    while rounds < min_runs or clock() - start < min_seconds:
        for fn, sink in zip(run_fns, latencies):
            t0 = clock()
            fn()
            sink.append((clock() - t0) * 1e3)
        rounds += 1
    return latencies


@dataclass(frozen=True)
class LatencyStats:
    """Latency summary of measured runs (milliseconds) and throughput (samples per second)."""

    runs: int
    mean_ms: float
    std_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    throughput_sps: float


def latency_stats(latencies_ms: Sequence[float], batch_size: int) -> LatencyStats:
    """Summarise latencies: mean, sample std (ddof=1), linear-interpolated percentiles, throughput.

    Throughput is ``batch_size / mean latency``.
    """
    values = np.asarray(latencies_ms, dtype=np.float64)
    if values.size == 0:
        raise ValueError("latency_stats needs at least one measured run")
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    mean = float(values.mean())
    return LatencyStats(
        runs=int(values.size),
        mean_ms=mean,
        std_ms=float(values.std(ddof=1)) if values.size > 1 else 0.0,
        p50_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
        throughput_sps=batch_size * 1e3 / mean if mean > 0 else float("inf"),
    )


@dataclass(frozen=True)
class RatioSummary:
    """Latency ratios of one model vs the reference, one per process, with median and spread."""

    median: float
    min: float
    max: float
    per_process: tuple[float, ...]


def ratio_summary(model_p50_ms: Sequence[float], reference_p50_ms: Sequence[float]) -> RatioSummary:
    """Per-process ratio ``model / reference`` of median latencies, then median, min and max.

    Both sequences hold one value per worker process, measured interleaved in that process.
    """
    model = np.asarray(model_p50_ms, dtype=np.float64)
    reference = np.asarray(reference_p50_ms, dtype=np.float64)
    if model.shape != reference.shape or model.size == 0:
        raise ValueError(f"ratio_summary needs equal, non-empty per-process lists, got {model.size}, {reference.size}")
    ratios = model / reference
    return RatioSummary(
        median=float(np.median(ratios)),
        min=float(ratios.min()),
        max=float(ratios.max()),
        per_process=tuple(float(r) for r in ratios),
    )
