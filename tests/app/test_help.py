"""The front door: each option declared once in the source, every option with help, every command's ``--help`` on
one screen (at most 70 lines at click's default width) and ``--help-all`` listing every option."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import minreal.app
from minreal.app.cli import cli
from minreal.app.cli_help import first_sentence

APP = Path(minreal.app.__file__).parent
SCREEN = 70


def _declared_flags(tree: ast.AST) -> list[tuple[str, int]]:
    """(flag, line) of every literal flag given to ``click.option(...)``, an option class (``click.Option([...])``,
    ``GroupedOption``) or a helper that passes its first arguments on to one (``_option("--data", ...)``)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if not (name == "option" or name.endswith(("Option", "_option"))):
            continue
        args = node.args[0].elts if node.args and isinstance(node.args[0], ast.List) else node.args
        for arg in args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                out += [(flag.strip(), node.lineno) for flag in arg.value.split("/") if flag.strip()]
    return out


def test_no_option_name_is_declared_in_two_places() -> None:
    """A flag shared by commands has one declaration (one type, one help) in minreal.app.cli_options or
    minreal.app.options, which every command that takes it uses."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(APP.rglob("*.py")):
        for flag, line in _declared_flags(ast.parse(path.read_text())):
            where[flag].append(f"{path.relative_to(APP)}:{line}")
    twice = {flag: places for flag, places in where.items() if len(places) > 1}
    assert not twice, twice
    assert "--data" in where and "--out" in where and "--weights" in where  # the scan sees the shared ones


def test_the_scan_finds_a_second_declaration() -> None:
    source = ('click.option("--data", help="a")\n@_tune_option("--data/--no-data")\ndef f(): ...\n'
              'GroupedOption(["--all"])\nsplit("--grid")\n')
    assert sorted(flag for flag, _ in _declared_flags(ast.parse(source))) == ["--all", "--data", "--data", "--no-data"]


def _commands() -> list[str]:
    return sorted(cli.commands)


def _options(name: str) -> list[click.Option]:
    command = cli.commands[name]
    with click.Context(command, info_name=name) as ctx:
        return [p for p in command.get_params(ctx) if isinstance(p, click.Option)]


@pytest.mark.parametrize("name", _commands())
def test_every_option_has_help(name: str) -> None:
    missing = [o.opts[0] for o in _options(name) if not o.hidden and not (o.help or "").strip()]
    assert not missing, f"{name}: {missing}"


@pytest.mark.parametrize("name", _commands())
def test_help_fits_a_screen_and_help_all_lists_every_option(name: str) -> None:
    short = CliRunner().invoke(cli, [name, "--help"])
    full = CliRunner().invoke(cli, [name, "--help-all"], terminal_width=10_000, max_content_width=10_000)
    assert short.exit_code == 0 and full.exit_code == 0, short.output + full.output
    assert len(short.output.splitlines()) <= SCREEN, short.output
    assert short.output.rstrip().splitlines()[-1] == "Every option with its help: --help-all."
    assert "``" not in short.output + full.output  # reST markup of a docstring, shown raw
    listed = {word.rstrip(",") for line in full.output.splitlines() for word in line.split()}
    for option in _options(name):
        if not option.hidden:
            assert set(option.opts) <= listed, f"{name} --help-all lacks {option.opts}"
            assert " ".join((option.help or "").split()) in " ".join(full.output.split()), option.opts


def test_short_help_names_every_option_too() -> None:
    """``--help`` shows each option of the command: a row (the first sentence of its help) or its flag."""
    for name in _commands():
        short = CliRunner().invoke(cli, [name, "--help"], terminal_width=10_000, max_content_width=10_000).output
        listed = {word.rstrip(",") for line in short.splitlines() for word in line.split()}
        for option in _options(name):
            if option.hidden or getattr(option, "method_option", False) or {"--help", "--help-all"} & set(option.opts):
                continue
            assert max(option.opts, key=len) in listed, f"{name} --help lacks {option.opts}"


def test_first_sentence_stops_outside_parentheses() -> None:
    text = "Largest drop (tune: a; check: b), in pp. More."
    assert first_sentence(text) == "Largest drop (tune: a; check: b), in pp."
    assert first_sentence("Comma-separated: cpu; more") == "Comma-separated: cpu."
    assert first_sentence("No stop") == "No stop"


def test_one_meaning_per_option_name(run_cli: Callable) -> None:
    """tune's recovery cap is not run's recovery count: each has its own name, and the other spelling is pointed
    to."""
    tune, run = ({o.opts[0] for o in _options(n)} for n in ("tune", "run"))
    assert "--recover-epochs-max" in tune and "--recover-epochs" not in tune and "--recover-epochs" in run
    code, _, err = run_cli(["tune", "m.py:f", "--data", "digits", "--max-accuracy-drop", "1", "--recover-epochs", "1"])
    assert code == 2 and "did you mean '--recover-epochs-max'? (--recover-epochs is an option of compress, run)" in err


def test_compress_method_is_single_valued_and_a_second_is_a_usage_error(tmp_path: Path) -> None:
    method = next(o for o in _options("compress") if o.name == "method")
    assert method.required and method.type.name == "choice"
    result = CliRunner().invoke(cli, ["compress", "m.py:f", "--data", "digits", "-m", "svd", "-m", "fde"])
    assert result.exit_code == 2 and "compress takes one --method, got svd, fde" in result.output


def test_an_option_of_another_command_is_named_as_such(run_cli: Callable) -> None:
    """compress has no --recover-int8 (it could not use the trained INT8 ranges): the error says which command has
    it instead of offering it only to refuse it."""
    assert "--recover-int8" not in {f for o in _options("compress") for f in o.opts}
    code, _, err = run_cli(["compress", "m.py:f", "--data", "digits", "-m", "svd", "--recover-int8"])
    assert code == 2 and "it is an option of run: use `minreal run ... --recover-int8`" in err, err
    code, _, err = run_cli(["export", "m.py:f", "--out", "m.onnx", "--eval-data", "digits"])
    assert code == 2 and "option of run, tune: use `minreal run ... --eval-data` or `minreal tune" in err
    code, _, err = run_cli(["export", "m.py:f", "--out", "m.onnx", "--opset-x", "17"])
    assert code == 2 and "No such option '--opset-x'" in err and "option of" not in err
