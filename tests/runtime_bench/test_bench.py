"""End-to-end benchmark: fresh processes per cell, unavailable providers, ratios, bad inputs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from minreal.runtime_bench import BenchConfig, ModelEntry, run_benchmark
from minreal.runtime_bench.bench import _spawn
from minreal.runtime_bench.errors import (
    BenchInputError,
    ModelFileError,
    SessionError,
    UnknownProviderError,
    WorkerError,
)
from minreal.runtime_bench.providers import available_providers
from minreal.runtime_bench.worker import WorkerJob

FAST = dict(warmup=1, min_runs=3, min_seconds=0.0, repeats=1, intra_op_threads=1)


def test_each_cell_and_repeat_runs_in_a_fresh_process(bench_report, bench_config) -> None:
    report, _ = bench_report
    cells = {(r.provider, r.batch_size): r.worker_pids for r in report.latency}
    assert set(cells) == {("cpu", 1), ("cpu", 4)}
    pids = [pid for pids in cells.values() for pid in pids]
    assert len(pids) == len(set(pids)) == 2 * bench_config.repeats
    assert os.getpid() not in pids


def test_measured_runs_and_stats(bench_report, bench_config) -> None:
    report, _ = bench_report
    assert len(report.latency) == 2 * 2  # models x batch sizes on cpu
    for row in report.latency:
        assert row.stats.runs >= bench_config.repeats * bench_config.min_runs
        assert len(row.process_p50_ms) == bench_config.repeats
        assert 0 < row.stats.p50_ms <= row.stats.p90_ms <= row.stats.p99_ms
        assert row.stats.throughput_sps == pytest.approx(row.batch_size * 1e3 / row.stats.mean_ms)
        assert row.actual_providers[0] == "CPUExecutionProvider"


def test_ratios_pair_processes(bench_report, bench_config) -> None:
    report, _ = bench_report
    p50 = {(r.model, r.batch_size): np.array(r.process_p50_ms) for r in report.latency}
    assert {(r.model, r.reference) for r in report.ratios} == {("perturbed", "reference")}
    for ratio in report.ratios:
        per = p50[("perturbed", ratio.batch_size)] / p50[("reference", ratio.batch_size)]
        assert ratio.per_process == pytest.approx(tuple(per))
        assert ratio.median == pytest.approx(np.median(per))
        assert ratio.min <= ratio.median <= ratio.max


def test_unavailable_providers_reported_with_reason(bench_report) -> None:
    report, _ = bench_report
    expected = {p for p in ("cuda", "tensorrt") if p not in available_providers()}
    assert {u.provider for u in report.unavailable} == expected
    assert all(u.requested in u.reason and "not in this onnxruntime" in u.reason for u in report.unavailable)
    assert not any(r.provider in expected for r in report.latency)


def test_environment_and_metrics_recorded(bench_report) -> None:
    report, messages = bench_report
    env = report.environment
    assert env.intra_op_threads == 1 and env.thread_spinning is False
    assert "CPUExecutionProvider" in env.available_providers and env.onnxruntime
    assert [m.name for m in report.models] == ["reference", "perturbed"]
    assert report.metrics[0].accuracy == 1.0 and report.metrics[0].top1_agreement == 1.0
    assert report.metrics[1].max_abs_diff > 0
    assert "labelled" in report.metrics_data
    assert sum("timing cpu" in m for m in messages) == 6


def test_without_data_uses_random_inputs(reference_model: Path, perturbed_model: Path) -> None:
    models = [ModelEntry("a", reference_model), ModelEntry("b", perturbed_model)]
    report = run_benchmark(models, BenchConfig(**FAST))
    assert report.metrics[0].accuracy is None and report.metrics[0].top1_agreement == 1.0
    assert report.metrics[1].samples == 64 and "random" in report.metrics_data
    assert len(report.ratios) == 1


def test_an_ort_format_file_is_timed_beside_its_onnx_file(tmp_path: Path, reference_model: Path, data) -> None:
    """An ``.ort`` file (ONNX Runtime's ORT format, which the onnx package cannot read): its size and gzip bytes, its
    inputs from its session, its agreement with the ``.onnx`` file and its latency in fresh processes."""
    from minreal.runtime_bench.inputs import input_specs
    from minreal.runtime_bench.sessions import create_session

    ort_file = tmp_path / "reference.ort"
    create_session(reference_model, optimized_model_path=ort_file)  # ONNX Runtime saves ORT format by the suffix
    assert input_specs(ort_file) == input_specs(reference_model)
    x, y = data
    report = run_benchmark([ModelEntry("onnx", reference_model), ModelEntry("ort", ort_file)], BenchConfig(**FAST),
                           x, y)
    info = report.models[1]
    assert info.file_size_bytes == ort_file.stat().st_size and 0 < info.gzip_bytes and info.node_count is None
    assert report.metrics[1].top1_agreement == 1.0 and report.metrics[1].accuracy == 1.0
    assert {r.model for r in report.latency} == {"onnx", "ort"}


def test_missing_model_file_is_one_line_naming_it(tmp_path: Path, reference_model: Path) -> None:
    missing = tmp_path / "compressed.onnx"
    with pytest.raises(ModelFileError) as info:
        run_benchmark([ModelEntry("a", reference_model), ModelEntry("b", missing)], BenchConfig(**FAST))
    assert str(info.value) == f"model file not found: {missing}"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(warmup=-1), r"warmup \(--warmup\) must be >= 0"),
        (dict(repeats=0), r"repeats \(--repeats\) must be >= 1"),
        (dict(batch_sizes=(0,)), r"batch_sizes \(--batch\) must be >= 1"),
        (dict(min_seconds=-1.0), r"min_seconds \(--min-seconds\) must be >= 0"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(BenchInputError, match=match):
        BenchConfig(**kwargs)


def test_config_rejects_unknown_provider() -> None:
    with pytest.raises(UnknownProviderError, match="'gpu'"):
        BenchConfig(providers=("cpu", "gpu"))


def test_inputs_checked_before_any_worker(
    tmp_path: Path, reference_model: Path, weights, make_linear, data
) -> None:
    x, y = data
    ref = ModelEntry("a", reference_model)
    with pytest.raises(BenchInputError, match="duplicate model names: a"):
        run_benchmark([ref, ref], BenchConfig(**FAST))
    with pytest.raises(BenchInputError, match="y needs x"):
        run_benchmark([ref], BenchConfig(**FAST), x, y[:10])
    symbolic = ModelEntry("sym", make_linear(tmp_path / "sym.onnx", *weights, rest="F"))
    with pytest.raises(BenchInputError, match="'sym'.*pass data x"):
        run_benchmark([symbolic], BenchConfig(**FAST))
    fixed = ModelEntry("fixed", make_linear(tmp_path / "fixed.onnx", *weights, batch=1))
    with pytest.raises(BenchInputError, match="'fixed'.*cannot run batch 8"):
        run_benchmark([fixed], BenchConfig(batch_sizes=(1, 8), **FAST))


def test_model_rejected_by_onnxruntime_names_file(tmp_path: Path, reference_model: Path) -> None:
    broken = onnx.load(str(reference_model))
    broken.graph.node[1].op_type = "NoSuchOp"
    path = tmp_path / "broken.onnx"
    onnx.save(broken, str(path))
    with pytest.raises(SessionError, match=f"cannot create a session for {path} on CPUExecutionProvider") as info:
        run_benchmark([ModelEntry("broken", path)], BenchConfig(**FAST))
    assert "\n" not in str(info.value)


def test_failing_worker_raises_worker_error(tmp_path: Path) -> None:
    job = WorkerJob(names=["gone"], paths=[str(tmp_path / "gone.onnx")], provider="CPUExecutionProvider",
                    batch_size=2, threads=1, warmup=0, min_runs=1, min_seconds=0.0, seed=0)
    expected = "worker for CPUExecutionProvider batch 2 failed with exit code 1: .*gone.onnx"
    with pytest.raises(WorkerError, match=expected):
        _spawn(job, tmp_path / "job", timeout_s=60)


def test_a_worker_past_its_limit_says_what_it_was_measuring_and_the_way_out(tmp_path: Path) -> None:
    job = WorkerJob(names=["a", "b"], paths=[str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx")],
                    provider="CPUExecutionProvider", batch_size=1, threads=1, warmup=3, min_runs=10, min_seconds=0.0,
                    seed=0)
    expected = (r"^worker for CPUExecutionProvider batch 1 exceeded 0\.001 s, the time limit of one measuring process "
                r"\(2 file\(s\), each 3 warm-up and at least 10 measured runs\); measure fewer runs or fewer files "
                r"at once, or raise the limit \(`BenchConfig\.worker_timeout_s`, --worker-timeout\)$")
    with pytest.raises(WorkerError, match=expected):  # a fresh Python process never starts within a millisecond
        _spawn(job, tmp_path / "job", timeout_s=0.001)


def test_incompatible_outputs_fail_before_timing(tmp_path: Path, reference_model: Path, make_linear) -> None:
    wide = make_linear(tmp_path / "wide.onnx", np.ones((8, 6)), np.zeros(6))
    messages: list[str] = []
    with pytest.raises(BenchInputError, match=r"model 'wide' output shape \(64, 6\) differs from 'a' \(64, 4\)"):
        run_benchmark([ModelEntry("a", reference_model), ModelEntry("wide", wide)], BenchConfig(**FAST),
                      progress=messages.append)
    assert not any(m.startswith("timing") for m in messages)
