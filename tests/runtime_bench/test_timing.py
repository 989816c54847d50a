"""The one timing loop: warm-up discarded, run counts, min_seconds, interleaving; statistics."""

from __future__ import annotations

import time

import numpy as np
import pytest

from minreal.runtime_bench.timing import latency_stats, ratio_summary, time_interleaved


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_warmup_calls_are_made_and_discarded() -> None:
    clock, calls = FakeClock(), []

    def run() -> None:
        calls.append(1)
        clock.now += 1.0 if len(calls) <= 5 else 0.002  # warm-up calls are slow, measured ones 2 ms

    latencies = time_interleaved([run], warmup=5, min_runs=50, min_seconds=0.0, clock=clock)
    assert len(calls) == 5 + 50
    assert len(latencies[0]) == 50
    assert latencies[0] == pytest.approx([2.0] * 50)


def test_interleaves_models_and_counts_each() -> None:
    order: list[str] = []
    fns = [lambda: order.append("A"), lambda: order.append("B")]
    latencies = time_interleaved(fns, warmup=3, min_runs=7, min_seconds=0.0)
    assert order == ["A", "B"] * (3 + 7)
    assert [len(lat) for lat in latencies] == [7, 7]


def test_min_seconds_extends_beyond_min_runs() -> None:
    clock = FakeClock()

    def run() -> None:
        clock.now += 0.01

    latencies = time_interleaved([run, run], warmup=0, min_runs=3, min_seconds=1.0, clock=clock)
    # two models per round at 10 ms each: the window reaches 1 s after 50 rounds
    assert len(latencies[0]) == len(latencies[1]) == 50
    assert clock.now >= 1.0


def test_min_seconds_with_real_clock() -> None:
    start = time.perf_counter()
    latencies = time_interleaved([lambda: time.sleep(0.001)], warmup=1, min_runs=2, min_seconds=0.1)
    assert time.perf_counter() - start >= 0.1
    assert len(latencies[0]) > 2
    assert min(latencies[0]) >= 1.0  # milliseconds, at least the sleep


def test_latency_stats_match_numpy() -> None:
    values = np.random.default_rng(0).gamma(2.0, 1.5, size=1001)
    stats = latency_stats(values.tolist(), batch_size=8)
    assert stats.runs == 1001
    assert stats.mean_ms == pytest.approx(values.mean())
    assert stats.std_ms == pytest.approx(values.std(ddof=1))
    assert stats.p50_ms == pytest.approx(np.percentile(values, 50))
    assert stats.p90_ms == pytest.approx(np.percentile(values, 90))
    assert stats.p99_ms == pytest.approx(np.percentile(values, 99))
    assert stats.throughput_sps == pytest.approx(8 * 1000.0 / values.mean())


def test_latency_stats_rejects_empty() -> None:
    with pytest.raises(ValueError, match="at least one"):
        latency_stats([], batch_size=1)


def test_ratio_summary_median_and_spread() -> None:
    summary = ratio_summary([1.0, 3.0, 1.6], [2.0, 2.0, 2.0])
    assert summary.per_process == pytest.approx((0.5, 1.5, 0.8))
    assert summary.median == pytest.approx(0.8)
    assert summary.min == pytest.approx(0.5)
    assert summary.max == pytest.approx(1.5)


def test_ratio_summary_needs_paired_lists() -> None:
    with pytest.raises(ValueError, match="equal"):
        ratio_summary([1.0, 2.0], [1.0])
