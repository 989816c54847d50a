"""Hostile release gate: models absent from the baseline, noisy machines, missing gated latencies, and FAILED
lines that name the provider and batch size."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from minreal.app.gate import check_reports
from minreal.runtime_bench import SCHEMA_VERSION, check_report, format_check

Cell = tuple[str, str, int]


def report(p50: dict[Cell, tuple[float, ...]], providers: tuple[str, ...] = ("cpu",),
           batches: tuple[int, ...] = (1, 32), unavailable: dict[str, str] | None = None) -> dict[str, Any]:
    """A bench report dict; ``p50`` gives each cell's per-process p50s (pooled p50: their median)."""
    def median(v: tuple[float, ...]) -> float:
        return sorted(v)[len(v) // 2]

    models = list(dict.fromkeys(m for m, _, _ in p50))
    latency = [{"model": m, "provider": p, "batch_size": b, "stats": {"p50_ms": median(v)}, "process_p50_ms": list(v)}
               for (m, p, b), v in p50.items()]
    ratios = [{"model": m, "provider": p, "batch_size": b, "median": median(v) / median(p50[(models[0], p, b)])}
              for (m, p, b), v in p50.items() if m != models[0]]
    return {"schema_version": SCHEMA_VERSION, "environment": {"cpu_model": "test cpu"},
            "config": {"providers": list(providers), "batch_sizes": list(batches)},
            "models": [{"name": m} for m in models], "latency": latency, "ratios": ratios, "metrics": [],
            "unavailable": [{"provider": p, "requested": p, "reason": r} for p, r in (unavailable or {}).items()]}


BASE = {("orig", "cpu", 1): (2.0, 2.1, 2.2), ("small", "cpu", 1): (1.0, 1.05, 1.1),
        ("orig", "cpu", 32): (10.0, 10.2, 10.4), ("small", "cpu", 32): (8.0, 8.1, 8.2)}


# --- a model absent from the baseline --------------------------------------------------------------------------

def test_model_absent_from_baseline_fails_listing_every_cell() -> None:
    now = report({**BASE, ("new", "cpu", 1): (3.0,), ("new", "cpu", 32): (9.0,)})
    result = check_report(now, baseline=report(BASE), max_regression=10.0)
    failed = [(c.model, c.provider, c.batch_size) for c in result.criteria if not c.passed]
    assert failed == [("new", "cpu", 1), ("new", "cpu", 32)]
    assert all("not in the baseline" in c.note for c in result.criteria if not c.passed)
    allowed = check_report(now, baseline=report(BASE), max_regression=10.0, allow_new_models=True)
    assert allowed.passed and sum("not in the baseline" in c.note for c in allowed.criteria) == 2


def test_cli_allow_new_models(tmp_path: Path, run_cli: Callable) -> None:
    (tmp_path / "now.json").write_text(json.dumps(report({**BASE, ("new", "cpu", 1): (3.0,)}, batches=(1,))))
    (tmp_path / "base.json").write_text(json.dumps(report(BASE)))
    args = ["check", str(tmp_path / "now.json"), "--baseline", str(tmp_path / "base.json"), "--max-regression", "10"]
    code, _, err = run_cli(args)
    assert code == 1 and "new cpu batch 1" in err and "not in the baseline" in err
    code, out, err = run_cli([*args, "--allow-new-models"])
    assert code == 0, err
    assert "PASS  latency_regression_pct  new cpu batch 1" in out


def test_case_absent_from_baseline_needs_allow_new_models(tmp_path: Path) -> None:
    run_report = {"schema_version": 1, "cases": [{"name": "a", "bench": report(BASE)},
                                                 {"name": "b", "bench": report(BASE)}]}
    base = {"schema_version": 1, "cases": [{"name": "a", "bench": report(BASE)}]}
    (tmp_path / "run.json").write_text(json.dumps(run_report))
    (tmp_path / "base.json").write_text(json.dumps(base))
    from minreal.runtime_bench import CheckError

    with pytest.raises(CheckError, match="no case named 'b'.*--allow-new-models"):
        check_reports(tmp_path / "run.json", tmp_path / "base.json", None, None, None, 10.0)
    results = dict(check_reports(tmp_path / "run.json", tmp_path / "base.json", None, None, None, 10.0,
                                 allow_new_models=True))
    assert results["a"].passed and results["b"].passed
    assert all("not in the baseline" in c.note for c in results["b"].criteria)


# --- regressions within the measured noise ---------------------------------------------------------------------

def test_regression_over_threshold_but_within_noise_passes() -> None:
    # bimodal machine: one slow process in each run; pooled p50 +14 % but the per-process ranges overlap
    base = {**BASE, ("small", "cpu", 32): (8.0, 8.1, 9.4)}
    now = report({**BASE, ("small", "cpu", 32): (8.2, 9.23, 9.5)})
    (crit,) = [c for c in check_report(now, baseline=report(base), max_regression=10.0).criteria
               if (c.model, c.batch_size) == ("small", 32)]
    assert crit.measured == pytest.approx(14.0, abs=0.1) and crit.passed
    assert "> 10% but within noise: per-process p50 ranges overlap" in crit.note


def test_regression_over_threshold_and_beyond_noise_fails() -> None:
    now = report({**BASE, ("small", "cpu", 32): (9.2, 9.3, 9.4)})
    result = check_report(now, baseline=report(BASE), max_regression=10.0)
    (crit,) = [c for c in result.criteria if not c.passed]
    assert (crit.model, crit.provider, crit.batch_size) == ("small", "cpu", 32)
    assert "beyond noise: per-process p50 ranges do not overlap" in crit.note
    assert "FAIL  latency_regression_pct  small cpu batch 32: 14.8" in format_check(result)


def test_regression_within_threshold_says_so() -> None:
    now = report({**BASE, ("small", "cpu", 32): (8.5, 8.6, 8.7)})
    result = check_report(now, baseline=report(BASE), max_regression=10.0)
    assert result.passed
    assert all("within the threshold" in c.note for c in result.criteria)


# --- gated latencies that are missing --------------------------------------------------------------------------

def test_unavailable_provider_fails_latency_gate() -> None:
    now = report(BASE, providers=("cpu", "cuda"), unavailable={"cuda": "CUDAExecutionProvider is not in this build"})
    result = check_report(now, max_latency_ratio=2.0)
    failed = [c for c in result.criteria if not c.passed]
    assert [(c.model, c.provider, c.batch_size) for c in failed] == [("small", "cuda", 1), ("small", "cuda", 32)]
    assert all("provider cuda was unavailable" in c.note for c in failed)
    assert "FAIL  latency_ratio  small cuda batch 1: missing" in format_check(result)


def test_only_unavailable_providers_is_a_failure_not_a_pass() -> None:
    now = report({}, providers=("cuda",), unavailable={"cuda": "not built"})
    now["models"] = [{"name": "orig"}, {"name": "small"}]
    result = check_report(now, max_latency_ratio=2.0)
    assert not result.passed and [c.provider for c in result.criteria] == ["cuda", "cuda"]


def test_cell_that_did_not_run_fails_latency_and_regression_gates() -> None:
    cells = {k: v for k, v in BASE.items() if k[2] == 1}  # config asked for batch 32 too
    now = report(cells, batches=(1, 32))
    ratio = check_report(now, max_latency_ratio=2.0)
    assert [(c.model, c.batch_size, c.note) for c in ratio.criteria if not c.passed] == [
        ("small", 32, "no latency recorded for this cell")]
    regression = check_report(now, baseline=report(BASE), max_regression=10.0)
    assert {(c.model, c.batch_size) for c in regression.criteria if not c.passed} == {("orig", 32), ("small", 32)}


# --- FAILED lines name provider and batch ----------------------------------------------------------------------

def test_cli_failed_line_names_provider_and_batch(tmp_path: Path, run_cli: Callable) -> None:
    (tmp_path / "r.json").write_text(json.dumps(report(BASE)))
    code, _, err = run_cli(["check", str(tmp_path / "r.json"), "--max-latency-ratio", "0.6"])
    assert code == 1
    failed = [line for line in err.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "latency_ratio small cpu batch 32: 0.79" in failed[0]
    assert "batch 1:" not in failed[0]  # the passing cell is not listed


# --- malformed or shrinking baselines (review findings) ---------------------------------------------------------

def test_nan_latency_in_the_baseline_is_a_schema_error_naming_the_cell(tmp_path: Path,
                                                                        run_cli: Callable) -> None:
    bad = report(BASE)
    bad["latency"][0]["stats"]["p50_ms"] = float("nan")
    (tmp_path / "now.json").write_text(json.dumps(report(BASE)))
    (tmp_path / "base.json").write_text(json.dumps(bad))
    code, _, err = run_cli(["check", str(tmp_path / "now.json"), "--baseline", str(tmp_path / "base.json"),
                            "--max-regression", "10"])
    assert code == 2 and "base.json" in err and "orig cpu batch 1" in err and "p50_ms" in err
    assert len(err.strip().splitlines()) == 1


def test_model_dropped_from_the_report_fails_the_regression_gate() -> None:
    now = report({k: v for k, v in BASE.items() if k[0] == "orig"})
    result = check_report(now, baseline=report(BASE), max_regression=10.0, allow_new_models=True)
    failed = sorted((c.model, c.batch_size) for c in result.criteria if not c.passed)
    assert failed == [("small", 1), ("small", 32)]
    assert all("in the baseline but not in the report" in c.note for c in result.criteria if not c.passed)


def test_baseline_sharing_no_cell_is_refused_even_with_new_models_allowed() -> None:
    from minreal.runtime_bench import CheckError

    other = report({("x", "cpu", 1): (1.0,), ("y", "cpu", 1): (1.0,)}, batches=(1,))
    with pytest.raises(CheckError, match="shares no"):
        check_report(report(BASE), baseline=other, max_regression=10.0, allow_new_models=True)
