"""Import layering, one namespace and facts written once, checked on the source with ``ast``.

Layers, bottom to top: :mod:`minreal.facts` (standard library only) under :mod:`minreal.compress` (PyTorch, no
ONNX) and :mod:`minreal.runtime_bench` (ONNX Runtime, no torch); :mod:`minreal.export` is where those two meet;
:mod:`minreal.app` (command line, pipelines, tune, reports) sits on top and nothing below imports it. Every
import, in the tool, its tests, benchmarks and examples, goes through the ``minreal`` namespace. Shared literals
(provider names, integer op sets, the progress key) are written in :mod:`minreal.facts` only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Each layer's import name and where its source lives in the repository.
LAYERS = {"minreal.facts": ROOT / "minreal" / "facts.py", "minreal.compress": ROOT / "compress",
          "minreal.runtime_bench": ROOT / "runtime_bench", "minreal.export": ROOT / "export",
          "minreal.app": ROOT / "minreal" / "app"}
#: What each layer may import from the tool (the layers below it); ``minreal.app`` may import every layer.
BELOW = {"minreal.facts": set(), "minreal.compress": {"minreal.facts"}, "minreal.runtime_bench": {"minreal.facts"},
         "minreal.export": {"minreal.facts", "minreal.compress", "minreal.runtime_bench"}}
#: Third-party packages a layer must never import.
FOREIGN = {"minreal.compress": {"onnx", "onnxruntime", "onnxsim", "onnxscript"},
           "minreal.runtime_bench": {"torch", "torchvision"}}
FACTS = "minreal/facts.py"
OLD_NAMES = {"compress", "export", "runtime_bench"}


def _modules(layer: str) -> list[Path]:
    where = LAYERS[layer]
    return [where] if where.is_file() else sorted(where.rglob("*.py"))


def _module_name(layer: str, path: Path) -> str:
    where = LAYERS[layer]
    parts = [] if where.is_file() else list(path.relative_to(where).with_suffix("").parts)
    parts = parts[:-1] if parts and parts[-1] == "__init__" else parts
    return ".".join([layer, *parts])


def _imports(layer: str, path: Path) -> Iterator[str]:
    """Absolute names of every module ``path`` imports, anywhere in the file (function-level imports too)."""
    package = _module_name(layer, path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            yield ".".join([*base, node.module] if node.module else base)


def _layer_of(name: str) -> str | None:
    return next((layer for layer in LAYERS if name == layer or name.startswith(layer + ".")), None)


def test_every_layer_has_modules() -> None:
    assert all(_modules(layer) for layer in LAYERS) and len(_modules("minreal.app")) > 10


@pytest.mark.parametrize("layer", sorted(BELOW))
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    bad = [f"{path.relative_to(ROOT)} imports {name}" for path in _modules(layer) for name in _imports(layer, path)
           if (_layer_of(name) or layer) not in BELOW[layer] | {layer}
           or name.split(".")[0] in FOREIGN.get(layer, set())]
    assert not bad, bad


def test_facts_import_the_standard_library_only() -> None:
    names = {name.split(".")[0] for name in _imports("minreal.facts", LAYERS["minreal.facts"])}
    assert names and names <= set(sys.stdlib_module_names) | {"__future__"}, names


def _python_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in tracked.stdout.split() if (ROOT / name).exists()]


def test_everything_imports_through_the_minreal_namespace() -> None:
    """The tool, its tests, benchmarks and examples: no import of the bare folder names (``import compress``)."""
    bad = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] in OLD_NAMES]
    assert not bad, bad


def test_importing_compress_loads_no_onnx_and_runtime_bench_no_torch() -> None:
    """What the AST check cannot see: packages' ``__init__`` modules load lazily."""
    code = ("import sys, minreal.compress as c, minreal.compress.registry; c.method_names(); "
            "assert not {'onnx', 'onnxruntime'} & set(sys.modules), 'compress imported onnx'; "
            "import minreal.runtime_bench as rb, minreal.runtime_bench.bench, minreal.runtime_bench.check; "
            "assert 'onnxruntime' not in sys.modules, 'onnxruntime is imported on first use only'; "
            "rb.available_providers(); assert 'onnxruntime' in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    code = ("import sys, minreal.runtime_bench, minreal.runtime_bench.bench, minreal.runtime_bench.check, "
            "minreal.runtime_bench.report; "
            "assert not {'torch', 'minreal.compress'} & set(sys.modules), 'runtime_bench imported torch'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def _string_constants(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _collections(tree: ast.AST) -> Iterator[set[str]]:
    """The string elements of every set, tuple and list literal, and the string keys of every dict literal."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            yield {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        elif isinstance(node, ast.Dict):
            yield {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _defining_modules(predicate) -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for layer in LAYERS for path in _modules(layer)
                  if predicate(ast.parse(path.read_text(), str(path))))


@pytest.mark.parametrize("literal", ["CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider",
                                     "QLinearConv", "MatMulInteger", "QGemm", "DynamicQuantizeLinear"])
def test_shared_literal_is_written_in_one_module(literal: str) -> None:
    assert _defining_modules(lambda tree: literal in _string_constants(tree)) == [FACTS]


def test_provider_short_names_are_listed_in_one_module() -> None:
    from minreal.facts import PROVIDERS

    shorts = set(PROVIDERS)
    assert _defining_modules(lambda tree: any(shorts <= found for found in _collections(tree))) == [FACTS]


def test_progress_key_is_written_in_one_module() -> None:
    assert _defining_modules(lambda tree: "minreal_progress" in _string_constants(tree)) == [FACTS]


#: The most lines :mod:`minreal.app.cli` may hold: the group, its commands' registration and the entry points.
CLI_MAX_LINES = 200


def test_the_cli_module_is_only_the_group_and_its_entry_points() -> None:
    """The application is a thin layer (STYLE.md): the commands live in ``minreal/app/commands/``, not in cli.py."""
    lines = len((ROOT / "minreal" / "app" / "cli.py").read_text().splitlines())
    assert lines < CLI_MAX_LINES, f"minreal/app/cli.py has {lines} lines; move command logic to minreal/app/commands"


def test_each_command_is_defined_in_its_own_module() -> None:
    """``minreal NAME`` is defined in ``minreal/app/commands/NAME.py`` (a dash in NAME is an underscore there)."""
    from minreal.app.cli import cli

    bad = []
    for name, command in cli.commands.items():
        module = name.replace("-", "_")
        path = ROOT / "minreal" / "app" / "commands" / f"{module}.py"
        if not path.is_file() or command.callback.__module__ != f"minreal.app.commands.{module}":
            bad.append(f"{name}: defined in {command.callback.__module__}, expected {path.relative_to(ROOT)}")
    assert len(cli.commands) > 5 and not bad, bad
