"""The oldest Python that ``pyproject.toml`` declares compiles every module and loads the standard-library layer.

Ruff (``target-version``) checks syntax against the same version inside ``make test``; this test runs the real
interpreter where one is installed (pyenv or ``pythonX.Y`` on ``PATH``) and skips, saying so, where none is.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("minreal", "compress", "export", "runtime_bench", "benchmarks", "examples", "tests")


def _declared_minimum() -> tuple[int, int]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec).groups()
    return int(major), int(minor)


def _interpreter(version: tuple[int, int]) -> str | None:
    """A working ``pythonX.Y``: pyenv's own build first (its shim on PATH may point at another version)."""
    name = f"python{version[0]}.{version[1]}"
    candidates = [*sorted(Path.home().glob(f".pyenv/versions/{version[0]}.{version[1]}.*/bin/{name}")),
                  shutil.which(name)]
    for found in filter(None, candidates):
        probe = subprocess.run([str(found), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                               text=True, timeout=60)
        if probe.returncode == 0 and probe.stdout.strip() == str(version):
            return str(found)
    return None


def test_ruff_targets_the_declared_minimum() -> None:
    declared = _declared_minimum()
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["target-version"]
    assert ruff == f"py{declared[0]}{declared[1]}"
    assert sys.version_info[:2] >= declared


def test_the_declared_minimum_compiles_everything_and_imports_the_bottom_layer(tmp_path: Path) -> None:
    declared = _declared_minimum()
    python = _interpreter(declared)
    if python is None:
        pytest.skip(f"no Python {declared[0]}.{declared[1]} interpreter here (pyenv or PATH)")
    done = subprocess.run([python, "-m", "compileall", "-q", "-x", r"/(\.venv|runs|build)/",
                           *(str(ROOT / s) for s in SOURCES)], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPYCACHEPREFIX": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import minreal.facts as f; assert f.PROVIDERS"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
