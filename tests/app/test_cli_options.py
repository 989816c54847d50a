"""CLI options with one meaning each: one spelling, options routed to the methods that declare them, whole-model
budgets, plan files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from minreal.app.method_options import MethodOptionError, build_config, build_configs
from minreal.app.plan import PlanError, load_plan
from minreal.compress import compress
from minreal.compress.core.errors import CompressionError
from minreal.compress.methods.factorize import FactorizeConfig
from minreal.compress.methods.magnitude import MagnitudeConfig


@pytest.mark.parametrize("old", ["--flops", "--params", "--eps", "--finetune-epochs", "--calibration-samples",
                                 "--calib", "--calib-holdout", "--target-provider"])
def test_the_old_spellings_are_gone(workdir: Path, run_cli: Callable, old: str) -> None:
    """No release shipped them: no hidden alias, no warning, a usage error naming the option."""
    code, _, err = run_cli(["compress", "net.py:make", "-m", "svd", old, "0.5", "--data", "digits-flat",
                            "--out", "a.pt2"])
    assert code == 2 and f"No such option '{old}'" in err and not Path("a.pt2").exists()


def test_an_option_reaches_only_the_methods_that_declare_it() -> None:
    svd, fde, fde_again = build_configs(["svd", "fde", "fde"], {"merge_eps": 0.1, "mac_ratio": None, "exclude": ()})
    assert fde.merge_eps == 0.1 and fde_again == fde
    assert svd == build_config("svd", {})  # svd has no merge_eps: untouched, not refused
    shared = build_configs(["svd", "factorize"], {"layer_mac_ratio": 0.4})
    assert [c.layer_mac_ratio for c in shared] == [0.4, 0.4]


def test_an_option_no_chosen_method_declares_is_an_error_naming_its_owners() -> None:
    with pytest.raises(MethodOptionError) as err:
        build_configs(["svd", "factorize"], {"merge_eps": 0.1})
    msg = str(err.value)
    assert "--merge-eps applies to none of the chosen methods (svd, factorize)" in msg and "fde" in msg
    assert "\n" not in msg


def test_run_with_two_methods_gives_each_its_own_options(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "-m", "fde", "--merge-eps",
                            "0.1", "--data", "digits-flat", "--out", "runs/two", "--batch", "1", "--no-int8", "-q",
                            "--min-seconds", "0.05", "--repeats", "1"])
    assert code == 0, err
    variants = json.loads(Path("runs/two/report.json").read_text())["cases"][0]["variants"]
    config = {v["label"]: v["compression"]["config"] for v in variants if v.get("compression")}
    assert config["fde"]["merge_eps"] == 0.1 and "merge_eps" not in config["svd"]
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "--merge-eps", "0.1",
                            "--data", "digits-flat", "--out", "runs/bad", "--no-int8", "-q"])
    assert code == 2 and "--merge-eps applies to none of the chosen methods (svd)" in err
    assert not Path("runs/bad").exists()


def test_whole_model_mac_budget_is_met_and_reported(tiny_cnn, image_data) -> None:
    _, report = compress(tiny_cnn, image_data, "factorize", FactorizeConfig(mac_ratio=0.7))
    assert report.mac_ratio <= 0.7 + 1e-9
    assert report.predicted["budget"] == {"kind": "mac_ratio", "requested": 0.7, "achieved": report.mac_ratio}


def test_unreachable_budget_names_the_smallest_ratio(tiny_mlp, mlp_data) -> None:
    with pytest.raises(CompressionError, match=r"--mac-ratio 0.001 cannot be reached: the smallest whole-model "
                                               r"ratio this method can reach is 0\.\d+"):
        compress(tiny_mlp, mlp_data, "factorize", FactorizeConfig(mac_ratio=0.001))
    with pytest.raises(CompressionError, match=r"--param-ratio 0.001 cannot be reached: .* is 0\.\d+"):
        compress(tiny_mlp, mlp_data, "magnitude", MagnitudeConfig(param_ratio=0.001))


def test_method_without_a_budget_kind_says_so(tiny_mlp, mlp_data) -> None:
    from minreal.compress.methods.fde import FDEConfig

    with pytest.raises(CompressionError, match=r"method 'fde' does not support --latency-ratio"):
        compress(tiny_mlp, mlp_data, "fde", FDEConfig(latency_ratio=0.5, latency_table="table.json"))


PLAN = """
[[variant]]
method = "svd"
layer_mac_ratio = 0.5

[[variant]]
method = ["fde", "factorize"]
fde = { merge_eps = 0.05 }
factorize = { mac_ratio = 0.6 }
"""


def test_plan_with_a_chain_runs_both_variants(workdir: Path, run_cli: Callable) -> None:
    Path("plan.toml").write_text(PLAN)
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "--plan", "plan.toml", "--data",
                            "digits-flat", "--out", "runs/p", "--batch", "1", "--no-int8", "-q", "--min-seconds",
                            "0.05", "--repeats", "1"])
    assert code == 0, err
    variants = json.loads(Path("runs/p/report.json").read_text())["cases"][0]["variants"]
    assert [v["label"] for v in variants] == ["original", "svd", "fde+factorize"]
    chain = variants[2]["compression"]
    assert chain["method"] == "fde+factorize" and [s["method"] for s in chain["predicted"]["steps"]] == ["fde",
                                                                                                       "factorize"]
    assert chain["macs_after"] <= 0.6 * chain["macs_before"] + 1


@pytest.mark.parametrize("text, culprit", [
    ("[[variant]]\nmethod = 'nope'\n", "variant 1: unknown method 'nope'"),
    ("[[variant]]\nmethod = 'svd'\nmerge_eps = 0.1\n", "variant 1 (svd): option --merge-eps does not apply"),
    ("[[variant]]\nmethod = ['fde', 'svd']\nmac_ratio = 0.5\n", "variant 1 (fde+svd): key 'mac_ratio'"),
    ("[[variant]]\nmethod = 'svd'\nlayer_mac_ratio = 2.0\n", "variant 1 (svd): invalid options"),
    ("variant = 3\n", "no variants"),
    ("[[variant]\n", "not valid TOML"),
])
def test_plan_errors_name_the_file_and_variant(tmp_path: Path, text: str, culprit: str) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    with pytest.raises(PlanError) as err:
        load_plan(path)
    msg = str(err.value)
    assert msg.startswith(str(path)) and culprit in msg and "\n" not in msg


@pytest.mark.parametrize("method, line, culprit", [
    ("svd", "mac_ratio = 'abc'", "mac_ratio (--mac-ratio) takes a number, got 'abc'"),
    ("svd", "mac_ratio = true", "mac_ratio (--mac-ratio) takes a number, got True"),
    ("fde", "scaling = 'no'", "scaling (--scaling) takes true or false, got 'no'"),
    ("magnitude", "width_min = 1.9", "width_min (--width-min) takes a whole number, got 1.9"),
    ("svd", "exclude = 13", "exclude (--exclude) takes a list of strings, got 13"),
    ("ssm", "mac_ratio = 0.5", "method 'ssm' does not support --mac-ratio"),  # a budget it cannot meet
    ("magnitude", "widths = [8, '4']", "widths (--widths) takes a list of whole numbers"),
])
def test_plan_values_of_the_wrong_type_name_file_variant_and_key(tmp_path: Path, method: str, line: str,
                                                                 culprit: str) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(f"[[variant]]\nmethod = '{method}'\n{line}\n")
    with pytest.raises(PlanError) as err:
        load_plan(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: variant 1 ({method}): ") and culprit in msg and "\n" not in msg


def test_plan_values_of_the_right_type_are_kept_exactly(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text("[[variant]]\nmethod = 'svd'\nexclude = '13'\nmac_ratio = 1\n"
                    "[[variant]]\nmethod = 'ssm'\nexclude = ['a', 'b']\n[[variant]]\nmethod = 'fde'\nscaling = false\n")
    svd, ssm, fde = load_plan(path)
    assert svd.config.exclude == ("13",) and svd.config.mac_ratio == 1.0
    assert ssm.config.exclude == ("a", "b") and fde.config.scaling is False


def test_bad_plan_value_exits_2_naming_the_key(workdir: Path, run_cli: Callable) -> None:
    Path("plan.toml").write_text("[[variant]]\nmethod = 'svd'\nmac_ratio = 'abc'\n")
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "--plan", "plan.toml", "--data",
                            "digits-flat", "--out", "runs/p", "--no-int8", "-q"])
    assert code == 2 and "plan.toml: variant 1 (svd): mac_ratio (--mac-ratio)" in err and "Traceback" not in err


def test_no_flag_means_two_things() -> None:
    from minreal.app.method_options import method_option_specs

    fields = {s.field for s in method_option_specs()}
    assert "calib_samples" not in fields and {"gramian_samples", "error_samples"} <= fields
    assert "calibration_samples" not in fields and "norm_samples" in fields


#: Spellings no command has: what they named is --data, --data-holdout and --providers in every command.
RETIRED = {"--calib", "--calib-holdout", "--target-provider", "--provider"}
#: Parameter names (click's destinations) that mean the data or the providers, however the flag is spelt.
DATA_NAMES, PROVIDER_NAMES = {"data", "calib", "calibration", "dataset"}, {"providers", "provider", "target_provider"}


def _options(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.get_params(click.Context(command)) if isinstance(p, click.Option)}


def test_every_command_names_the_data_and_the_providers_alike() -> None:
    """One concept, one option name in every command: --data for the data, --providers (comma-separated, the same
    default) for the providers; --quant-target is one shared option where it follows the providers."""
    from minreal.app.cli import cli

    takes_data, takes_providers, defaults = set(), set(), set()
    for name, command in cli.commands.items():
        options = _options(command)
        flags = {flag for p in options.values() for flag in (*p.opts, *p.secondary_opts)}
        assert not flags & RETIRED, (name, flags & RETIRED)
        for param in options.values():
            if param.name in DATA_NAMES:
                assert param.opts == ["--data"], (name, param.opts)
                takes_data.add(name)
            if param.name in PROVIDER_NAMES:
                assert param.opts == ["--providers"], (name, param.opts)
                takes_providers.add(name)
                defaults.add(param.default)
    assert takes_data == {"compress", "export", "bench", "run", "tune", "latency-table"}
    assert takes_providers == {"compress", "bench", "run", "tune", "latency-table"} and defaults == {"cpu"}
    assert _options(cli.commands["compress"])["holdout"].opts == ["--data-holdout"]
    run_target, tune_target = (_options(cli.commands[c])["quant_target"] for c in ("run", "tune"))
    assert (run_target.default, run_target.help) == (tune_target.default, tune_target.help) == (None, run_target.help)


@pytest.mark.parametrize(("providers", "given", "target"), [
    ("cpu", None, "cpu"), ("cuda", None, "cpu"), ("cpu,tensorrt", None, "tensorrt"),
    ("tensorrt", "cpu-vnni", "cpu-vnni"),
])
def test_tune_takes_its_int8_format_from_the_providers_as_run_does(workdir: Path, run_cli: Callable,
                                                                   monkeypatch: pytest.MonkeyPatch, providers: str,
                                                                   given: str | None, target: str) -> None:
    """tensorrt's format when tensorrt is among --providers, else cpu's; a given --quant-target wins."""
    import minreal.app.commands.tune as tune_command

    seen = []
    monkeypatch.setattr(tune_command, "require_providers", lambda names, skip: None)  # tensorrt need not be here
    monkeypatch.setattr(tune_command, "_tune_dry_run", lambda *args: seen.append(args[-1]))  # the config, unused
    code, _, err = run_cli(["tune", "net.py:make", "--data", "digits-flat", "--min-agreement", "0.9", "--providers",
                            providers, "--dry-run", "-q", *(["--quant-target", given] if given else [])])
    assert code == 0, err
    assert [cfg.quant_target for cfg in seen] == [target]


def test_latency_table_takes_exactly_one_provider(workdir: Path, run_cli: Callable) -> None:
    for providers, culprit in (("cpu,cuda", "one provider, got cpu, cuda"), ("warp", "'warp'"), (",", "','")):
        code, _, err = run_cli(["latency-table", "net.py:make", "--input-shape", "64", "--out", "t.json",
                                "--providers", providers])
        assert code == 2 and "Invalid value for --providers" in err and culprit in err, err
        assert "Traceback" not in err and not Path("t.json").exists()


def test_compress_takes_one_method_and_run_each_method_once(workdir: Path, run_cli) -> None:
    """Click keeps the last of a repeated option: compress refuses two methods instead of running one silently;
    run refuses a method given twice before any work (per-variant settings go in a plan file)."""
    code, _, err = run_cli(["compress", "net.py:make", "-m", "svd", "-m", "fde", "--data", "digits-flat",
                            "--out", "a.pt2"])
    assert code == 2 and "compress takes one --method, got svd, fde" in err and not Path("a.pt2").exists()
    code, _, err = run_cli(["run", "net.py:make", "-m", "svd", "-m", "svd", "--data", "digits-flat",
                            "--out", "runs/twice"])
    assert code == 2 and "-m svd given twice" in err and not Path("runs/twice").exists()
    code, _, err = run_cli(["tune", "net.py:make", "-m", "svd", "-m", "svd", "--data", "digits-flat",
                            "--max-accuracy-drop", "1", "--out", "runs/tune-twice"])
    assert code == 2 and "-m svd given twice" in err and not Path("runs/tune-twice").exists()
    code, _, err = run_cli(["tune", "net.py:make", "-m", "cbalanced", "--data", "digits-flat",
                            "--max-accuracy-drop", "1"])
    assert code == 2 and ("tune cannot search 'cbalanced': it would do all its work again for every budget probed "
                          "(no budget-free prepare phase); a plan file's variant (--plan) runs it as given, or choose "
                          "from 'depth', ") in err  # review: it said only "'cbalanced' is not one of ..."
    code, _, err = run_cli(["tune", "net.py:make", "-m", "nope", "--data", "digits-flat", "--max-accuracy-drop", "1"])
    assert code == 2 and "'nope' is not one of 'depth', " in err
    code, _, err = run_cli(["tune", "net.py:make", "--methods", "svd", "--data", "digits-flat"])
    assert code == 2 and "No such option '--methods'" in err  # one spelling in every command: -m/--method
    # click's own usage errors are one line too, naming the command and where its help is
    assert err.strip() == ("minreal tune: error: No such option '--methods'. (Did you mean one of: '--method', "
                           "'--min-seconds'?) (see `minreal tune --help`)")


@pytest.mark.parametrize("argv", [
    ["run", "net.py:make", "-m", "svd", "--data", "digits-flat", "--repeats", "0"],
    ["run", "net.py:make", "-m", "svd", "--data", "digits-flat", "--min-seconds", "-1"],
    ["tune", "net.py:make", "--data", "digits-flat", "--max-accuracy-drop", "1", "--repeats", "0"],
    ["tune", "net.py:make", "--data", "digits-flat", "--max-accuracy-drop", "1", "--min-seconds", "-1"],
])
def test_run_and_tune_range_check_their_timing_options(argv: list[str], workdir: Path, run_cli) -> None:
    """A timing protocol that cannot measure is a usage error in one line naming the option, before any work (bench
    checks its own through BenchConfig: tests/hostile/test_messages.py)."""
    code, _, err = run_cli(argv)
    flag = argv[-2]
    assert code == 2 and f"Invalid value for '{flag}'" in err and len(err.strip().splitlines()) == 1, err


def test_minreal_alone_prints_its_help_not_an_error(run_cli) -> None:
    code, out, err = run_cli([])
    assert "Usage: minreal" in out + err and "error:" not in out + err and "Commands:" in out + err
