"""``check --paired`` as a user meets it: model paths resolved against the report's folder, the time budget bounding
each pair, nothing checked refused, a baseline that cannot be re-measured left undecided, flags checked before any
work, a measurement that could not be made undecided (never a failure), and the decision's evidence in ``--json``
(the paired processes scripted, except in one test that starts real ones), alpha split over the whole gate's paired
cells, and a gate with nothing to check, or a case dropped from its baseline, never passing."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from minreal.runtime_bench import check_report
from minreal.runtime_bench.check_paired import cell_config, remeasure_problem, with_model_folder
from minreal.runtime_bench.decision import DecisionPlan, LatencyDecision, sequential_decision
from minreal.runtime_bench.errors import CheckError, WorkerError
from minreal.runtime_bench.worker import WorkerResult

DECIDE = "minreal.runtime_bench.check.decide_cell"


def _report(folder: Path, make_linear: Callable, weights: tuple, relative: bool = False) -> dict:
    """A two-model bench report of real tiny ONNX files in ``folder``; paths relative to ``folder`` if ``relative``."""
    paths = [make_linear(folder / f"{name}.onnx", *weights) for name in ("orig", "small")]
    cells = [{"model": name, "provider": "cpu", "batch_size": 1, "stats": {"p50_ms": 1.0}, "process_p50_ms": [1.0]}
             for name in ("orig", "small")]
    return {"schema_version": 1, "environment": {"cpu_model": "test cpu"},
            "config": {"providers": ["cpu"], "batch_sizes": [1], "warmup": 1, "min_runs": 3},
            "models": [{"name": p.stem, "path": p.name if relative else str(p), "file_size_bytes": p.stat().st_size}
                       for p in paths],
            "latency": cells, "ratios": [{"model": "small", "provider": "cpu", "batch_size": 1, "median": 1.0}],
            "metrics": []}


def _scripted(ratio: float, pairs: int, seen: list | None = None) -> Callable:
    """A stand-in for re-measuring that records the files it was given and decides ``pairs`` pairs of ``ratio``."""
    def decide_cell(reference, candidate, data, cell, allowed, plan, progress=None) -> LatencyDecision:
        if seen is not None:
            seen.append((reference, candidate))
        assert reference.is_file() and candidate.is_file()
        capped = replace(plan, min_pairs=min(plan.min_pairs, pairs), max_pairs=pairs)
        return sequential_decision(lambda _: ratio, allowed, capped, clock=lambda: 0.0)
    return decide_cell


def _refused(*_: object, **__: object) -> LatencyDecision:
    raise AssertionError("no paired process may start")


# --- 1. model paths resolved against the report's folder -----------------------------------------------------------

def _run_dir(tmp_path: Path, make_linear: Callable, weights: tuple) -> Path:
    """A run directory ``run/`` whose case ``c`` names its files relative to ``run/c/``, as ``minreal run`` writes."""
    case = tmp_path / "run" / "c"
    case.mkdir(parents=True)
    report = tmp_path / "run" / "report.json"
    report.write_text(json.dumps({"schema_version": 1, "cases": [
        {"name": "c", "bench": _report(case, make_linear, weights, relative=True)}]}))
    return report


def test_a_run_report_is_checked_from_outside_its_folder(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                         run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    report, seen = _run_dir(tmp_path, make_linear, weights), []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(DECIDE, _scripted(1.0, 60, seen))
    code, _, err = run_cli(["check", "run/report.json", "--max-latency-ratio", "1.1", "--paired", "-q"])
    assert code == 0, err
    assert [(r.resolve(), c.resolve()) for r, c in seen] == [(report.parent / "c" / "orig.onnx",
                                                              report.parent / "c" / "small.onnx")]


def test_a_bench_report_is_checked_from_outside_its_folder(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                           run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "r.json").write_text(json.dumps(_report(tmp_path / "out", make_linear, weights, True)))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setattr(DECIDE, _scripted(1.0, 60))
    assert run_cli(["check", "../out/r.json", "--max-latency-ratio", "1.1", "--paired", "-q"])[0] == 0


def test_a_baseline_elsewhere_naming_the_same_relative_file_is_not_the_reports(
        tmp_path: Path, make_linear: Callable, weights: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "old").mkdir()
    report = with_model_folder(_report(tmp_path, make_linear, weights, True), tmp_path)
    baseline = with_model_folder(_report(tmp_path / "old", make_linear, weights, True), tmp_path / "old")
    monkeypatch.chdir(tmp_path)  # small.onnx here is the report's; the baseline's is old/small.onnx
    assert remeasure_problem(baseline, report, "small") == ""
    assert "same file" in remeasure_problem(report, report, "small")


def test_check_remeasures_a_baseline_elsewhere_against_its_own_file(
        tmp_path: Path, make_linear: Callable, weights: tuple, run_cli: Callable,
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "r.json").write_text(json.dumps(_report(tmp_path, make_linear, weights, True)))
    (tmp_path / "old" / "b.json").write_text(json.dumps(_report(tmp_path / "old", make_linear, weights, True)))
    monkeypatch.chdir(tmp_path)
    seen: list = []
    monkeypatch.setattr(DECIDE, _scripted(1.0, 60, seen))
    code, out, err = run_cli(["check", "r.json", "--baseline", "old/b.json", "--max-regression", "10", "--paired"])
    assert code == 0 and "heuristic" not in out, err
    assert sorted((r.resolve(), c.resolve()) for r, c in seen) == [
        (tmp_path / "old" / f"{n}.onnx", tmp_path / f"{n}.onnx") for n in ("orig", "small")]


def test_relative_paths_that_name_no_file_beside_the_report_are_kept(tmp_path: Path) -> None:
    data = {"models": [{"name": "a", "path": "gone.onnx"}, {"name": "b", "path": "/abs/b.onnx"}, {"name": "c"},
                       {"name": "d", "path": "x" * 5000}, {"name": "e", "path": "a\0b"}, "not a model"]}
    assert with_model_folder(data, tmp_path) == data


def test_check_paired_runs_real_processes_from_outside_the_run_folder(
        tmp_path: Path, make_linear: Callable, weights: tuple, run_cli: Callable,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's CI recipe, run from the run's parent folder, re-measures the case's real files (a tiny MLP against
    itself: at 12 short pairs the verdict is not a failure, and no path is refused)."""
    _run_dir(tmp_path, make_linear, weights)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["check", "run/report.json", "--max-latency-ratio", "5", "--paired", "--pair-seconds",
                              "0.02", "--max-pairs", "12", "-q"])
    assert code in (0, 3), err
    assert "not readable here" not in err and "paired processes" in out


# --- 2. --gate-seconds bounds the gate -----------------------------------------------------------------------------

def test_a_pair_uses_a_short_protocol_whatever_the_report_asks(tmp_path: Path, make_linear: Callable,
                                                                weights: tuple) -> None:
    data = _report(tmp_path, make_linear, weights)
    data["config"].update(warmup=10 ** 6, min_runs=10 ** 9)
    config = cell_config(data, ("small", "cpu", 1, ""), DecisionPlan(pair_seconds=0.05))
    assert (config.warmup, config.min_runs, config.min_seconds) == (2, 5, 0.05)


def test_each_worker_gets_the_budget_left_and_a_slow_first_pair_is_announced(
        tmp_path: Path, make_linear: Callable, weights: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from minreal.runtime_bench import paired
    from minreal.runtime_bench.config import BenchConfig, ModelEntry

    now, limits, lines = [0.0], [], []

    def spawn(job, stem, timeout_s) -> WorkerResult:
        limits.append(timeout_s)
        now[0] += 4.0  # each pair takes 4 s on the injected clock
        return WorkerResult(0, "ok", ["CPUExecutionProvider"], {"reference": [1.0], "candidate": [1.0]})

    monkeypatch.setattr(paired, "_spawn", spawn)
    a, b = (make_linear(tmp_path / f"{n}.onnx", *weights) for n in "ab")
    plan = DecisionPlan(min_pairs=12, max_pairs=12, time_budget_s=10.0)
    d = paired.paired_decision(ModelEntry("a", a), ModelEntry("b", b), BenchConfig(providers=("cpu",)), 1.1, plan,
                               lines.append, clock=lambda: now[0])
    # the second pair starts with 10 - 4 s left; a third (8 + 4 s > 10 s) is not started
    assert limits == [10.0 + paired.TIMEOUT_MARGIN_S, 6.0 + paired.TIMEOUT_MARGIN_S]
    assert d.pairs == 2 and d.verdict == "undecided"
    assert any("the first look needs 12 pairs" in line and "fits about 2; expect undecided" in line
               for line in lines)
    assert all("b vs a (cpu batch 1)" in line for line in lines if line.startswith("paired process"))


def test_both_models_of_a_pair_run_on_one_shared_pool_in_alternating_order(
        tmp_path: Path, make_linear: Callable, weights: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from minreal.runtime_bench import paired
    from minreal.runtime_bench.config import BenchConfig, ModelEntry

    jobs = []

    def spawn(job, stem, timeout_s) -> WorkerResult:
        jobs.append(job)
        return WorkerResult(0, "ok", ["CPUExecutionProvider"], {"reference": [2.0], "candidate": [3.0]})

    monkeypatch.setattr(paired, "_spawn", spawn)
    a, b = (make_linear(tmp_path / f"{n}.onnx", *weights) for n in "ab")
    config = BenchConfig(providers=("cpu",), intra_op_threads=2)
    with paired.pair_ratios(ModelEntry("a", a), ModelEntry("b", b), config, 0.01) as next_ratio:
        assert [next_ratio(i) for i in range(3)] == [1.5] * 3
    ab, ba = ["reference", "candidate"], ["candidate", "reference"]
    assert [job.names for job in jobs] == [ab, ba, ab]
    assert all(job.shared_pool and job.threads == 2 for job in jobs)


# --- 3. nothing to check is refused --------------------------------------------------------------------------------

def test_paired_refuses_a_report_with_no_cell(tmp_path: Path, make_linear: Callable, weights: tuple,
                                             run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _report(tmp_path, make_linear, weights)
    data["config"].update(batch_sizes=[], providers=[])
    data.update(latency=[], ratios=[])
    (tmp_path / "r.json").write_text(json.dumps(data))
    monkeypatch.setattr(DECIDE, _refused)
    code, out, err = run_cli(["check", str(tmp_path / "r.json"), "--max-latency-ratio", "1.1", "--paired"])
    assert code == 2 and "no latency cells" in err and "passed" not in out
    assert len(err.strip().splitlines()) == 1


# --- 4. a baseline that cannot be re-measured ----------------------------------------------------------------------

def _gone_baseline(tmp_path: Path, make_linear: Callable, weights: tuple) -> tuple[Path, Path]:
    (tmp_path / "old").mkdir()
    (tmp_path / "r.json").write_text(json.dumps(_report(tmp_path, make_linear, weights)))
    (tmp_path / "old" / "b.json").write_text(json.dumps(_report(tmp_path / "old", make_linear, weights)))
    (tmp_path / "old" / "small.onnx").unlink()
    (tmp_path / "old" / "orig.onnx").unlink()
    return tmp_path / "r.json", tmp_path / "old" / "b.json"


def test_a_baseline_that_cannot_be_remeasured_is_undecided(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                           run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    report, base = _gone_baseline(tmp_path, make_linear, weights)
    monkeypatch.setattr(DECIDE, _refused)
    args = ["check", str(report), "--baseline", str(base), "--max-regression", "10", "--paired"]
    code, out, err = run_cli(args)
    assert code == 3 and err.startswith("UNDECIDED ") and "baseline's model file" in err
    assert "UNDECIDED  latency_regression_pct" in out and "machine load over the paired processes" not in out
    code, out, _ = run_cli([*args, "--allow-heuristic"])
    assert code == 0 and "only the medians heuristic is possible" in out


# --- 5. and 6. flags checked before any work -----------------------------------------------------------------------

@pytest.mark.parametrize("flags", [["--max-latency-ratio", "0"], ["--max-latency-ratio", "-1"],
                                   ["--max-latency-ratio", "1.1", "--alpha", "0.5"],
                                   ["--max-latency-ratio", "1.1", "--gate-seconds", "0"],
                                   ["--max-latency-ratio", "1.1", "--max-pairs", "0"]])
def test_bad_flags_are_refused_before_any_measurement(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                      run_cli: Callable, monkeypatch: pytest.MonkeyPatch,
                                                      flags: list[str]) -> None:
    (tmp_path / "r.json").write_text(json.dumps(_report(tmp_path, make_linear, weights)))
    monkeypatch.setattr(DECIDE, _refused)
    code, _, err = run_cli(["check", str(tmp_path / "r.json"), "--paired", *flags])
    assert code == 2 and "malformed" not in err and "error:" in err


def test_a_regression_of_minus_100_percent_is_refused(tmp_path: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["check", str(tmp_path / "r.json"), "--baseline", str(tmp_path / "b.json"),
                            "--max-regression", "-100"])
    assert code == 2 and "--max-regression" in err


def _least_pairs(alpha: float, looks: int) -> int:
    """The fewest pairs whose sign test bounds a median at ``alpha / looks`` one-sided: 2**-n <= alpha / looks."""
    return math.ceil(math.log2(looks / alpha))


def test_a_cap_that_cannot_decide_is_refused(tmp_path: Path, make_linear: Callable, weights: tuple,
                                             run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "r.json").write_text(json.dumps(_report(tmp_path, make_linear, weights)))
    monkeypatch.setattr(DECIDE, _refused)
    code, _, err = run_cli(["check", str(tmp_path / "r.json"), "--max-latency-ratio", "1.1", "--paired",
                            "--max-pairs", "4"])
    # a cap of 4 (one look, alpha 0.01) needs 7 pairs: 2**-7 <= 0.01 < 2**-6; a cap of 7 is one look of 7 pairs
    assert _least_pairs(0.01, 1) == 7 and DecisionPlan(min_pairs=4, max_pairs=4).least_pairs() == 7
    assert code == 2 and "--max-pairs 4 cannot decide at --alpha 0.01: at least 7 pairs are needed" in err
    assert DecisionPlan(min_pairs=7, max_pairs=7).least_pairs() == 7
    assert DecisionPlan().least_pairs() == _least_pairs(0.01, len(DecisionPlan().schedule()))


def test_paired_flags_that_judge_nothing_are_warned_about(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                          run_cli: Callable) -> None:
    data = _report(tmp_path, make_linear, weights)
    data["models"] = [{**m, "file_size_bytes": 10} for m in data["models"]]
    (tmp_path / "r.json").write_text(json.dumps(data))
    code, _, err = run_cli(["check", str(tmp_path / "r.json"), "--max-size-ratio", "2", "--paired", "--alpha", "0.05"])
    assert code == 0 and "warning: --paired, --alpha ignored: no latency criterion" in err
    code, _, err = run_cli(["check", str(tmp_path / "r.json"), "--max-latency-ratio", "2", "--max-pairs", "30"])
    assert code == 0 and "warning: --max-pairs ignored without --paired" in err


# --- 7. a measurement that could not be made -----------------------------------------------------------------------

def test_a_worker_that_timed_out_leaves_the_cell_undecided(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                           run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    def timed_out(*_: object, **__: object) -> LatencyDecision:
        raise WorkerError("worker for cpu batch 1 exceeded 90.0 s")

    (tmp_path / "r.json").write_text(json.dumps(_report(tmp_path, make_linear, weights)))
    monkeypatch.setattr("minreal.runtime_bench.check_paired.paired_decision", timed_out)
    code, out, err = run_cli(["check", str(tmp_path / "r.json"), "--max-latency-ratio", "1.1", "--paired", "--json"])
    assert code == 3 and "exceeded 90.0 s" in err and "did not run" not in err
    crit = json.loads(out)["reports"]["r"]["criteria"][0]
    assert crit["undecided"] and crit["evidence"]["pairs"] == 0


def test_an_error_inside_the_measurement_is_not_blamed_on_the_report(
        tmp_path: Path, make_linear: Callable, weights: tuple, run_cli: Callable,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> LatencyDecision:
        raise KeyError("candidate")

    (tmp_path / "r.json").write_text(json.dumps(_report(tmp_path, make_linear, weights)))
    monkeypatch.setattr("minreal.runtime_bench.check_paired.paired_decision", broken)
    code, _, err = run_cli(["check", str(tmp_path / "r.json"), "--max-latency-ratio", "1.1", "--paired"])
    assert code == 3 and "malformed" not in err and "could not be made (KeyError" in err


# --- 8. the evidence in --json, short stderr -----------------------------------------------------------------------

def test_the_decision_evidence_is_in_the_json(tmp_path: Path, make_linear: Callable, weights: tuple,
                                              run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "r.json").write_text(json.dumps(_report(tmp_path, make_linear, weights)))
    monkeypatch.setattr(DECIDE, _scripted(1.5, 60))
    code, out, err = run_cli(["check", str(tmp_path / "r.json"), "--max-latency-ratio", "1.1", "--paired", "--json"])
    evidence = json.loads(out)["reports"]["r"]["criteria"][0]["evidence"]
    assert code == 1 and evidence["verdict"] == "fail" and evidence["median_ratio"] == pytest.approx(1.5)
    assert evidence["lower"] == pytest.approx(1.5) and evidence["pairs"] == 12  # all 12 equal: decided at first look
    assert evidence["level"] == pytest.approx(0.01 / len(DecisionPlan().schedule()))
    assert len(err.strip().splitlines()) == 1 and len(err) < 300


def test_check_report_without_plan_has_no_evidence(tmp_path: Path, make_linear: Callable, weights: tuple) -> None:
    result = check_report(_report(tmp_path, make_linear, weights), max_latency_ratio=1.1)
    assert all(c.evidence is None for c in result.criteria)
    assert os.sep not in "".join(c.model for c in result.criteria)


# --- 9. alpha bounds the whole gate; nothing to check never passes ----------------------------------------------------

def _two_case_run(tmp_path: Path, make_linear: Callable, weights: tuple, batches: tuple[int, ...] = (1, 2)) -> Path:
    """A run report of cases ``a`` and ``b``, each a two-model bench at ``batches``: 2 x len(batches) paired cells."""
    cases = []
    for name in ("a", "b"):
        folder = tmp_path / "run" / name
        folder.mkdir(parents=True)
        bench = _report(folder, make_linear, weights, relative=True)
        bench["config"]["batch_sizes"] = list(batches)
        bench["latency"] = [{**r, "batch_size": b} for r in bench["latency"] for b in batches]
        bench["ratios"] = [{**r, "batch_size": b} for r in bench["ratios"] for b in batches]
        cases.append({"name": name, "bench": bench})
    report = tmp_path / "run" / "report.json"
    report.write_text(json.dumps({"schema_version": 1, "cases": cases}))
    return report


def test_alpha_is_split_over_every_paired_cell_of_every_case(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                             run_cli: Callable,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    report, seen = _two_case_run(tmp_path, make_linear, weights), []
    monkeypatch.setattr(DECIDE, _scripted(1.0, 60, seen))
    code, out, err = run_cli(["check", str(report), "--max-latency-ratio", "1.1", "--paired", "--json"])
    result = json.loads(out)
    assert code == 0, err
    assert len(seen) == 4  # 2 cases x 2 batch sizes, each decided once
    looks = len(DecisionPlan().schedule())
    assert result["error_rates"] == {"alpha": 0.01, "paired_cells": 4, "per_cell_alpha": 0.0025,
                                     "false_alarm_at_most": 0.01, "miss_at_most": 0.01, "heuristic_cells": 0}
    for case in result["reports"].values():
        for c in case["criteria"]:
            # Bonferroni over cells and looks: the levels of all tests a wrong verdict could come from sum to alpha
            assert c["evidence"]["cells"] == 4 and c["evidence"]["level"] * 4 * looks == pytest.approx(0.01)
        assert any("4 re-measured cells" in n and "probability at most 0.01" in n for n in case["notes"])
        assert any(n.startswith("machine load over the paired processes") for n in case["notes"])


def test_a_cap_too_small_for_the_gates_share_of_alpha_is_refused_before_any_process(
        tmp_path: Path, make_linear: Callable, weights: tuple, run_cli: Callable,
        monkeypatch: pytest.MonkeyPatch) -> None:
    report = _two_case_run(tmp_path, make_linear, weights, batches=(1,))
    monkeypatch.setattr(DECIDE, _refused)
    # one look of 7 pairs decides one cell at 0.01 (2**-7 <= 0.01); two cells each at 0.005 need 8 (2**-8 <= 0.005)
    assert DecisionPlan(min_pairs=7, max_pairs=7).least_pairs() == 7
    assert DecisionPlan(min_pairs=7, max_pairs=7, cells=2).least_pairs() == _least_pairs(0.005, 1) == 8
    code, _, err = run_cli(["check", str(report), "--max-latency-ratio", "1.1", "--paired", "--max-pairs", "7"])
    assert code == 2 and "--max-pairs" in err and "2 paired latency cells" in err and "allow 8 pairs at least" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("cells", [1, 2, 12, 100])
def test_the_cap_a_refusal_names_is_the_smallest_that_decides(cells: int) -> None:
    from minreal.runtime_bench.check import gate_plan
    from minreal.runtime_bench.decision import least_cap

    def plan(cap: int) -> DecisionPlan:  # as `check --paired --max-pairs CAP` builds it
        return DecisionPlan(min_pairs=min(12, cap), max_pairs=cap)

    cap = least_cap(0.01, cells)
    assert gate_plan(plan(cap), cells).cells == cells  # accepted
    with pytest.raises(CheckError, match=f"allow {cap} pairs at least"):
        gate_plan(plan(cap - 1), cells)
    if cells == 100:  # a larger cap adds looks (a lower level each): a refused cap's own need undercounts
        assert replace(plan(13), cells=100).least_pairs() == 15 and replace(plan(15), cells=100).least_pairs() == 16
        assert cap == 16


def test_a_plan_with_no_cell_to_remeasure_judges_nothing(tmp_path: Path, make_linear: Callable,
                                                          weights: tuple) -> None:
    result = check_report(_report(tmp_path, make_linear, weights), max_size_kb=1e6,
                          plan=DecisionPlan(min_pairs=3, max_pairs=3))
    assert result.passed and result.error_rates is None


def test_cells_judged_on_medians_are_named_apart_from_the_bound(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                                run_cli: Callable,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    report, base = _gone_baseline(tmp_path, make_linear, weights)
    monkeypatch.setattr(DECIDE, _scripted(1.0, 60))
    code, out, err = run_cli(["check", str(report), "--baseline", str(base), "--max-regression", "10",
                              "--max-latency-ratio", "1.1", "--paired", "--allow-heuristic", "--json"])
    result = json.loads(out)
    assert code == 0, err
    rates = result["error_rates"]
    assert rates["paired_cells"] == 1 and rates["heuristic_cells"] == 2  # the ratio re-measured; both models' medians
    notes = result["reports"]["r"]["notes"]
    assert any("2 latency cell(s) not re-measured were judged on medians" in n for n in notes)
    assert any("over those cells a false alarm" in n for n in notes)


def test_a_gate_with_nothing_to_check_is_refused(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                 run_cli: Callable) -> None:
    one = _report(tmp_path, make_linear, weights)
    one["models"], one["latency"] = one["models"][:1], one["latency"][:1]
    one["ratios"], one["metrics"] = [], [{"model": "orig", "accuracy": 0.9, "top1_agreement": None}]
    (tmp_path / "one.json").write_text(json.dumps(one))
    code, _, err = run_cli(["check", str(tmp_path / "one.json"), "--max-accuracy-drop", "1"])
    assert code == 2 and "--max-accuracy-drop" in err and "one model" in err
    (tmp_path / "empty.json").write_text(json.dumps({"schema_version": 1, "cases": []}))
    code, _, err = run_cli(["check", str(tmp_path / "empty.json"), "--max-accuracy-drop", "1"])
    assert code == 2 and "no cases" in err and "empty.json" in err


def test_a_bench_report_baseline_is_no_case_of_a_run(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                     run_cli: Callable) -> None:
    report = _two_case_run(tmp_path, make_linear, weights, batches=(1,))
    (tmp_path / "r.json").write_text(json.dumps(_report(tmp_path, make_linear, weights)))
    code, out, err = run_cli(["check", str(report), "--baseline", str(tmp_path / "r.json"), "--max-regression", "10",
                              "--allow-new-models"])
    assert code == 0 and "case_missing" not in out, err


def test_a_case_dropped_from_the_baseline_fails(tmp_path: Path, make_linear: Callable, weights: tuple,
                                                run_cli: Callable) -> None:
    baseline = _two_case_run(tmp_path / "old", make_linear, weights, batches=(1,))
    data = json.loads(baseline.read_text())
    data["cases"] = data["cases"][:1]
    report = tmp_path / "new.json"
    report.write_text(json.dumps(data))
    code, out, err = run_cli(["check", str(report), "--baseline", str(baseline), "--max-regression", "10"])
    assert code == 1 and "case_missing" in out and "'b' is in the baseline" in out and err.startswith("FAILED")
    code, _, err = run_cli(["check", str(tmp_path / "gone.json"), "--max-accuracy-drop", "1"])
    assert code == 2 and "report" in err and "gone.json" in err
    code, _, err = run_cli(["check", str(report), "--baseline", str(tmp_path / "gone.json"), "--max-regression", "10"])
    assert code == 2 and "baseline" in err and "gone.json does not exist" in err


def test_one_case_against_a_baseline_case_of_another_name_says_so(tmp_path: Path, make_linear: Callable,
                                                                   weights: tuple, run_cli: Callable) -> None:
    old, new = (_two_case_run(tmp_path / d, make_linear, weights, batches=(1,)) for d in ("old", "new"))
    for path, keep in ((old, 0), (new, 1)):
        data = json.loads(path.read_text())
        data["cases"] = data["cases"][keep:keep + 1]
        path.write_text(json.dumps(data))
    code, out, err = run_cli(["check", str(new), "--baseline", str(old), "--max-regression", "10"])
    assert code == 0, err
    assert "NOTE  the baseline's one case 'a' is compared with the report's one case 'b'" in out
