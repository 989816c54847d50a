"""One docstring style, numpydoc, checked on the source with ``ast``.

Every docstring of the tool (module, class, function) writes its sections as numpydoc does: a header line
(``Parameters``, ``Returns``, ``References``, ...) underlined by dashes of the same length, never a Google-style
``Args:``/``Returns:`` line; and each method package under ``compress/methods/`` names, in a ``References`` section
of at least one of its modules, the papers it follows.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("compress", "export", "runtime_bench", "minreal")
#: numpydoc's section names.
NUMPYDOC = frozenset({"Parameters", "Returns", "Yields", "Receives", "Other Parameters", "Raises", "Warns", "Warnings",
                      "See Also", "Notes", "References", "Examples", "Attributes", "Methods"})
#: A Google-style section header: the name and a colon alone on a line.
GOOGLE = re.compile(r"^\s*(Args|Arguments|Keyword Args|Returns|Raises|Yields|Example|Examples|Attributes|Note|Notes"
                    r"|Todo|Warning|Warnings|See Also|References)\s*:\s*$")


def _sources() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]


@functools.cache
def _docstrings(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of every module, class and function docstring of ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
    return found


def _google_headers(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line + k}: {text.strip()}" for line, doc in _docstrings(path)
            for k, text in enumerate(doc.splitlines()) if GOOGLE.match(text)]


def _underline_errors(doc: str) -> Iterator[str]:
    """Section headers without their underline, underlines of another length or under a name that is no section."""
    lines = [line.strip() for line in doc.splitlines()]
    for k, line in enumerate(lines):
        below = lines[k + 1] if k + 1 < len(lines) else ""
        underlined = len(below) >= 3 and set(below) == {"-"}
        if line in NUMPYDOC and not underlined:
            yield f"line {k}: {line!r} is not underlined by dashes"
        elif underlined and line not in NUMPYDOC:
            yield f"line {k}: {line!r} is underlined but is not a numpydoc section"
        elif underlined and len(below) != len(line):
            yield f"line {k}: {line!r} is underlined by {len(below)} dashes, not {len(line)}"


@pytest.mark.parametrize("path", _sources(),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_google_style_section_headers(path: Path) -> None:
    assert _google_headers(path) == []


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_numpydoc_headers_are_underlined_to_their_length(path: Path) -> None:
    errors = [f"{path.relative_to(ROOT)}:{line}: {e}" for line, doc in _docstrings(path)
              for e in _underline_errors(doc)]
    assert errors == []


@pytest.mark.parametrize("package", sorted(p for p in (ROOT / "compress" / "methods").iterdir()
                                           if (p / "__init__.py").is_file()), ids=lambda p: p.name)
def test_each_method_package_has_references(package: Path) -> None:
    assert any("\nReferences\n" in "\n".join(line.strip() for line in doc.splitlines())
               for path in sorted(package.rglob("*.py")) for _, doc in _docstrings(path)), package.name


def test_the_checks_see_what_they_look_for() -> None:
    """The patterns find a Google-style header and a wrongly underlined numpydoc one (the checks are not vacuous)."""
    assert GOOGLE.match("    Args:") and GOOGLE.match("    Returns:") and not GOOGLE.match("    Returns")
    assert list(_underline_errors("x\n\nReturns\n-------\nint\n    one\n")) == []
    assert len(list(_underline_errors("x\n\nReturns\n------\nint\n"))) == 1
    assert len(list(_underline_errors("x\n\nReturns\nint\n"))) == 1
