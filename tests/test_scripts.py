"""Benchmark and example scripts are not run by the suite (they take minutes); their imports of minreal
are checked instead, so a moved module cannot silently break a README command."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("examples/*.py")])
PACKAGES = ("compress", "export", "runtime_bench")


def _minreal_imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module, imported names) of every ``import``/``from ... import`` of a minreal package in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in PACKAGES:
            found.append((node.module, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            found += [(a.name, ()) for a in node.names if a.name.split(".")[0] in PACKAGES]
    return found


def _resolves(module: str, name: str) -> bool:
    mod = importlib.import_module(module)
    if hasattr(mod, name):
        return True
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_imports_resolve(script: Path) -> None:
    missing = [f"{module}.{name}" for module, names in _minreal_imports(script) for name in names or ("",)
               if not (_resolves(module, name) if name else importlib.import_module(module))]
    assert not missing, missing


def test_there_are_scripts_to_check() -> None:
    assert len(SCRIPTS) >= 5 and any("pipeline" in p.name for p in SCRIPTS)
