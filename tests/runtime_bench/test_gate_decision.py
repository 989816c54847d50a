"""The paired latency decision on synthetic per-pair ratios (seeded, never timed): its error rates, its undecided
verdict, and how ``check --paired`` reports it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from minreal.runtime_bench import check_report, format_check
from minreal.runtime_bench.check_paired import remeasure_problem
from minreal.runtime_bench.decision import (
    FAIL,
    PASS,
    UNDECIDED,
    DecisionPlan,
    LatencyDecision,
    decide,
    median_bounds,
    pairs_needed,
    sequential_decision,
)
from minreal.runtime_bench.environment import collect_environment
from minreal.runtime_bench.load import compare_load, cpu_counters, describe_load, machine_load

TRIALS = 2000
ALLOWED = 1.07
SPREAD = 0.04  # pair-to-pair standard deviation of the log ratio (about 4 %), as on a quiet 2-core machine
FIXED_CLOCK = 0.0


def _binomial_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def _margin(rate: float, trials: int = TRIALS) -> float:
    """Three binomial standard errors of an empirical rate."""
    return 3.0 * math.sqrt(rate * (1.0 - rate) / trials)


def _trials(true_ratio: float, plan: DecisionPlan, noise: Callable[[np.random.Generator], float],
            seed: int = 0) -> dict[str, float]:
    """Share of each verdict over TRIALS sequential decisions on ratios ``true_ratio * exp(noise)``."""
    rng = np.random.default_rng(seed)
    verdicts = [sequential_decision(lambda _: true_ratio * math.exp(noise(rng)), ALLOWED, plan,
                                    clock=lambda: FIXED_CLOCK).verdict for _ in range(TRIALS)]
    return {v: verdicts.count(v) / TRIALS for v in (PASS, FAIL, UNDECIDED)}


def _normal(rng: np.random.Generator) -> float:
    return float(rng.normal(0.0, SPREAD))


def _heavy(rng: np.random.Generator) -> float:
    """Student t with 2 degrees of freedom: the odd process slowed by a neighbour."""
    return float(SPREAD * rng.standard_t(2))


@pytest.mark.parametrize("n, level", [(12, 0.0025), (20, 0.01), (60, 0.0025), (35, 0.05)])
def test_median_bounds_are_the_exact_sign_test_order_statistics(n: int, level: float) -> None:
    values = np.arange(n, dtype=float)  # sorted: the k-th smallest is k - 1
    lower, upper = median_bounds(values[::-1], level)
    k = int(lower) + 1
    assert _binomial_cdf(k - 1, n) <= level < _binomial_cdf(k, n)
    assert upper == values[n - k]


@pytest.mark.parametrize("n", [9, 12, 21, 35, 60, 80])
@pytest.mark.parametrize("level", [0.0025, 0.01, 0.05])
def test_median_bounds_cover_the_median_at_the_binomial_level(n: int, level: float) -> None:
    """For any continuous distribution, the lower bound (the k-th smallest of n) exceeds the median with probability
    P(Bin(n, 1/2) <= k - 1): at most ``level``, and the largest such k (scipy's binomial as the reference)."""
    from scipy.stats import binom

    k = int(median_bounds(np.arange(n, dtype=float), level)[0]) + 1
    assert binom.cdf(k - 1, n, 0.5) <= level < binom.cdf(k, n, 0.5)


def test_too_few_values_have_no_bounds() -> None:
    # 2**-8 = 0.0039 > 0.0025: eight pairs cannot bound a median at that level
    assert median_bounds(np.ones(8), 0.0025) == (-math.inf, math.inf)
    assert median_bounds(np.ones(9), 0.0025) == (1.0, 1.0)


def test_schedule_is_increasing_and_ends_at_the_cap() -> None:
    plan = DecisionPlan(min_pairs=12, max_pairs=60, looks=4)
    schedule = plan.schedule()
    assert schedule[0] == 12 and schedule[-1] == 60 and len(schedule) <= plan.looks
    assert list(schedule) == sorted(set(schedule))
    assert plan.level == pytest.approx(plan.alpha / len(schedule))
    assert DecisionPlan(min_pairs=9, max_pairs=9).schedule() == (9,)  # one possible look: the whole alpha on it
    assert DecisionPlan(min_pairs=9, max_pairs=9).level == pytest.approx(0.01)


@pytest.mark.parametrize("noise", [_normal, _heavy])
def test_false_alarms_at_the_threshold_stay_below_alpha(noise: Callable) -> None:
    """The worst case for a false alarm: the true median ratio equals the allowed one."""
    plan = DecisionPlan(alpha=0.05)
    rates = _trials(ALLOWED, plan, noise)
    assert rates[FAIL] <= plan.alpha + _margin(plan.alpha)
    assert rates[PASS] <= plan.alpha + _margin(plan.alpha)  # nor does it pass what sits on the threshold


@pytest.mark.parametrize("noise", [_normal, _heavy])
def test_identical_models_are_not_failed(noise: Callable) -> None:
    rates = _trials(1.0, DecisionPlan(alpha=0.01), noise)
    assert rates[FAIL] <= 0.01 + _margin(0.01)
    assert rates[PASS] >= 0.95  # and they are decided: passed


def test_a_large_regression_is_caught() -> None:
    """+15 % against an allowed 7 % at a 4 % pair spread: caught in at least 95 % of trials (the claimed power)."""
    rates = _trials(1.15, DecisionPlan(alpha=0.01), _normal)
    assert rates[FAIL] >= 0.95 - _margin(0.95)
    assert rates[PASS] <= 0.01 + _margin(0.01)


def _alternating(true_ratio: float, bias: float, seed: int = 0) -> dict[str, float]:
    """Share of each verdict over TRIALS decisions on pairs whose process times the model it runs first ``bias`` (log)
    slower, the order alternating with the pair as the gate alternates it (pair ``i``: the reference first for even
    ``i``), at the quiet pair spread."""
    rng = np.random.default_rng(seed)

    def ratio(i: int) -> float:
        first = 1.0 if i % 2 == 0 else -1.0  # reference first: the reference slower, the ratio lower
        return true_ratio * math.exp(-first * bias + _normal(rng))

    plan = DecisionPlan(alpha=0.01)
    verdicts = [sequential_decision(ratio, ALLOWED, plan, clock=lambda: FIXED_CLOCK).verdict for _ in range(TRIALS)]
    return {v: verdicts.count(v) / TRIALS for v in (PASS, FAIL, UNDECIDED)}


def test_a_position_bias_cancels_in_the_median_of_alternating_pairs() -> None:
    """A model timed first 5 % slower in every process: the alternating order puts half the pairs on each side of the
    true ratio, so the identical model still passes and a +15 % regression still fails."""
    same, slower = _alternating(1.0, 0.05), _alternating(1.15, 0.05)
    assert same[FAIL] <= 0.01 + _margin(0.01) and same[PASS] >= 0.95
    assert slower[PASS] <= 0.01 + _margin(0.01) and slower[FAIL] >= 0.95


def test_pairs_off_by_chance_per_process_are_undecided_never_failed() -> None:
    """The loaded machine's pairs with a thread pool per model: one model 1.7x slower in each process, which one by
    chance. The identical model is then never failed nor passed, only undecided: why the gate shares one pool."""
    rng = np.random.default_rng(0)
    plan = DecisionPlan(alpha=0.01)
    verdicts = [sequential_decision(lambda _: 1.7 ** rng.choice((-1.0, 1.0)) * math.exp(_normal(rng)), ALLOWED, plan,
                                    clock=lambda: FIXED_CLOCK).verdict for _ in range(TRIALS // 4)]
    assert verdicts.count(FAIL) == 0 and verdicts.count(PASS) / len(verdicts) <= 0.01 + _margin(0.01, TRIALS // 4)
    assert verdicts.count(UNDECIDED) / len(verdicts) >= 0.95


def test_identical_samples_are_not_failed_even_at_a_ratio_of_one() -> None:
    verdict, lower, upper = decide([1.0] * 30, 1.0, 0.0025)
    assert verdict == PASS and lower == upper == 1.0


def test_too_few_pairs_are_undecided_and_say_what_would_decide() -> None:
    plan = DecisionPlan(alpha=0.01, min_pairs=5, max_pairs=5, looks=1)
    d = sequential_decision(lambda _: 1.5, ALLOWED, plan, clock=lambda: FIXED_CLOCK)
    assert d.verdict == UNDECIDED and d.pairs == 5
    assert "pairs in all would decide it" in d.advice and "--max-pairs" in d.advice


def test_the_time_budget_ends_the_run_with_a_look() -> None:
    ticks = iter(range(1000))
    plan = DecisionPlan(alpha=0.01, min_pairs=12, max_pairs=60, time_budget_s=3.0)
    d = sequential_decision(lambda _: 1.0, ALLOWED, plan, clock=lambda: float(next(ticks)))
    assert d.pairs == 3 and d.looks == 1 and d.verdict == UNDECIDED
    assert "time budget" in d.advice


def test_a_decision_stops_at_the_first_look_that_decides() -> None:
    calls = []
    plan = DecisionPlan(alpha=0.01, min_pairs=12, max_pairs=60)
    d = sequential_decision(lambda i: calls.append(i) or 2.0, ALLOWED, plan, clock=lambda: FIXED_CLOCK)
    assert d.verdict == FAIL and d.pairs == 12 and len(calls) == 12 and d.looks == 1


def test_pairs_needed_grows_with_the_spread_and_vanishes_on_the_threshold() -> None:
    rng = np.random.default_rng(1)
    quiet, noisy = (1.1 * np.exp(rng.normal(0, s, 40)) for s in (0.02, 0.08))
    assert pairs_needed(quiet, ALLOWED, 0.0025) < pairs_needed(noisy, ALLOWED, 0.0025)
    assert pairs_needed([ALLOWED] * 10, ALLOWED, 0.0025) is None


@pytest.mark.parametrize("kwargs", [{"alpha": 0.0}, {"alpha": 0.5}, {"min_pairs": 10, "max_pairs": 5}, {"looks": 0}])
def test_plan_refuses_impossible_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        DecisionPlan(**kwargs)


def test_machine_load_reads_this_machine() -> None:
    load = machine_load()
    assert len(load.load_avg) == 3 and all(v >= 0 for v in load.load_avg) and load.logical_cores >= 1
    assert load.steal_pct is None or 0.0 <= load.steal_pct <= 100.0


def test_load_comparison_names_the_busier_run() -> None:
    quiet = {"load_avg": [0.1, 0.2, 0.2], "logical_cores": 2, "steal_pct": 0.0, "cpu_mhz": 2600.0}
    busy = {"load_avg": [2.1, 1.5, 0.9], "logical_cores": 2, "steal_pct": 3.0, "cpu_mhz": None}
    line = compare_load(quiet, busy)
    assert "the report ran on the busier machine" in line and "steal 3%" in line and "2600 MHz" in line
    assert "busier" not in compare_load(quiet, quiet)
    assert compare_load(None, busy) == ""


# --- check with a decision plan -------------------------------------------------------------------------------------

def _paired_report(tmp_path: Path, make_linear: Callable, weights: tuple) -> dict:
    paths = [make_linear(tmp_path / f"{name}.onnx", *weights) for name in ("orig", "small")]
    cells = [{"model": name, "provider": "cpu", "batch_size": 1, "stats": {"p50_ms": 1.0}, "process_p50_ms": [1.0]}
             for name in ("orig", "small")]
    return {"schema_version": 1, "environment": {"cpu_model": "test cpu"},
            "config": {"providers": ["cpu"], "batch_sizes": [1], "warmup": 1, "min_runs": 3},
            "models": [{"name": p.stem, "path": str(p), "file_size_bytes": p.stat().st_size} for p in paths],
            "latency": cells, "ratios": [{"model": "small", "provider": "cpu", "batch_size": 1, "median": 1.0}],
            "metrics": []}


def _scripted(ratio: float, pairs: int) -> Callable:
    """A stand-in for re-measuring: ``pairs`` pairs of ``ratio`` through the real sequential decision."""
    def decide_cell(reference, candidate, data, cell, allowed, plan, progress=None) -> LatencyDecision:
        capped = DecisionPlan(plan.alpha, min(plan.min_pairs, pairs), pairs, plan.looks)
        return sequential_decision(lambda _: ratio, allowed, capped, clock=lambda: FIXED_CLOCK)
    return decide_cell


def test_paired_check_fails_passes_and_stays_undecided(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    data, plan = _paired_report(tmp_path, make_linear, weights), DecisionPlan()
    for ratio, pairs, passed, undecided in [(1.0, 60, True, False), (1.5, 60, False, False), (1.5, 4, False, True)]:
        monkeypatch.setattr("minreal.runtime_bench.check.decide_cell", _scripted(ratio, pairs))
        result = check_report(data, max_latency_ratio=1.1, plan=plan)
        assert (result.passed, result.undecided) == (passed, undecided)
    assert "UNDECIDED  latency_ratio" in format_check(result) and "release gate UNDECIDED" in format_check(result)


def test_paired_regression_falls_back_to_the_heuristic_when_the_baseline_file_is_the_reports(
        tmp_path: Path, make_linear: Callable, weights: tuple) -> None:
    data = _paired_report(tmp_path, make_linear, weights)
    result = check_report(data, baseline=data, max_regression=10, plan=DecisionPlan())
    assert result.passed
    assert all("only the medians heuristic is possible: the baseline and the report name the same file" in c.note
               for c in result.criteria)


def test_check_exits_3_when_undecided(tmp_path: Path, make_linear: Callable, weights: tuple,
                                     run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "r.json"
    report.write_text(json.dumps(_paired_report(tmp_path, make_linear, weights)))
    monkeypatch.setattr("minreal.runtime_bench.check.decide_cell", _scripted(1.5, 4))
    code, _, err = run_cli(["check", str(report), "--max-latency-ratio", "1.1", "--paired", "-q"])
    assert code == 3 and err.startswith("UNDECIDED ") and "would decide it" in err
    monkeypatch.setattr("minreal.runtime_bench.check.decide_cell", _scripted(1.5, 60))
    assert run_cli(["check", str(report), "--max-latency-ratio", "1.1", "--paired", "-q"])[0] == 1


@pytest.mark.slow
def test_check_paired_runs_real_processes(tmp_path: Path, make_linear: Callable, weights: tuple,
                                          run_cli: Callable) -> None:
    """A time budget that ends before the pairs a sign test needs at alpha 0.01: undecided, exit 3, the real
    processes counted (a cap under that number is refused before any work: tests/runtime_bench/test_paired_gate.py)."""
    report = tmp_path / "r.json"
    report.write_text(json.dumps(_paired_report(tmp_path, make_linear, weights)))
    code, _, err = run_cli(["check", str(report), "--max-latency-ratio", "1.1", "--paired", "--max-pairs", "12",
                            "--gate-seconds", "0.5", "--pair-seconds", "0.01", "-q"])
    assert code == 3 and "UNDECIDED" in err and "the time budget stopped at" in err


def test_a_baseline_file_is_remeasured_only_while_it_is_the_baselines(tmp_path: Path, make_linear: Callable,
                                                                      weights: tuple) -> None:
    report = _paired_report(tmp_path, make_linear, weights)
    elsewhere = tmp_path / "old"
    elsewhere.mkdir()
    baseline = _paired_report(elsewhere, make_linear, weights)
    assert remeasure_problem(baseline, report, "small") == ""
    assert "same file" in remeasure_problem(report, report, "small")
    (elsewhere / "small.onnx").write_bytes((elsewhere / "small.onnx").read_bytes() + b"\0")
    assert "changed since the baseline" in remeasure_problem(baseline, report, "small")
    (elsewhere / "small.onnx").unlink()
    assert "not readable here" in remeasure_problem(baseline, report, "small")
    assert "records no file" in remeasure_problem({"models": [{"name": "small"}]}, report, "small")


def test_bench_environment_records_the_machine_load() -> None:
    env = collect_environment(1, cpu_counters())
    assert env.machine_load is not None and len(env.machine_load.load_avg) == 3
    assert "load " in describe_load(asdict(env.machine_load))


def test_paired_check_fails_a_cell_whose_provider_did_not_run(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    data = _paired_report(tmp_path, make_linear, weights)
    data["config"]["providers"] = ["cpu", "cuda"]
    data["unavailable"] = [{"provider": "cuda", "reason": "no GPU"}]
    monkeypatch.setattr("minreal.runtime_bench.check.decide_cell", _scripted(1.0, 60))
    result = check_report(data, max_latency_ratio=1.1, plan=DecisionPlan())
    verdicts = {c.provider: (c.passed, c.undecided) for c in result.criteria}
    assert verdicts == {"cpu": (True, False), "cuda": (False, False)}
    assert "no latency: provider cuda was unavailable (no GPU)" in format_check(result)


def test_paired_regression_on_other_hardware_needs_no_allowance_when_remeasured(
        tmp_path: Path, make_linear: Callable, weights: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    report = _paired_report(tmp_path, make_linear, weights)
    elsewhere = tmp_path / "old"
    elsewhere.mkdir()
    baseline = {**_paired_report(elsewhere, make_linear, weights), "environment": {"cpu_model": "another cpu"}}
    monkeypatch.setattr("minreal.runtime_bench.check.decide_cell", _scripted(1.0, 60))
    result = check_report(report, baseline=baseline, max_regression=10, plan=DecisionPlan())
    assert result.passed and {c.name for c in result.criteria} == {"latency_regression_pct"}
    (elsewhere / "small.onnx").unlink()  # one cell falls back to the heuristic: the hardware matters again
    result = check_report(report, baseline=baseline, max_regression=10, plan=DecisionPlan())
    assert not result.passed and "same_hardware" in {c.name for c in result.criteria if not c.passed}
