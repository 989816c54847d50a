"""Method options derived from the config dataclasses: every option documented, choices checked by click."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from minreal.app.cli import cli
from minreal.app.method_options import config_option_specs, field_docs, method_option_specs
from minreal.compress import get_method, method_names
from minreal.compress.core.allocate import ALLOCATORS


def _wide_help() -> list[str]:
    """``minreal compress --help-all`` (every option, grouped by method) without line wrapping: one line per
    option."""
    result = CliRunner().invoke(cli, ["compress", "--help-all"], terminal_width=10_000, max_content_width=10_000)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def _option_line(lines: list[str], flag: str) -> str:
    """The option's help entry (its line, plus the next when click puts the help below a long option name)."""
    found = [i for i, ln in enumerate(lines) if ln.strip() == flag or ln.strip().startswith((flag + " ", flag + "/"))]
    assert len(found) == 1, f"{flag}: {found}"
    entry = [lines[found[0]]]
    for ln in lines[found[0] + 1:]:
        if not ln.strip() or ln.strip().startswith("-"):
            break
        entry.append(ln)
    return " ".join(" ".join(entry).split())


def _section_of(lines: list[str], flag: str) -> str:
    """The ``--help`` section title (an unindented line ending in ':') above the option's entry."""
    at = next(i for i, ln in enumerate(lines) if ln.strip() == flag or ln.strip().startswith((flag + " ", flag + "/")))
    return next(ln.strip() for ln in reversed(lines[:at]) if ln and not ln[0].isspace() and ln.endswith(":"))


def test_help_groups_options_by_method_shared_first() -> None:
    lines = _wide_help()
    titles = [ln for ln in lines if ln and not ln[0].isspace() and ln.endswith(":")]
    assert titles[0] == "Options:"
    for name in ("factorize", "fde", "cbalanced", "ssm"):
        assert f"Options for {name}:" in titles
    assert _section_of(lines, "--mac-ratio") == "Options for cbalanced, depth, factorize, fde, magnitude, svd, wanda:"
    assert _section_of(lines, "--latency-ratio") == "Options for depth, factorize, magnitude, svd, wanda:"
    assert _section_of(lines, "--latency-table") == "Options for depth, factorize, magnitude, svd, wanda:"
    assert _section_of(lines, "--energy-eps") == "Options for cbalanced:"
    assert _section_of(lines, "--merge-eps") == "Options for fde:"
    assert _section_of(lines, "--criterion") == "Options for depth:"
    assert _section_of(lines, "--data-holdout") == "Options:"


def test_budget_options_are_offered_only_by_methods_that_meet_them() -> None:
    specs = {s.field: s for s in method_option_specs()}
    for name in method_names():
        budgets = get_method(name).budgets
        for budget in ("mac_ratio", "param_ratio", "latency_ratio"):
            assert (name in specs[budget].methods) == (budget in budgets), (name, budget)
        assert (name in specs["latency_table"].methods) == ("latency_ratio" in budgets)
    result = CliRunner().invoke(cli, ["methods"])
    assert result.exit_code == 0, result.output
    rows = result.output.split("\n")
    ssm = rows[rows.index(next(r for r in rows if r.startswith("ssm "))) + 1]
    assert "--latency-ratio" not in ssm and "--latency-table" not in ssm
    magnitude = rows[rows.index(next(r for r in rows if r.startswith("magnitude "))) + 1]
    assert "--param-ratio" in magnitude and "--latency-ratio" in magnitude and "--width-multiple" in magnitude


def test_every_config_field_has_help() -> None:
    for name in method_names():
        cls = get_method(name).config_cls
        docs = field_docs(cls)
        assert set(docs) == {f.name for f in dataclasses.fields(cls)}
        assert all(help_ for help_, _ in docs.values())


def test_every_method_option_is_explained_in_compress_help() -> None:
    lines = _wide_help()
    specs = {s.field: s for s in method_option_specs()}
    for name in method_names():
        for f in dataclasses.fields(get_method(name).config_cls):
            spec = specs.get(f.name)
            if spec is None:  # not a scalar field: no CLI option
                continue
            if f.name in ("mac_ratio", "param_ratio", "latency_ratio", "latency_table") and name not in spec.methods:
                continue  # a budget the method cannot meet (see the test above)
            line = _option_line(lines, spec.flag)
            text = line.strip()[len(spec.flag):].strip()
            assert spec.help and spec.help in line, line
            assert name in spec.methods and _section_of(lines, spec.flag) == spec.group + ":"
            assert "Option of method(s)" not in text
            own = field_docs(get_method(name).config_cls)[f.name][0]
            assert own in line, f"{name}.{f.name}: its own help text is missing from {line!r}"


def test_choices_come_from_the_registries() -> None:
    specs = {s.field: s for s in method_option_specs()}
    assert specs["allocator"].choices == tuple(ALLOCATORS)
    assert specs["stats_dtype"].choices == ("float64", "float32")
    assert set(specs["init"].choices) == {"scratch", "warm"}
    assert set(specs["selection"].choices) == {"leverage", "magnitude"}
    line = _option_line(_wide_help(), "--allocator")
    assert all(a in line for a in ALLOCATORS)


def test_bad_choice_is_a_usage_error(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["compress", str(tmp_path / "net.py:make"), "--method", "svd",
                                      "--allocator", "nosuch"])
    assert result.exit_code == 2, result.output
    assert "--allocator" in result.output and "nosuch" in result.output
    assert all(a in result.output for a in ALLOCATORS)


def test_field_without_help_is_an_error() -> None:
    @dataclass
    class Undocumented:
        documented: int = field(default=1, metadata={"help": "A documented option."})
        bare: float = 0.5

    with pytest.raises(ValueError, match=r"Undocumented\.bare"):
        config_option_specs({"throwaway": Undocumented})
    with pytest.raises(ValueError, match=r"Undocumented\.bare"):
        field_docs(Undocumented)


def test_bad_choices_metadata_is_an_error() -> None:
    @dataclass
    class BadChoices:
        mode: str = field(default="a", metadata={"help": "Mode.", "choices": ()})

    with pytest.raises(ValueError, match=r"BadChoices\.mode"):
        field_docs(BadChoices)


def test_a_field_declared_apart_by_two_methods_is_an_error() -> None:
    @dataclass
    class One:
        shared: int = field(default=1, metadata={"help": "Same text."})

    @dataclass
    class Two:
        shared: float = field(default=2.0, metadata={"help": "Another meaning."})

    with pytest.raises(ValueError, match=r"'shared' \(--shared\) of method 'two' is declared apart by method 'one'"):
        config_option_specs({"one": One, "two": Two})


def test_a_field_shared_through_one_base_is_one_option() -> None:
    @dataclass
    class Base:
        shared: int = field(default=1, metadata={"help": "Same text."})

    @dataclass
    class One(Base):
        mode: str = field(default="a", metadata={"help": "Mode of one.", "choices": ("a", "b")})

    @dataclass
    class Two(Base):
        other: str = field(default="c", metadata={"help": "Mode of two.", "choices": ("b", "c")})

    specs = {s.field: s for s in config_option_specs({"one": One, "two": Two})}
    assert specs["shared"].help == "Same text." and specs["shared"].methods == ("one", "two")
    assert specs["mode"].choices == ("a", "b") and specs["other"].methods == ("two",)


def test_registered_methods_share_no_name_apart() -> None:
    specs = method_option_specs()  # raises on a clash
    flags = {s.flag for s in specs}
    assert {"--mac-ratio", "--param-ratio", "--latency-ratio", "--energy-eps", "--merge-eps",
            "--calib-batch-size"} <= flags
    assert not {"--eps", "--flops", "--params", "--batch-size"} & flags
    # training goes through the shared --recover-* knobs only (cbalanced has none of its own)
    assert not {"--epochs", "--lr", "--alpha", "--temperature", "--train-batch-size", "--distill"} & flags


def test_config_defaults_and_field_order() -> None:
    from minreal.compress.core.options import BudgetOptions

    assert [(f.name, f.default) for f in dataclasses.fields(BudgetOptions)] == [
        ("exclude", ()), ("mac_ratio", None), ("param_ratio", None), ("latency_ratio", None),
        ("latency_table", None), ("layer_mac_ratio", None), ("layer_param_ratio", None), ("rank_fraction", None),
        ("allocator", "lagrangian"), ("rank_multiple", 1)]




def test_width_methods_take_the_target_providers_width_defaults_and_the_users_values_win() -> None:
    """What `compress`, `run` and `tune` build for a width method: the CPU's multiple and minimum (16, 16), the GPUs'
    (8, 0), and the user's own values over either."""
    from minreal.app.method_options import build_config, provider_defaults

    for method in ("magnitude", "wanda", "cbalanced"):
        cpu = build_config(method, {}, provider_defaults(("cpu",)))
        assert (cpu.width_multiple, cpu.width_min) == (16, 16)
        gpu = build_config(method, {}, provider_defaults(("cuda",)))
        assert (gpu.width_multiple, gpu.width_min) == (8, 0)
        mine = build_config(method, {"width_multiple": 8, "width_min": 0}, provider_defaults(("cpu",)))
        assert (mine.width_multiple, mine.width_min) == (8, 0)


def test_flag_spelled_puts_flags_in_place_of_the_declared_fields_only() -> None:
    from minreal.app.field_flags import flag_spelled
    from minreal.compress import CompressionError

    exc = CompressionError("`DepthConfig.criterion` and `mac_ratio`; `RecoveryConfig.epochs`; `other`, mac_ratio, "
                           "`minreal latency-table --kind width`", fields=("criterion", "mac_ratio", "epochs"))
    assert flag_spelled(exc) == ("--criterion and --mac-ratio; --recover-epochs; `other`, mac_ratio, "
                                 "`minreal latency-table --kind width`")
    assert flag_spelled(exc, "first line `mac_ratio`") == "first line --mac-ratio"
    assert flag_spelled(ValueError("`mac_ratio` is no field here")) == "`mac_ratio` is no field here"


def test_every_recovery_field_an_error_names_is_spelled_as_a_flag_of_run() -> None:
    # a RecoveryConfig field in an error reaches the command line as a flag that `minreal run` declares
    import dataclasses

    from minreal.app.commands.run import run_cmd
    from minreal.app.field_flags import flag_spelled
    from minreal.compress import CompressionError
    from minreal.compress.core.recover_options import RecoveryConfig

    declared = {flag for p in run_cmd.params for flag in getattr(p, "opts", ())}
    internal = {"catch_interrupt"}  # set by the library's callers, never by a user
    for f in dataclasses.fields(RecoveryConfig):
        if f.name in internal:
            continue
        spelled = flag_spelled(CompressionError(f"`RecoveryConfig.{f.name}`", fields=(f.name,)))
        assert spelled in declared, (f.name, spelled)


def test_a_config_error_names_the_field_in_python_and_the_flag_on_the_command_line(workdir: Path,
                                                                                   run_cli: Callable) -> None:
    from minreal.compress import CompressionError
    from minreal.compress.methods.depth import DepthConfig

    with pytest.raises(CompressionError, match=r"^`DepthConfig\.score_samples` must be >= 8, got 4$"):
        DepthConfig(score_samples=4)
    code, _, err = run_cli(["compress", "net.py:make", "-m", "depth", "--score-samples", "4", "--data", "digits-flat",
                            "--out", "cut.pt2", "-q"])
    assert code == 2 and "invalid options for method 'depth': --score-samples must be >= 8, got 4" in err, err
    assert "score_samples" not in err and "`" not in err and "Traceback" not in err


def test_a_plan_files_config_error_names_the_flag(workdir: Path, run_cli: Callable) -> None:
    Path("plan.toml").write_text("[[variant]]\nmethod = 'svd'\nmac_ratio = 1.5\n")
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "--plan", "plan.toml", "--data",
                            "digits-flat", "--out", "runs/p", "--no-int8", "-q"])
    assert code == 2 and "--mac-ratio must lie in (0, 1], got 1.5" in err, err
    assert "mac_ratio" not in err and "Traceback" not in err


def test_a_layer_budget_error_names_the_flag(workdir: Path, run_cli: Callable) -> None:
    """The library names the field (tests/compress/core/test_errors.py); the command line shows its flag."""
    code, _, err = run_cli(["compress", "net.py:make", "-m", "svd", "--layer-mac-ratio", "1.5", "--data",
                            "digits-flat", "--out", "cut.pt2", "-q"])
    assert code == 2 and "invalid options for method 'svd': --layer-mac-ratio must lie in (0, 1], got 1.5" in err, err
    assert "layer_mac_ratio" not in err and "`" not in err and not Path("cut.pt2").exists()


def test_a_budget_the_method_lacks_is_named_before_the_configs_own_checks() -> None:
    """Review: `-m cbalanced --latency-ratio 0.5` asked for a latency table first (the config's check), and only
    with one said that cbalanced has no latency budget."""
    from minreal.app.method_options import MethodOptionError, build_config

    for method, budgets in (("cbalanced", "--mac-ratio, --param-ratio"), ("ssm", "none; use its own options")):
        with pytest.raises(MethodOptionError) as err:
            build_config(method, {"latency_ratio": 0.5})
        assert str(err.value).startswith(f"method {method!r} does not support --latency-ratio (its budgets: {budgets}")
    with pytest.raises(MethodOptionError, match="needs --latency-table"):
        build_config("svd", {"latency_ratio": 0.5})  # a method that has it: the config's own check
