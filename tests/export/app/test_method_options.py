"""Method options derived from the config dataclasses: every option documented, choices checked by click."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from click.testing import CliRunner

from compress import get_method, method_names
from compress.allocate import ALLOCATORS
from export.app.cli import cli
from export.app.method_options import config_option_specs, field_docs, method_option_specs


def _wide_help() -> list[str]:
    """``minreal compress --help`` without line wrapping: one line per option."""
    result = CliRunner().invoke(cli, ["compress", "--help"], terminal_width=10_000, max_content_width=10_000)
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
            line = _option_line(lines, spec.flag)
            text = line.strip()[len(spec.flag):].strip()
            assert spec.help and spec.help in line, line
            assert name in spec.methods and f"[method(s): {', '.join(spec.methods)}]" in line
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


def test_shared_fields_merge_help_and_choices() -> None:
    @dataclass
    class One:
        shared: int = field(default=1, metadata={"help": "Same text."})
        mode: str = field(default="a", metadata={"help": "Mode of one.", "choices": ("a", "b")})

    @dataclass
    class Two:
        shared: int = field(default=2, metadata={"help": "Same text."})
        mode: str = field(default="c", metadata={"help": "Mode of two.", "choices": ("b", "c")})

    specs = {s.field: s for s in config_option_specs({"one": One, "two": Two})}
    assert specs["shared"].help == "Same text." and specs["shared"].methods == ("one", "two")
    assert specs["mode"].help == "one: Mode of one. | two: Mode of two."
    assert specs["mode"].choices == ("a", "b", "c")


def test_config_defaults_and_field_order_unchanged() -> None:
    from compress.lowrank_plan import BudgetOptions

    assert [(f.name, f.default) for f in dataclasses.fields(BudgetOptions)] == [
        ("flops", None), ("params", None), ("rank_fraction", None), ("allocator", "lagrangian"),
        ("rank_multiple", 1), ("exclude", ())]
    assert dataclasses.asdict(BudgetOptions(0.3)) == {"flops": 0.3, "params": None, "rank_fraction": None,
                                                      "allocator": "lagrangian", "rank_multiple": 1, "exclude": ()}
