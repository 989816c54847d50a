"""A run's :class:`~minreal.app.settings.PipelineConfig` composes the stage settings it drives (one
:class:`~minreal.runtime_bench.BenchConfig`, one :class:`~minreal.export.settings.VariantConfig`) instead of
repeating their fields, and ``report.json`` keeps its schema-1 layout of them."""

from __future__ import annotations

import dataclasses

import pytest

from minreal.app.options import pipeline_config
from minreal.app.settings import RUN_BENCH, PipelineConfig
from minreal.export.json_safe import to_jsonable
from minreal.export.settings import VariantConfig
from minreal.runtime_bench import BenchConfig, BenchInputError


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_no_field_is_declared_both_in_the_run_config_and_in_a_stage_config() -> None:
    assert not _names(PipelineConfig) & _names(BenchConfig)
    assert not _names(PipelineConfig) & _names(VariantConfig)
    assert {"bench", "variant"} <= _names(PipelineConfig)


def test_the_run_config_holds_the_very_bench_config_it_was_given() -> None:
    bench = BenchConfig(providers=("cpu", "cuda"), batch_sizes=(4, 1, 16), warmup=2, min_runs=7, min_seconds=0.5,
                        repeats=5, axis_values={"seq": (8,)}, io_binding=True)
    cfg = PipelineConfig(bench=bench)
    assert cfg.bench is bench
    timed = cfg.bench_config({"seq": (4, 8)})  # a case's own axis lengths, everything else the given bench's
    assert timed.axis_values == {"seq": (4, 8)} and timed.io_binding is True
    assert dataclasses.replace(timed, axis_values=bench.axis_values) == bench
    assert cfg.bench_config().axis_values == {}


def test_what_the_providers_and_batch_sizes_decide_is_read_off_the_bench_config() -> None:
    cfg = PipelineConfig(bench=BenchConfig(providers=("cpu", "tensorrt"), batch_sizes=(4, 1, 16)))
    variant = cfg.variant_config()
    assert variant.tensorrt_validation is True and variant.tensorrt_batch == (1, 16, 16)
    assert cfg.wants_fp16() and not PipelineConfig().wants_fp16()
    assert PipelineConfig().variant_config().tensorrt_validation is False


def test_a_run_times_batch_1_and_32_by_default_with_the_benchmark_s_protocol() -> None:
    assert PipelineConfig().bench is RUN_BENCH and RUN_BENCH.batch_sizes == (1, 32)
    assert dataclasses.replace(RUN_BENCH, batch_sizes=BenchConfig().batch_sizes) == BenchConfig()


def test_with_bench_changes_only_the_timing_and_is_checked_by_the_bench_config() -> None:
    cfg = PipelineConfig(int8=False, fp16=True)
    changed = cfg.with_bench(repeats=7, batch_sizes=(2,))
    assert (changed.bench.repeats, changed.bench.batch_sizes, changed.int8, changed.fp16) == (7, (2,), False, True)
    assert cfg.bench.repeats == BenchConfig().repeats  # the original is untouched (frozen)
    with pytest.raises(BenchInputError, match=r"repeats \(--repeats\) must be >= 1"):
        cfg.with_bench(repeats=0)


def test_the_command_line_fills_the_bench_config() -> None:
    cfg = pipeline_config(PipelineConfig(allow_data_mismatch=True), "1,8", "cpu", True, "cpu", "dynamic", 0.5, None)
    assert cfg.bench.batch_sizes == (1, 8) and cfg.bench.providers == ("cpu",) and cfg.bench.min_seconds == 0.5
    assert cfg.bench.repeats == BenchConfig().repeats and cfg.allow_data_mismatch and not cfg.int8
    assert (cfg.variant.quant_target, cfg.variant.quant_mode) == ("cpu", "dynamic")
    assert pipeline_config(PipelineConfig(), "1", "cpu", False, "cpu", "static", None, 4).bench.repeats == 4


def test_report_json_keeps_the_timing_settings_at_the_top_of_its_config() -> None:
    bench = BenchConfig(batch_sizes=(1, 8), min_seconds=0.25, repeats=2, axis_values={"seq": (16,)})
    data = to_jsonable(PipelineConfig(bench=bench, fp16=True))
    assert "bench" not in data and data["fp16"] is True and data["variant"] == to_jsonable(VariantConfig())
    assert {k: data[k] for k in _names(BenchConfig)} == to_jsonable(bench)
    assert (data["providers"], data["batch_sizes"], data["axis_values"]) == (["cpu"], [1, 8], {"seq": [16]})
