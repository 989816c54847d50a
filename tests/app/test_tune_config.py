"""A tune's :class:`~minreal.app.tune.TuneConfig` composes one :class:`~minreal.runtime_bench.BenchConfig` (the cells
timed and the release protocol) and one :class:`~minreal.export.settings.VariantConfig` (how every file is exported and
quantised) instead of repeating their fields, and ``report.json`` keeps the config's layout."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from minreal.app.cli import cli
from minreal.app.tune import SCREEN, Constraint, Protocol, Quality, TuneConfig, TuneError
from minreal.export.json_safe import to_jsonable
from minreal.export.settings import VariantConfig
from minreal.runtime_bench import BenchConfig, BenchInputError

#: The keys of ``report.json``'s config as a tune wrote them before the config composed its BenchConfig: the fields
#: of TuneConfig then, in their order (providers, batch_sizes and the release protocol, confirm, among them).
KEYS_BEFORE = ("constraint", "providers", "batch_sizes", "objective", "methods", "grid", "recover_epochs",
               "max_size_kb", "int8", "qat", "accuracy_control", "quant_target", "time_budget_s", "screen", "confirm",
               "workers", "plan", "extra", "dynamic_axes", "stats_samples", "ort", "halving_eta", "halving_rungs",
               "halving_per_method")
PROTOCOL_FIELDS = ("min_seconds", "repeats", "min_runs", "warmup")
DROP = Constraint(max_accuracy_drop=1.0)


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_no_field_is_declared_both_in_the_tune_config_and_in_the_bench_config() -> None:
    assert not _names(TuneConfig) & _names(BenchConfig)
    assert "bench" in _names(TuneConfig)
    assert {f.name for f in dataclasses.fields(Protocol)} == set(PROTOCOL_FIELDS) <= _names(BenchConfig)


def test_the_tune_config_holds_the_very_bench_config_it_was_given() -> None:
    bench = BenchConfig(providers=("cpu", "cuda"), batch_sizes=(4, 1), warmup=2, min_runs=7, min_seconds=0.5,
                        repeats=5)
    assert TuneConfig(DROP, bench=bench).bench is bench
    assert TuneConfig(DROP, bench).bench is bench  # second positional, where providers was
    assert TuneConfig(DROP).bench == BenchConfig()  # minreal bench's defaults, as before: cpu at batch 1


def test_confirmation_uses_the_bench_config_and_screening_its_cells_with_the_short_protocol() -> None:
    bench = BenchConfig(providers=("cpu", "cuda"), batch_sizes=(4, 1), warmup=2, min_runs=7, min_seconds=0.5,
                        repeats=5, intra_op_threads=3)
    cfg = TuneConfig(DROP, bench)
    assert cfg.confirm == Protocol(min_seconds=0.5, repeats=5, min_runs=7, warmup=2)
    assert cfg.bench_config(cfg.confirm) == bench
    screened = cfg.bench_config(cfg.screen)
    assert [getattr(screened, k) for k in PROTOCOL_FIELDS] == [0.25, 1, 20, 5] == [getattr(SCREEN, k)
                                                                                  for k in PROTOCOL_FIELDS]
    assert dataclasses.replace(screened, min_seconds=0.5, repeats=5, min_runs=7, warmup=2) == bench


def test_with_bench_changes_only_the_timing_and_is_checked_by_the_bench_config() -> None:
    cfg = TuneConfig(DROP, int8=False, workers=2)
    changed = cfg.with_bench(repeats=7, batch_sizes=(2,))
    assert (changed.bench.repeats, changed.bench.batch_sizes, changed.int8, changed.workers) == (7, (2,), False, 2)
    assert cfg.bench.repeats == BenchConfig().repeats == 3  # the original is untouched (frozen)
    with pytest.raises(BenchInputError, match=r"repeats \(--repeats\) must be >= 1"):
        cfg.with_bench(repeats=0)


def test_report_json_keeps_the_config_keys_a_tune_wrote_before() -> None:
    bench = BenchConfig(providers=("cpu",), batch_sizes=(1, 8), min_seconds=0.25, repeats=2, min_runs=9, warmup=4)
    data = to_jsonable(TuneConfig(DROP, bench, methods=("svd",)))
    # the same keys, in the same order, and after them the one the structure screen added (its switch)
    assert tuple(data) == (*KEYS_BEFORE, "structure_screen") and len(KEYS_BEFORE) == 24
    assert data["structure_screen"] is True
    assert (data["providers"], data["batch_sizes"]) == (["cpu"], [1, 8])
    assert data["confirm"] == {"min_seconds": 0.25, "repeats": 2, "min_runs": 9, "warmup": 4}
    assert data["screen"] == {"min_seconds": 0.25, "repeats": 1, "min_runs": 20, "warmup": 5}
    assert data["constraint"] == {"max_accuracy_drop": 1.0, "min_agreement": None, "max_mse_increase": None}
    assert data["methods"] == ["svd"] and data["grid"] == [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]


def test_the_command_line_fills_the_bench_config(workdir: Path, run_cli: Callable,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """--providers, --batch, --min-seconds and --repeats reach the one BenchConfig; --screen-seconds the screen."""
    import minreal.app.commands.tune as tune_command

    seen = []
    monkeypatch.setattr(tune_command, "_tune_dry_run", lambda *args: seen.append(args[-1]))  # the config, unused
    code, _, err = run_cli(["tune", "net.py:make", "--data", "digits-flat", "--min-agreement", "0.9", "--providers",
                            "cpu", "--batch", "1,4", "--min-seconds", "0.5", "--repeats", "2", "--screen-seconds",
                            "0.1", "--dry-run", "-q"])
    assert code == 0, err
    assert [cfg.bench for cfg in seen] == [BenchConfig(providers=("cpu",), batch_sizes=(1, 4), min_seconds=0.5,
                                                       repeats=2)]
    assert seen[0].screen == Protocol(min_seconds=0.1, repeats=1, min_runs=20, warmup=5)


def test_tune_s_option_defaults_are_the_config_s() -> None:
    """The command line shows and passes the defaults TuneConfig declares, rather than copies of them."""
    command = cli.commands["tune"]
    with click.Context(command, info_name="tune") as ctx:
        defaults = {p.name: p.default for p in command.get_params(ctx) if isinstance(p, click.Option)}
    declared = {f.name: f.default for f in dataclasses.fields(TuneConfig)}
    names = ("objective", "stats_samples", "recover_epochs", "workers")
    assert [defaults[n] for n in names] == [declared[n] for n in names] == ["latency", 1024, 0, 1]
    assert defaults["batch"] == "1" and TuneConfig.bench.batch_sizes == BenchConfig().batch_sizes == (1,)


def test_no_field_is_declared_both_in_the_tune_config_and_in_the_variant_config() -> None:
    """The INT8 target (and every other export setting) lives in the composed VariantConfig only."""
    assert not _names(TuneConfig) & _names(VariantConfig)
    assert not _names(VariantConfig) & _names(BenchConfig)
    assert "variant" in _names(TuneConfig) and "quant_target" in _names(VariantConfig)


def test_the_tune_config_holds_the_very_variant_config_it_was_given() -> None:
    variant = VariantConfig(opset=17, quant_target="arm64", calib_samples=64)
    cfg = TuneConfig(DROP, variant=variant)
    assert cfg.variant is variant and cfg.quant_target == "arm64"
    assert TuneConfig(DROP).variant == VariantConfig() and TuneConfig(DROP).quant_target == "cpu"


def test_with_variant_changes_only_the_export_settings_and_is_checked_by_the_variant_config() -> None:
    cfg = TuneConfig(DROP, int8=False, workers=2)
    changed = cfg.with_variant(quant_target="cpu-avx2", opset=17)
    assert (changed.variant.quant_target, changed.variant.opset, changed.int8, changed.workers) == \
        ("cpu-avx2", 17, False, 2)
    assert changed.bench is cfg.bench and cfg.variant == VariantConfig()  # the original is untouched (frozen)
    with pytest.raises(ValueError, match="--quant-mode dynamic cannot write the tensorrt INT8 format"):
        cfg.with_variant(quant_target="tensorrt", quant_mode="dynamic")
    with pytest.raises(TuneError, match=r"static INT8 files .* must be 'static', got 'dynamic'"):
        TuneConfig(DROP).with_variant(quant_mode="dynamic")  # int8 on
    assert TuneConfig(DROP, variant=VariantConfig(quant_mode="dynamic"), int8=False).variant.quant_mode == "dynamic"


def test_report_json_records_the_variant_s_target_in_its_old_place() -> None:
    data = to_jsonable(TuneConfig(DROP, variant=VariantConfig(quant_target="arm64", opset=17)))
    assert tuple(data) == (*KEYS_BEFORE, "structure_screen")
    assert data["quant_target"] == "arm64" and "variant" not in data and "opset" not in data


def test_a_candidate_job_exports_with_the_tune_s_variant() -> None:
    """The candidates' files follow the same variant as the baselines' (not VariantConfig's defaults with the
    target), and a default variant keeps the cache key it had before the config composed one."""
    from minreal.app.tune.candidate import CandidateSpec, Job, cache_key, export_settings

    assert export_settings(VariantConfig(quant_target="arm64")) == ()
    variant = VariantConfig(quant_target="arm64", opset=17, atol=1e-3)
    assert export_settings(variant) == (("opset", 17), ("atol", 1e-3))
    job = Job(CandidateSpec("svd", 0.5), None, "inputs", Path("."), DROP, Quality(0.9), ("cpu",), "arm64", True)
    assert job.variant() == VariantConfig(quant_target="arm64")
    with_export = dataclasses.replace(job, export=export_settings(variant))
    assert with_export.variant() == variant
    assert cache_key(with_export) != cache_key(job)
    assert cache_key(job) == cache_key(dataclasses.replace(job, export=export_settings(VariantConfig(
        quant_target="tensorrt")))) != cache_key(dataclasses.replace(job, quant_target="tensorrt"))


def test_the_command_line_fills_the_variant_config(workdir: Path, run_cli: Callable,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import minreal.app.commands.tune as tune_command

    seen = []
    monkeypatch.setattr(tune_command, "_tune_dry_run", lambda *args: seen.append(args[-1]))  # the config, unused
    code, _, err = run_cli(["tune", "net.py:make", "--data", "digits-flat", "--min-agreement", "0.9",
                            "--quant-target", "cpu-avx2", "--dry-run", "-q"])
    assert code == 0, err
    assert [cfg.variant for cfg in seen] == [VariantConfig(quant_target="cpu-avx2")]


def test_without_int8_the_int8_only_settings_shape_no_file_and_no_cache_key() -> None:
    from minreal.app.tune.candidate import export_settings

    variant = VariantConfig(opset=17, calib_samples=64, drop_roundtrips=False, allow_random_calibration=True)
    assert export_settings(variant, int8=False) == (("opset", 17),)
    assert dict(export_settings(variant)) == {"opset": 17, "calib_samples": 64, "drop_roundtrips": False,
                                              "allow_random_calibration": True}
    assert export_settings(VariantConfig(quant_mode="dynamic"), int8=False) == ()
