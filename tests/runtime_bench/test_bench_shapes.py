"""Benchmarks of several named inputs over symbolic-axis shapes: cells (provider, batch, shape), the report's shape
column, older reports without shapes, and the release gate keyed by shape."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from minreal.runtime_bench import (
    SCHEMA_VERSION,
    BenchConfig,
    ModelEntry,
    check_report,
    format_check,
    format_table,
    load_report,
    run_benchmark,
    write_json,
    write_markdown,
)
from minreal.runtime_bench.errors import BenchInputError
from minreal.runtime_bench.worker import WorkerJob, run_job, save_data

FAST = dict(warmup=1, min_runs=3, min_seconds=0.0, repeats=1, intra_op_threads=1)
VOCAB = 50


def _data(rows: int = 5, seq: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    return {"input_ids": rng.integers(0, VOCAB, (rows, seq)), "attention_mask": np.ones((rows, seq), np.int64)}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, make_tokens) -> list[ModelEntry]:
    folder = tmp_path_factory.mktemp("shapes")
    return [ModelEntry("a", make_tokens(folder / "a.onnx", vocab=VOCAB)),
            ModelEntry("b", make_tokens(folder / "b.onnx", vocab=VOCAB, cast_ids=True))]


@pytest.fixture(scope="module")
def shaped(models: list[ModelEntry]):
    """One benchmark of two two-input models at batch 1 and 2, seq 4 and 8 (4 worker processes)."""
    messages: list[str] = []
    config = BenchConfig(batch_sizes=(1, 2), axis_values={"seq": (4, 8)}, **FAST)
    return run_benchmark(models, config, _data(), progress=messages.append), messages


def test_latency_per_batch_and_shape(shaped) -> None:
    report, messages = shaped
    assert len(report.latency) == 2 * 2 * 2  # models x batch sizes x shapes
    cells = [(r.batch_size, r.shape) for r in report.latency]
    assert {c: cells.count(c) for c in cells} == {(1, "seq=4"): 2, (1, "seq=8"): 2, (2, "seq=4"): 2, (2, "seq=8"): 2}
    assert all(r.stats.runs == FAST["min_runs"] and len(r.worker_pids) == 1 for r in report.latency)
    assert sorted((r.model, r.batch_size, r.shape) for r in report.ratios) == [
        ("b", 1, "seq=4"), ("b", 1, "seq=8"), ("b", 2, "seq=4"), ("b", 2, "seq=8")]
    assert len({r.worker_pids for r in report.latency}) == 4  # a fresh process per cell
    assert "timing cpu batch 2 seq=8 (process 1/1)" in messages


def test_metrics_use_the_data_as_given(shaped) -> None:
    report, _ = shaped
    assert [m.samples for m in report.metrics] == [5, 5]
    assert report.metrics[1].top1_agreement == 1.0 and report.metrics[1].max_abs_diff == 0.0
    assert report.metrics_data == "the evaluation data (5 rows)"


def test_table_markdown_and_json_carry_the_shape(tmp_path: Path, shaped) -> None:
    report, _ = shaped
    table = format_table(report)
    assert table.splitlines()[0].split()[:4] == ["model", "provider", "batch", "shape"]
    assert sum(" seq=4 " in line for line in table.splitlines()) == 4
    text = write_markdown(report, tmp_path / "r.md").read_text()
    assert "| b | cpu | 2 | seq=8 |" in text and "(provider, batch size, shape)" in text
    loaded = load_report(write_json(report, tmp_path / "r.json"))
    assert loaded["config"]["axis_values"] == {"seq": [4, 8]}
    assert {r["shape"] for r in loaded["latency"]} == {r["shape"] for r in loaded["ratios"]} == {"seq=4", "seq=8"}
    result = check_report(loaded, max_latency_ratio=100.0)
    assert sorted((c.batch_size, c.shape) for c in result.criteria) == [
        (1, "seq=4"), (1, "seq=8"), (2, "seq=4"), (2, "seq=8")]
    assert result.passed


def test_worker_cuts_data_to_the_shape(tmp_path: Path, models: list[ModelEntry]) -> None:
    job = WorkerJob(names=[m.name for m in models], paths=[str(m.path) for m in models],
                    provider="CPUExecutionProvider", batch_size=3, threads=1, warmup=0, min_runs=2, min_seconds=0.0,
                    seed=0, data_path=save_data(_data(), tmp_path), axis_values={"seq": 4})
    result = run_job(job)
    assert result.status == "ok" and all(len(v) == 2 for v in result.latencies_ms.values())


def test_without_data_random_inputs_take_the_shape(models: list[ModelEntry]) -> None:
    report = run_benchmark(models[:1], BenchConfig(axis_values={"seq": 3}, **FAST))
    assert [(r.batch_size, r.shape) for r in report.latency] == [(1, "seq=3")]
    assert report.metrics[0].samples == 64 and "random" in report.metrics_data and "seq=3" in report.metrics_data


@pytest.mark.parametrize(
    ("x", "axis_values", "match"),
    [
        (_data(seq=8), {"seq": (4, 16)}, r"model 'a' input 'input_ids' axis 1 \('seq'\) has length 8 in the data, "
                                         r"shorter than the requested seq=16"),
        ({"input_ids": _data()["input_ids"]}, {}, r"model 'a' input 'attention_mask' has no array in data x"),
        (None, {}, r"model 'a' input 'input_ids' .* axis 1 \('seq'\) has no value; give "
                    r"`BenchConfig.axis_values` lengths for seq"),
        (None, {"sequence": 4}, r"axis_values \(--axis-values\) names \['sequence'\], which no model input has"),
        ({**_data(), "attention_mask": np.ones((4, 8))}, {}, r"different row counts"),
    ],
)
def test_bad_named_inputs_fail_before_any_worker(models: list[ModelEntry], x, axis_values, match: str) -> None:
    messages: list[str] = []
    with pytest.raises(BenchInputError, match=match):
        run_benchmark(models, BenchConfig(axis_values=axis_values, **FAST), x, progress=messages.append)
    assert not any(m.startswith("timing") for m in messages)


def test_config_rejects_bad_axis_values() -> None:
    with pytest.raises(BenchInputError, match=r"axis_values\['seq'\] must be integers >= 1"):
        BenchConfig(axis_values={"seq": (0,)})
    with pytest.raises(BenchInputError, match=r"axis_values names must be"):
        BenchConfig(axis_values={"seq=4": (4,)})
    assert BenchConfig(axis_values={"seq": np.int64(4)}).shapes() == ({"seq": 4},)
    assert BenchConfig().shapes() == ({},)


def _report(p50: dict[tuple[str, int, str], float], axis_values: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """A minimal report dict: models 'orig' (reference) and 'small' on cpu, latencies by (model, batch, shape)."""
    latency = [{"model": m, "provider": "cpu", "batch_size": b, "shape": s, "stats": {"p50_ms": v}}
               for (m, b, s), v in p50.items()]
    ratios = [{"model": m, "provider": "cpu", "batch_size": b, "shape": s, "median": v / p50[("orig", b, s)]}
              for (m, b, s), v in p50.items() if m != "orig"]
    config = {} if axis_values is None else {"providers": ["cpu"], "batch_sizes": [1], "axis_values": axis_values}
    return {"schema_version": SCHEMA_VERSION, "environment": {"cpu_model": "test cpu"}, "config": config,
            "models": [{"name": "orig"}, {"name": "small"}], "latency": latency, "ratios": ratios, "metrics": []}


def _cells(shapes: dict[str, tuple[float, float]]) -> dict[tuple[str, int, str], float]:
    """Batch-1 latencies of 'orig' and 'small' per shape label."""
    return {(model, 1, s): v for s, pair in shapes.items() for model, v in zip(("orig", "small"), pair)}


def test_gate_keys_cells_by_shape() -> None:
    baseline = _report(_cells({"seq=4": (2.0, 1.0), "seq=8": (4.0, 2.0)}))
    report = _report(_cells({"seq=4": (2.0, 1.5), "seq=16": (8.0, 4.0)}))
    result = check_report(report, baseline=baseline, max_regression=10.0, allow_new_models=True)
    by_cell = {(c.model, c.shape): c for c in result.criteria}
    assert set(by_cell) == {(m, s) for m in ("orig", "small") for s in ("seq=4", "seq=8", "seq=16")}
    assert by_cell[("small", "seq=4")].measured == pytest.approx(50.0) and not by_cell[("small", "seq=4")].passed
    assert by_cell[("orig", "seq=4")].passed
    assert all(by_cell[(m, "seq=16")].passed and "not in the baseline" in by_cell[(m, "seq=16")].note
               for m in ("orig", "small"))
    missing = [by_cell[(m, "seq=8")] for m in ("orig", "small")]
    assert all(not c.passed and "in the baseline but not in the report" in c.note for c in missing)
    assert "FAIL  latency_regression_pct  small cpu batch 1 seq=8: missing" in format_check(result)


def test_gate_fails_a_requested_shape_without_latency() -> None:
    report = _report(_cells({"seq=4": (2.0, 1.0)}), axis_values={"seq": [4, 8]})
    result = check_report(report, max_latency_ratio=0.6)
    assert [(c.shape, c.passed) for c in result.criteria] == [("seq=4", True), ("seq=8", False)]
    assert result.criteria[1].note == "no latency recorded for this cell"


def test_reports_without_shapes_still_load_and_gate(tmp_path: Path, bench_report) -> None:
    report, _ = bench_report
    old = json.loads(json.dumps(asdict(report)))
    for row in old["latency"] + old["ratios"]:
        del row["shape"]
    del old["config"]["axis_values"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    loaded = load_report(path)
    assert {r["shape"] for r in loaded["latency"] + loaded["ratios"]} == {""}
    assert "shape" not in old["latency"][0]  # the caller's rows are not changed
    result = check_report(old, baseline=report, max_regression=1e6, max_latency_ratio=1e6)
    regression = [c for c in result.criteria if c.name == "latency_regression_pct" and c.provider == "cpu"]
    assert len(regression) == len(report.latency) and all(c.passed and c.shape == "" for c in regression)
