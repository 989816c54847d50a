"""benchmarks/gate_power.py's statistics, checked against facts: the moving-block bootstrap keeps consecutive pairs
together, the exact binomial interval matches its textbook values, exit statuses map to verdicts (anything else
aborts), a red build on the identical model (fail or undecided) counts as a false alarm, and the recorded ratios
split by order tell a position effect from an effect by process."""

from __future__ import annotations

import sys
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from gate_power import (
    GOAL,
    HarnessError,
    block_indices,
    by_order,
    clopper_pearson,
    e2e_summary,
    goal_met,
    resample,
    verdict_of,
    wilson,
)

from minreal.runtime_bench import DecisionPlan


def test_block_indices_are_runs_of_consecutive_pairs_from_every_start() -> None:
    rng = np.random.default_rng(0)
    drawn = list(islice(block_indices(10, 4, rng), 4 * 500))
    blocks = [drawn[i:i + 4] for i in range(0, len(drawn), 4)]
    assert all(b == list(range(b[0], b[0] + 4)) for b in blocks)  # order kept within each block
    assert {b[0] for b in blocks} == set(range(7))  # every one of the n - block + 1 starts is drawn
    assert list(islice(block_indices(3, 5, rng), 6)) == [0, 1, 2, 0, 1, 2]  # block longer than the record: all of it


def test_clopper_pearson_matches_its_closed_forms() -> None:
    # 0 of n: upper bound 1 - (a/2)^(1/n); n of n: lower bound (a/2)^(1/n) (Clopper & Pearson 1934)
    assert clopper_pearson(0, 10) == [0.0, pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-5)]
    assert clopper_pearson(10, 10) == [pytest.approx(0.025 ** (1 / 10), abs=1e-5), 1.0]
    low, high = clopper_pearson(5, 10)
    assert low == pytest.approx(0.18709, abs=1e-5) and high == pytest.approx(0.81291, abs=1e-5)


def test_exit_statuses_are_verdicts_and_a_usage_error_aborts() -> None:
    assert [verdict_of(s) for s in (0, 1, 3)] == ["pass", "fail", "undecided"]
    for status in (2, 4, -9):
        with pytest.raises(HarnessError, match=f"exited {status}"):
            verdict_of(status, "Error: no such option")


def test_e2e_summary_counts_verdicts_with_exact_intervals_and_wall_time() -> None:
    runs = [{"verdict": v, "wall_s": w} for v, w in (("pass", 10.0), ("undecided", 60.0), ("fail", 20.0))]
    out = e2e_summary(runs)
    assert (out["pass"], out["fail"], out["undecided"], out["fail_or_undecided"]) == (1, 1, 1, 2)
    assert out["fail_or_undecided_95ci"] == clopper_pearson(2, 3)
    assert (out["wall_s_median"], out["wall_s_max"]) == (20.0, 60.0)


def _rows(same: dict[str, float], caught: dict[str, float]) -> list[dict]:
    def resampled(rates: dict[str, float]) -> dict:
        out = {"gate_seconds_p95": 30.0, "gate_seconds_median": 20.0, "gate_seconds_max": 50.0}
        for name in ("fail", "pass", "undecided"):
            out[f"{name}_rate"] = rates[name]
            out[f"{name}_rate_95ci"] = wilson(round(rates[name] * 1000), 1000)
        out["fail_or_undecided_rate"] = rates["fail"] + rates["undecided"]
        out["fail_or_undecided_rate_95ci"] = wilson(round(out["fail_or_undecided_rate"] * 1000), 1000)
        return out

    return [{"target_ratio": 1.0, "resampled": resampled(same)},
            {"target_ratio": GOAL["detect_ratio"], "resampled": resampled(caught)}]


def test_undecided_on_the_identical_model_is_a_false_alarm_and_on_a_regression_is_no_catch() -> None:
    out = goal_met(_rows({"fail": 0.0, "pass": 0.95, "undecided": 0.05}, {"fail": 0.9, "pass": 0.0, "undecided": 0.1}))
    assert (out["false_alarm_fail_rate"], out["false_alarm_undecided_rate"]) == (0.0, 0.05)
    assert out["false_alarm_rate"] == pytest.approx(0.05) and not out["false_alarms_ok"]
    assert (out["detection_rate_15pct"], out["undecided_rate_15pct"]) == (0.9, 0.1) and not out["detection_ok"]
    good = goal_met(_rows({"fail": 0.004, "pass": 0.992, "undecided": 0.004},
                          {"fail": 0.97, "pass": 0.0, "undecided": 0.03}))
    assert good["false_alarms_ok"] and good["detection_ok"] and good["time_ok"]
    assert good["gate_seconds_max_by_model"] == {"1.0": 50.0, str(GOAL["detect_ratio"]): 50.0}


def test_resampling_keeps_a_drift_that_independent_draws_would_erase() -> None:
    # 40 identical-model ratios: 20 quiet ones at 1.0, then a load burst of 20 consecutive pairs at 1.2 (above the
    # allowed 1.075). A trial reads one block of 12: the 9 of its 29 starts inside the burst give 12 loaded pairs and
    # a fail; a block of 1 (independent draws) mixes quiet and loaded pairs and hardly ever draws 12 loaded ones.
    ratios = [1.0] * 20 + [1.2] * 20
    walls = [1.0] * 40
    plan = DecisionPlan(min_pairs=12, max_pairs=12, looks=1)
    blocked = resample(ratios, walls, plan, 400, seed=0, block=12)
    assert blocked["block"] == 12 and blocked["fail_rate"] == pytest.approx(9 / 29, abs=0.07)
    assert blocked["fail_or_undecided_rate"] == pytest.approx(blocked["fail_rate"] + blocked["undecided_rate"])
    assert blocked["gate_seconds_max"] == 12.0 and blocked["mean_pairs"] == 12.0
    independent = resample(ratios, walls, plan, 400, seed=0, block=1)
    assert independent["fail_rate"] < 0.05


def test_a_check_that_gives_no_verdict_aborts_the_run_and_writes_nothing(tmp_path: Path) -> None:
    import gate_power

    def runner(_: object) -> dict:
        gate_power.verdict_of(2, "Error: No such option: --pair-seconds")
        return {}

    with pytest.raises(SystemExit) as info:
        gate_power.main(["--out", str(tmp_path / "g.json")], runner=runner)
    assert info.value.code == 2 and not (tmp_path / "g.json").exists()


def test_by_order_tells_a_position_effect_from_an_effect_by_process() -> None:
    position = by_order([1.1, 0.9] * 10)  # the model timed first is 10 % slower in every process
    assert position["reference_first_median"] == pytest.approx(1.1)
    assert position["candidate_first_median"] == pytest.approx(0.9)
    assert position["share_off_20pct"] == 0.0
    by_process = by_order([1.7, 0.6, 0.6, 1.7, 1.0, 1.0])  # one model 1.7x slower in a process, either one by chance
    assert by_process["reference_first_median"] == pytest.approx(1.0)
    assert by_process["candidate_first_median"] == pytest.approx(1.0)
    assert by_process["share_off_20pct"] == pytest.approx(4 / 6)
