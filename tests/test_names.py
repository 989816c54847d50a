"""One home per name: what a module lists in ``__all__`` is defined there, checked on the source with ``ast``.

A module that is not a package's ``__init__`` lists only what it defines itself (a ``def``, a ``class`` or an
assignment at its top level; an import does not count), so each public name has one module to import it from and
no module re-exports another's names. A package's ``__init__`` may gather names from its modules: every name it
lists resolves, and comes from a module that defines it (or from a package that lists it in turn), whether the
``__init__`` imports it at once or on first use (:func:`minreal.compress.core.lazy.lazy_exports`). The tool, its
tests, benchmarks and examples import each name from its home, or from a package that gathers it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Each import name and the folder its source lives in.
PACKAGES = {"minreal": ROOT / "minreal", "minreal.compress": ROOT / "compress", "minreal.export": ROOT / "export",
            "minreal.runtime_bench": ROOT / "runtime_bench"}
#: Modules that still list names of another's while issue 43 splits them up, and the change that gives each name its
#: home. The last test fails once a module here is fixed or gone, so that the exemption goes with it.
PENDING: dict[str, str] = {}


def _sources() -> Iterator[tuple[str, Path]]:
    """(module name, path) of every module of the tool."""
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            yield ".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)]), path


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _defined(body: list[ast.stmt]) -> set[str]:
    """Names a module body binds by ``def``, ``class`` or assignment (in top-level ``if``/``try`` blocks too)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.If):
            names |= _defined(node.body) | _defined(node.orelse)
        elif isinstance(node, ast.Try):
            names |= _defined([*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)])
    return names


def _listed(tree: ast.Module) -> list[str] | None:
    """The module's ``__all__`` (a literal list or tuple of strings), None when it has none."""
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return list(ast.literal_eval(node.value))
    return None


def _foreign(path: Path) -> list[str]:
    """Names ``path`` lists in ``__all__`` without defining them."""
    tree = _tree(path)
    defined = _defined(tree.body)
    return [name for name in _listed(tree) or [] if name not in defined]


def _modules() -> list[Path]:
    return [path for _, path in _sources() if path.name != "__init__.py"]


def _packages() -> list[str]:
    return [name for name, path in _sources() if path.name == "__init__.py"]


def _provides(module: str, name: str) -> bool:
    """Whether ``module`` is the home of ``name``, or a package that lists it (and gathers it from its home)."""
    origin = Path(importlib.util.find_spec(module).origin)
    tree = _tree(origin)
    return name in (_listed(tree) or []) if origin.name == "__init__.py" else name in _defined(tree.body)


def _sources_of(package: str) -> dict[str, str]:
    """Where a package's ``__init__`` takes each name it imports: ``{name: module}``, at once or on first use."""
    tree = _tree(Path(importlib.util.find_spec(package).origin))
    found = {alias.asname or alias.name: importlib.util.resolve_name("." * node.level + (node.module or ""), package)
             if node.level else node.module
             for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    getter = getattr(importlib.import_module(package), "__getattr__", None)
    if getter is not None:  # lazy_exports keeps its map in a closure; runtime_bench in a module global
        refs = inspect.getclosurevars(getter)
        lazy = refs.nonlocals.get("names") or refs.globals.get("_EXPORTS") or {}
        found |= {name: importlib.util.resolve_name(module, package) for name, module in lazy.items()}
    return found


def test_the_check_sees_the_tool() -> None:
    assert len(_modules()) > 150 and {"minreal.compress", "minreal.export", "minreal.app"} <= set(_packages())


def test_a_module_lists_only_names_it_defines() -> None:
    """Not ``from .options import Budget`` then ``__all__ = ["Budget", ...]``: import a name from its home."""
    bad = {str(path.relative_to(ROOT)): names for path in _modules()
           if str(path.relative_to(ROOT)) not in PENDING and (names := _foreign(path))}
    assert not bad, f"listed in __all__ but defined elsewhere (import them from their home): {bad}"


@pytest.mark.parametrize("package", _packages())
def test_a_package_gathers_names_from_their_homes(package: str) -> None:
    module = importlib.import_module(package)
    listed, sources = list(getattr(module, "__all__", [])), _sources_of(package)
    missing = [name for name in listed if not hasattr(module, name)]
    assert not missing, f"{package} lists names that do not resolve: {missing}"
    bad = {name: sources[name] for name in listed if name in sources and not _provides(sources[name], name)}
    assert not bad, f"{package} takes names from a module that is not their home: {bad}"


def _module_of(path: Path) -> list[str]:
    """The import name of any tracked file's package, as a list (``tests/app`` stays ``tests.app``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    for package, folder in PACKAGES.items():
        if path.is_relative_to(folder):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            break
    return parts[:-1]


def _imports_from_the_tool(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, module, name) of every ``from minreal... import name`` in ``path``, relative imports resolved."""
    package = _module_of(path)
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            if module == "minreal" or module.startswith("minreal."):
                yield from ((node.lineno, module, alias.name) for alias in node.names)


@functools.cache
def _home_or_gatherer(module: str, name: str) -> bool:
    """Whether ``from module import name`` takes ``name`` from its home, a package that gathers it, or is a
    submodule import (``from minreal.app.tune import search``)."""
    origin = Path(importlib.util.find_spec(module).origin)
    return _provides(module, name) or (origin.name == "__init__.py"
                                       and importlib.util.find_spec(f"{module}.{name}") is not None)


def test_every_import_takes_a_name_from_its_home() -> None:
    """Not ``from minreal.export.quantize import QuantizationError``: ``from minreal.export.errors import ...``."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    bad = [f"{name}:{line}: from {module} import {imported}" for name in tracked.stdout.split()
           if (ROOT / name).is_file()
           for line, module, imported in _imports_from_the_tool(ROOT / name)
           if not _home_or_gatherer(module, imported)]
    assert not bad, bad


@pytest.mark.parametrize("path", sorted(PENDING))
def test_a_pending_exemption_is_still_needed(path: str) -> None:
    done = f"{path} is gone or lists only its own names now ({PENDING[path]}): drop it from PENDING"
    assert (ROOT / path).is_file() and _foreign(ROOT / path), done
