"""Library errors name the Python API's fields; the command line shows its flags in their place
(:mod:`minreal.app.field_flags`), and its table spells every field a library error names as a flag some command has."""

from __future__ import annotations

import ast
import collections
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from minreal.app.cli import cli
from minreal.app.field_flags import fields_spelled, flag_for, flag_spelled
from minreal.runtime_bench import SCHEMA_VERSION, check_report
from minreal.runtime_bench.errors import BenchInputError, CheckError

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("compress", "export", "runtime_bench")
#: A flag in a message: two dashes and a letter, not inside a word (``cpu-vnni``) or a longer dash run.
FLAG = re.compile(r"(?<![\w-])--[a-z]")
#: Library messages that still name a flag in Python too, because a test of the library (not of the command line)
#: asserts the flag's text and keeps its assertion (issue 43): "module path (from the repository root):function
#: (its qualified name: Class.method for a method)" -> the test that pins it. Each names its Python field first, in
#: backticks, in one of the two forms the command line turns into the flag alone (:mod:`minreal.app.field_flags`:
#: `` `layer_mac_ratio` (--layer-mac-ratio) must ...``, or a lead `` `exclude`: --exclude layer9.0: ...`` where the
#: pinned text runs on past the flag), unless its explanation says "flag only" and why. Converting one fully means the
#: maintainers change that assertion first.
PINNED = {
    "compress/core/recover_options.py:RecoveryConfig.__post_init__":
        "tests/compress/core/test_recover.py: RecoveryConfig(epochs=-1) matches --recover-epochs (and steps, alpha, "
        "lr, temperature, val_fraction, patience)",
    "compress/core/recover.py:_matched_points": "tests/compress/core/test_recover.py: --recover-features 'nowhere'",
    "compress/core/recover.py:_resolved": "tests/compress/core/test_recover.py: --recover-alpha 1",
    "compress/core/options.py:Budget.__post_init__":
        "tests/compress/methods/svd/test_svd.py: SVDConfig(layer_mac_ratio=1.5) matches --layer-mac-ratio",
    "compress/core/options.py:StateBudgetOption.__post_init__":
        "tests/hostile/test_messages.py: CBalancedConfig(state_budget=0) matches --state-budget",
    "compress/methods/cbalanced/config.py:CBalancedConfig.__post_init__":
        "tests/hostile/test_messages.py: --energy-eps (cbalanced)",
    "compress/methods/ssm/config.py:SSMConfig.__post_init__": "tests/hostile/test_messages.py: --trunc (ssm)",
    "compress/methods/factorize/config.py:FactorizeConfig.__post_init__":
        "tests/export/test_latency_table.py: --latency-table (factorize)",
    "runtime_bench/bench.py:_spawn": "tests/app/test_cli.py: bench --worker-timeout 0.001 (the measuring process's "
                                     "limit, `BenchConfig.worker_timeout_s` first)",
    "runtime_bench/config.py:BenchConfig.__post_init__":
        "tests/runtime_bench/test_bench.py: warmup (--warmup) and the other BenchConfig fields; flag only: it names "
        "the field first already, without backticks, as that test ('warmup (--warmup) must be >= 0') and the command "
        "line's '(--warmup)' (tests/hostile/test_messages.py) read it",
    "compress/core/lowrank_plan.py:layer_target":
        "tests/app/test_cli_options.py: --mac-ratio 0.001 cannot be reached (a library call)",
    "compress/core/lowrank_plan.py:_check_layer_target":
        "tests/compress/core/test_lowrank_plan.py: --layer-mac-ratio 0.01 cannot be reached; flag only: that test "
        "anchors the message at the flag ('^--layer-mac-ratio 0.01 cannot be reached')",
    "compress/core/lowrank_plan.py:_multiple_hint": "tests/compress/core/test_lowrank_plan.py: --rank-multiple 16",
    "compress/core/width/allocate.py:allocate_widths":
        "tests/compress/core/width/test_allocate.py: --importance-weighting",
    "compress/core/width/allocate.py:_floor_hint":
        "tests/compress/core/width/test_allocate.py: --width-min 16: --width-min 0 ...",
    "compress/core/width/allocate.py:check_width_table":
        "tests/export/test_width_latency_table.py: --width-min is 0, --width-multiple is 16; flag only: that test "
        "pins the message from its start through the flag ('^width latency table t.json measured no width below 16 "
        "channels but --width-min is 0')",
    "compress/core/prune.py:widths_for_params":
        "tests/app/test_cli_options.py: --param-ratio 0.001 cannot be reached (a library call)",
    "compress/registry.py:_requested_budget":
        "tests/app/test_cli_options.py: does not support --latency-ratio (a library call)",
    "compress/methods/cbalanced/method.py:cbalanced_compress":
        "tests/compress/methods/cbalanced/test_cbalanced.py: --recover-epochs",
    "compress/methods/fde/method.py:_merge": "tests/compress/methods/fde/test_method.py: --param-ratio 0.3 not met",
    "compress/methods/depth/method.py:_excluded":
        "tests/compress/methods/depth/test_depth.py: --exclude layer9.0: no residual block",
    "compress/methods/depth/method.py:_prefix": "tests/compress/methods/depth/test_depth.py: leaves --mac-ratio",
    "compress/methods/fde/graph_path.py:graph_prepare":
        "tests/compress/methods/fde/test_graph.py: --representative mean/lstsq and --compensation are for MLPs",
    "compress/methods/fde/graph_path.py:_meet_budget":
        "tests/compress/methods/fde/test_graph.py: --param-ratio 0.01 cannot be met; flag only: that test anchors the "
        "message at the flag ('^--param-ratio 0.01 cannot be met')",
    "runtime_bench/check.py:_int8_drop": "tests/runtime_bench/test_release_check.py: --max-int8-drop",
    "runtime_bench/check.py:_size": "tests/runtime_bench/test_release_check.py: --max-size",
    "runtime_bench/check.py:_size_ratio": "tests/runtime_bench/test_release_check.py: --max-size-ratio",
    "runtime_bench/check.py:_on_provider":
        "tests/runtime_bench/test_check_placement.py: min_on_provider (--min-on-provider); flag only: it names the "
        "field first already, without backticks, as that test reads it",
    "runtime_bench/bench.py:_check_inputs":
        "tests/runtime_bench/test_bench_shapes.py: axis_values (--axis-values) names; flag only: it names the field "
        "first already, without backticks, as that test reads it",
    "runtime_bench/provider_options.py:parse_provider_option":
        "tests/runtime_bench/test_provider_options.py: --provider-option in each message (it parses that option's "
        "PROVIDER.KEY=VALUE text); flag only: a command-line concept with no Python field (the Python API passes "
        "ProviderSettings)",
    "runtime_bench/provider_options.py:merge_settings":
        "tests/runtime_bench/test_provider_options.py: --provider-option in each message; flag only: the option's "
        "texts are the command line's, with no Python field",
    "export/settings.py:VariantConfig.__post_init__":
        "tests/export/test_ort_format.py: --quant-mode dynamic cannot write the",
}


def _report(agreement: float | None) -> dict[str, Any]:
    """A two-model bench report ('orig', 'small') on one cpu cell; ``agreement`` None: no top-1 agreement."""
    cell = {"provider": "cpu", "batch_size": 1}
    return {"schema_version": SCHEMA_VERSION, "environment": {"cpu_model": "test cpu"},
            "models": [{"name": "orig"}, {"name": "small"}],
            "latency": [{"model": m, **cell, "stats": {"p50_ms": v}} for m, v in (("orig", 2.0), ("small", 1.0))],
            "ratios": [{"model": "small", **cell, "median": 0.5}],
            "metrics": [{"model": "orig", "accuracy": None, "top1_agreement": 1.0},
                        {"model": "small", "accuracy": None, "top1_agreement": agreement}]}


def test_a_check_error_names_the_parameter_in_python() -> None:
    with pytest.raises(CheckError, match=r"^`min_agreement` given but the report has no top-1 agreement") as info:
        check_report(_report(None), min_agreement=0.9)
    assert info.value.fields == ("min_agreement",) and not FLAG.search(str(info.value))
    with pytest.raises(CheckError, match=r"^`baseline` and `max_regression` must be given together$") as info:
        check_report(_report(0.9), max_regression=5.0)
    assert info.value.fields == ("baseline", "max_regression")


@pytest.mark.parametrize("args, line", [
    (["--min-agreement", "0.9"], "--min-agreement given but the report has no top-1 agreement"),
    (["--max-accuracy-drop", "1"], "--max-accuracy-drop given but the report has no accuracy"),
    (["--max-regression", "5"], "--baseline and --max-regression must be given together"),
])
def test_a_check_error_names_the_flag_on_the_command_line(args: list[str], line: str, tmp_path: Path,
                                                         run_cli: Callable) -> None:
    (tmp_path / "r.json").write_text(json.dumps(_report(None)))
    code, _, err = run_cli(["check", str(tmp_path / "r.json"), *args])
    (shown,) = err.strip().splitlines()
    assert code == 2 and shown.startswith(f"minreal: error: {line}") and "`" not in shown, err


def test_a_tensorrt_profile_error_names_the_config_field_and_its_flag() -> None:
    from minreal.runtime_bench.bench import _check_profiles
    from minreal.runtime_bench.config import ModelEntry

    with pytest.raises(BenchInputError, match=r"^TensorRT profile \(`BenchConfig\.provider_settings`\) names "
                                              r"input 'nope'") as info:
        _check_profiles({"nope": ("1x4", "8x4", "8x4")}, {"x": (None, 4)}, ModelEntry("a", Path("a.onnx")))
    assert not FLAG.search(str(info.value))
    assert flag_spelled(info.value).startswith("TensorRT profile (--provider-config) names input 'nope'")


def test_the_table_spells_owners_prefixes_and_exceptions() -> None:
    assert flag_for("", "mac_ratio") == "--mac-ratio"
    assert flag_for("DepthConfig", "score_samples") == "--score-samples"
    assert flag_for("RecoveryConfig", "epochs") == "--recover-epochs"
    assert flag_for("RecoveryConfig", "freeze_batchnorm") == "--recover-freeze-bn"
    assert flag_for("check_report", "plan") == "--paired"
    assert fields_spelled("without the paired decision (`check_report.plan`)", ("plan",)) == \
        "without the paired decision (--paired)"


def _declared_flags() -> set[str]:
    """Every long option of every command (and of the groups' subcommands)."""

    def walk(cmd: click.Command) -> Iterator[str]:
        for p in cmd.params:
            yield from (o for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())) if o.startswith("--"))
        for sub in getattr(cmd, "commands", {}).values():
            yield from walk(sub)

    return set(walk(cli))


def _strings(node: ast.AST) -> str:
    """The literal text of an expression: its string constants (f-string parts too), in order."""
    return "".join(c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str))


def _library_trees() -> Iterator[tuple[Path, ast.AST]]:
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _named_fields() -> Iterator[tuple[str, str, str]]:
    """``(where, owner, field)`` of every field a library error names with a literal: the backticked mentions of
    the literal ``fields=`` of a call, and :func:`minreal.compress.core.errors.field_error`'s field of its class."""
    for path, tree in _library_trees():
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for call in [n for n in ast.walk(cls) if isinstance(n, ast.Call)]:
                name = getattr(call.func, "id", "")
                if name == "field_error" and len(call.args) > 1 and isinstance(call.args[1], ast.Constant):
                    yield f"{path.name}:{call.lineno}", cls.name, call.args[1].value
        for call in [n for n in ast.walk(tree) if isinstance(n, ast.Call)]:
            literal = [k.value for k in call.keywords if k.arg == "fields"]
            if not literal or not isinstance(literal[0], (ast.Tuple, ast.List)):
                continue
            text = "".join(_strings(a) for a in call.args)  # the message, or its pieces (``_fail(where, message)``)
            for elt in literal[0].elts:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    mentions = re.findall(r"`(?:(\w+)\.)?" + re.escape(elt.value) + "`", text)
                    assert mentions, f"{path.name}:{call.lineno}: field {elt.value!r} listed but not named in backticks"
                    yield from ((f"{path.name}:{call.lineno}", owner, elt.value) for owner in mentions)


def test_every_field_a_library_error_names_is_a_flag_of_some_command() -> None:
    declared = _declared_flags()
    named = list(_named_fields())
    assert len(named) > 20  # the scan finds the library's field errors
    missing = [(where, owner, field, flag_for(owner, field)) for where, owner, field in named
               if flag_for(owner, field) not in declared]
    assert not missing


def _names_a_flag(node: ast.AST) -> bool:
    """Whether an expression's literal text names a flag outside backticks (`` `minreal latency-table --kind width` ``
    is a command to run, not a flag of this call), or it spells one (``flag_of(...)``, ``budget.flag(...)``, a
    variable ``flag``)."""
    spells = any((isinstance(c, ast.Call) and "flag" in (getattr(c.func, "id", ""), getattr(c.func, "attr", "")))
                 or (isinstance(c, ast.Call) and getattr(c.func, "id", "") == "flag_of")
                 or (isinstance(c, ast.Name) and c.id == "flag") for c in ast.walk(node))
    return spells or bool(FLAG.search(re.sub(r"`[^`]*`", "", _strings(node))))


#: Library helpers that build an error message from their arguments.
MESSAGE_HELPERS = ("_require", "_fail", "_settings", "_sized_models")


def _functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function under ``node`` with its qualified name, as Python spells ``__qualname__`` (``Class.method``,
    ``outer.<locals>.inner``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
            yield from _functions(child, f"{prefix}{child.name}.<locals>.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def _flagged_messages() -> Iterator[tuple[str, tuple[str, int]]]:
    """``(key, where)`` of each library ``raise`` (and each call of a message-building helper, each ``*_hint``
    function's returned piece of a message) that names a flag: ``key`` is :data:`PINNED`'s "module path:qualified
    function name", ``where`` the module's path and the line of the function's ``def`` (what the key stands for); a
    ``raise`` of a message held in a variable is judged by every string of its function."""
    for key, module, fn, _ in _flagged_nodes():
        yield key, (module, fn.lineno)


def _flagged_nodes() -> Iterator[tuple[str, str, ast.FunctionDef | ast.AsyncFunctionDef, ast.AST]]:
    """``(key, module, function, judged)`` of each message :func:`_flagged_messages` finds, with what it judged: the
    raised expression, the helper's call, the returned piece, or the function's body."""
    for path, tree in _library_trees():
        module = path.relative_to(ROOT).as_posix()
        for qualname, fn in _functions(tree):
            for node in ast.walk(fn):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args \
                        and isinstance(node.exc.args[0], ast.Name):
                    judged: ast.AST = ast.Module(body=fn.body[1:] if ast.get_docstring(fn) else fn.body,
                                                 type_ignores=[])
                elif isinstance(node, ast.Raise) and node.exc is not None:
                    judged = node.exc
                elif isinstance(node, ast.Return) and node.value is not None and fn.name.endswith("_hint"):
                    judged = node.value
                elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in MESSAGE_HELPERS:
                    judged = node
                else:
                    continue
                if _names_a_flag(judged):
                    yield f"{module}:{qualname}", module, fn, judged


def _clashes(found: Iterable[tuple[str, tuple[str, int]]]) -> dict[str, set[tuple[str, int]]]:
    """The keys that stand for more than one function (two modules, or two definitions in one module)."""
    where: dict[str, set[tuple[str, int]]] = collections.defaultdict(set)
    for key, origin in found:
        where[key].add(origin)
    return {key: origins for key, origins in where.items() if len(origins) > 1}


def test_a_pinned_key_stands_for_one_function_of_one_module() -> None:
    """Each key names one function: keyed by file stem, as it once was, the BenchConfig and the method configs (all
    ``config.py``) would have shared one key, and the clash check says so."""
    assert not _clashes(_flagged_messages())
    stem = [(f"{Path(key.split(':')[0]).stem}:{key.split(':')[1].split('.')[-1]}", origin)
            for key, origin in _flagged_messages()]
    configs = {"compress/methods/cbalanced/config.py", "compress/methods/ssm/config.py",
               "compress/methods/factorize/config.py", "runtime_bench/config.py"}
    assert {module for module, _ in _clashes(stem)["config:__post_init__"]} == configs
    for key in PINNED:
        module, qualname = key.split(":")
        names = {q for q, _ in _functions(ast.parse((ROOT / module).read_text()))}
        assert qualname in names, f"{key}: no such function in {module}"


def test_library_errors_name_no_flag_but_the_pinned_ones() -> None:
    flagged = {key for key, _ in _flagged_messages()}
    assert not flagged - set(PINNED), "a library error names a flag: name the field (minreal.facts.FieldError)"
    assert not set(PINNED) - flagged, "a pinned message names no flag any more: drop it from PINNED"


#: A field named in backticks in a message's template: literal (`` `mac_ratio` ``, `` `DepthConfig.criterion` ``) or
#: formatted (`` `{kind}` ``).
MENTION = re.compile(r"`(?:\{[^{}`]*\}|\w+(?:\.\w+)?)`")
#: A flag in a message's template: literal, or spelled by a formatted value (``{flag}``, ``{flag_of(kind)}``).
TEMPLATE_FLAG = re.compile(r"(?<![\w-])--[a-z]|\{[^{}]*flag[^{}]*\}")


def _template(node: ast.AST) -> str:
    """A string's text with each formatted value as its source in braces (``"`{kind}`: {flag_of(kind)} ..."``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                       for v in node.values)
    return ""


def _templates(node: ast.AST) -> list[str]:
    """The templates of every string under ``node`` (an f-string whole, not its pieces)."""
    inner = {id(c) for n in ast.walk(node) if isinstance(n, ast.JoinedStr) for c in ast.walk(n) if c is not n}
    return [t for n in ast.walk(node) if id(n) not in inner and (t := _template(n))]


def _field_first(template: str, via_field_error: bool) -> bool:
    """Whether a template that names a flag names a field in backticks before it; a problem given to
    :func:`~minreal.compress.core.errors.field_error` (``"(--energy-eps) must ..."``) has its field put before it."""
    plain = re.sub(r"`[^`]*`", lambda m: "_" * len(m[0]), template)  # a backticked command is not a flag
    flag = TEMPLATE_FLAG.search(plain)
    if flag is None:
        return True
    if via_field_error and template.lstrip().startswith("(--"):
        return True
    mention = MENTION.search(template)
    return mention is not None and mention.start() < flag.start()


def _flag_only(key: str) -> bool:
    return "flag only:" in PINNED[key]


def test_every_pinned_message_names_its_python_field_first() -> None:
    """A Python API user reads the field they passed before the pinned flag (``minreal.app.field_flags``' forms)."""
    checked, late = set(), []
    for key, _, fn, judged in _flagged_nodes():
        if _flag_only(key):
            continue
        checked.add(key)
        calls_field_error = any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "field_error"
                                for n in ast.walk(fn))
        late += [(key, t) for t in _templates(judged) if not _field_first(t, calls_field_error)]
    assert not late
    assert checked == {k for k in PINNED if not _flag_only(k)} and len(checked) == 24
    # the rule bites: a message left flag first fails it
    unconverted = {key for key, _, _, judged in _flagged_nodes()
                   if _flag_only(key) and not all(_field_first(t, False) for t in _templates(judged))}
    assert {"compress/core/lowrank_plan.py:_check_layer_target", "compress/methods/fde/graph_path.py:_meet_budget",
            "runtime_bench/provider_options.py:parse_provider_option"} <= unconverted


def test_the_command_line_shows_a_field_named_beside_its_flag_as_the_flag_once() -> None:
    assert fields_spelled("`layer_mac_ratio` (--layer-mac-ratio) must lie in (0, 1], got 1.5", ("layer_mac_ratio",)) \
        == "--layer-mac-ratio must lie in (0, 1], got 1.5"
    assert fields_spelled("`RecoveryConfig.features` (--recover-features 'x') is not a module", ("features",)) == \
        "--recover-features 'x' is not a module"
    assert fields_spelled("`exclude`: --exclude a.b: no residual block", ("exclude",)) == \
        "--exclude a.b: no residual block"
    assert fields_spelled("depth: `mac_ratio`: removing all 7 blocks leaves --mac-ratio 0.9", ("mac_ratio",)) == \
        "depth: removing all 7 blocks leaves --mac-ratio 0.9"
    assert fields_spelled("`a_b` and `c`: --a-b x and --c are for MLPs", ("a_b", "c")) == "--a-b x and --c are for MLPs"
    # a lead whose flag the rest does not name, a parenthesis that is not the flag, a longer flag: kept
    assert fields_spelled("`DepthConfig.criterion`: unknown", ("criterion",)) == "--criterion: unknown"
    assert fields_spelled("see `RecoveryConfig.val_fraction` (or fewer ranks)", ("val_fraction",)) == \
        "see --recover-val-fraction (or fewer ranks)"
    assert fields_spelled("`check_report.max_size_kb` (--max-size) given", ("max_size_kb",)) == "--max-size given"
    assert fields_spelled("`max_size`: --max-size-ratio 2", ("max_size",)) == "--max-size: --max-size-ratio 2"


def test_a_pinned_message_names_the_field_in_python_and_the_flag_once_on_the_command_line(
        tmp_path: Path, workdir: Path, run_cli: Callable) -> None:
    from minreal.compress import CompressionError
    from minreal.compress.core.recover_options import RecoveryConfig
    from minreal.compress.methods.svd import SVDConfig

    with pytest.raises(CompressionError) as info:
        SVDConfig(layer_mac_ratio=1.5)
    assert str(info.value) == "`layer_mac_ratio` (--layer-mac-ratio) must lie in (0, 1], got 1.5"
    assert info.value.fields == ("layer_mac_ratio",)
    with pytest.raises(CompressionError) as info:
        RecoveryConfig(epochs=1, steps=3)
    assert str(info.value) == ("give `RecoveryConfig.epochs` (--recover-epochs) or `RecoveryConfig.steps` "
                               "(--recover-steps), not both (got 1 and 3)")
    assert info.value.fields == ("epochs", "steps")
    with pytest.raises(CompressionError) as info:
        RecoveryConfig(alpha=1.5)
    assert str(info.value) == "`RecoveryConfig.alpha` (--recover-alpha) must lie in [0, 1], got 1.5"
    with pytest.raises(CheckError, match=r"^`max_int8_drop` \(--max-int8-drop\) given but") as check:
        check_report(_report(0.9), max_int8_drop=1.0)
    assert check.value.fields == ("max_int8_drop",)

    cut = ["compress", "net.py:make", "-m", "svd", "--data", "digits-flat", "--out", "cut.pt2", "-q"]
    (tmp_path / "r.json").write_text(json.dumps(_report(0.9)))
    for argv, line, flags in [
        ([*cut, "--layer-mac-ratio", "1.5"], "--layer-mac-ratio must lie in (0, 1], got 1.5", ["--layer-mac-ratio"]),
        ([*cut, "--mac-ratio", "0.5", "--recover-epochs", "1", "--recover-steps", "3"],
         "give --recover-epochs or --recover-steps, not both (got 1 and 3)", ["--recover-epochs", "--recover-steps"]),
        (["check", str(tmp_path / "r.json"), "--max-int8-drop", "1"],
         "--max-int8-drop given but the report has no INT8 file", ["--max-int8-drop"]),
    ]:
        code, _, err = run_cli(argv)
        (shown,) = err.strip().splitlines()
        assert code == 2 and line in shown and "`" not in shown, err
        assert [len(re.findall(re.escape(f) + r"(?![\w-])", shown)) for f in flags] == [1] * len(flags), shown


def test_a_mention_with_its_python_value_reads_well_in_python_and_as_the_flag_once_on_the_command_line() -> None:
    from minreal.compress.core.width.allocate import _floor_hint
    from minreal.export.settings import VariantConfig

    with pytest.raises(ValueError) as info:
        VariantConfig(quant_target="arm64", quant_mode="dynamic")
    assert str(info.value) == ("`VariantConfig.quant_mode`='dynamic': --quant-mode dynamic cannot write the arm64 INT8 "
                               "format (its activations are quantised to uint8 at run time); use `quant_mode`='static' "
                               "(--quant-mode static)")
    assert flag_spelled(info.value) == ("--quant-mode dynamic cannot write the arm64 INT8 format (its activations are "
                                        "quantised to uint8 at run time); use --quant-mode static")
    hint = _floor_hint(16, 16)  # inside the refusal's parenthesis: "(every group at its narrowest allowed width...)"
    assert hint.startswith(", `width_min`=16 (--width-min 16: --width-min 0 --width-multiple 8 cuts further, but ")
    assert hint.endswith("can run slower than the wider one)")
    assert fields_spelled(hint, ("width_min",)) == hint.replace(", `width_min`=16 (", ", ")[:-1]
    assert fields_spelled("`opset`=17 is too old; `rtol`='x' (see the docs)", ("opset", "rtol")) == \
        "--opset 17 is too old; --rtol x (see the docs)"
