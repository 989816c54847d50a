"""Import what a user names as ``package.module:callable`` or ``path/to/file.py:callable``.

The shared edge of :mod:`minreal.app.models` and :mod:`minreal.app.data`: the :class:`SpecError` both raise,
one-line causes, and resolving a callable spec (a file is imported by path; ``sys.path`` is left alone).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from minreal.facts import error_line

__all__ = ["SpecError"]


class SpecError(ValueError):
    """A model or data spec cannot be loaded; the one-line message names the culprit and what to do."""


def _cause(exc: BaseException) -> str:
    """``"TypeError: first line of the message"``, without terminal colour codes, at most 200 characters."""
    return error_line(exc, with_type=True, max_chars=200)


def _shape(t: Any) -> str:
    """A tensor's or array's shape as ``"(2, 1, 8, 8)"``."""
    return str(tuple(int(d) for d in t.shape))


def _looks_like_path(spec: str) -> bool:
    return bool(Path(spec).suffix) or "/" in spec or "\\" in spec


def _describe(obj: Any) -> str:
    if isinstance(obj, Mapping):
        keys = ", ".join(repr(k) for k in list(obj)[:5])
        return f"a dict with keys {keys}{', ...' if len(obj) > 5 else ''}"
    return f"a {type(obj).__name__}"


@dataclass(frozen=True)
class _CallableSpec:
    source: str  # a file path ending in .py, or a dotted module name
    attr: str  # possibly dotted attribute path inside the module

    @property
    def is_file(self) -> bool:
        return self.source.endswith(".py")


def _parse_callable(spec: str) -> _CallableSpec | None:
    """``"a/b.py:make"`` or ``"pkg.mod:make"`` → parts; anything else (paths, names) → None."""
    source, sep, attr = spec.rpartition(":")
    if not sep or not source or not all(part.isidentifier() for part in attr.split(".")):
        return None
    return _CallableSpec(source, attr)


def _import_file(path: Path) -> ModuleType:
    """Import a Python file by path under a private module name (registered so pickling/dataclasses work)."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_minreal_spec_{stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise SpecError(f"cannot import {path} as a Python module; give a .py file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_source(spec: str, target: _CallableSpec, kind: str) -> ModuleType:
    """The module a callable spec points into; import failures become one-line SpecErrors."""
    if target.is_file:
        path = Path(target.source)
        if not path.is_file():
            raise SpecError(f"{kind} file {path} not found (spec {spec!r}); check the path")
        try:
            return _import_file(path)
        except Exception as exc:
            raise SpecError(f"importing {path} failed ({_cause(exc)}); fix the file — its own imports must "
                            "be installed or on PYTHONPATH (minreal does not edit sys.path)") from exc
    try:
        return importlib.import_module(target.source)
    except Exception as exc:
        raise SpecError(f"cannot import module {target.source!r} from spec {spec!r} ({_cause(exc)}); install "
                        f"it, or give path/to/file.py:{target.attr}") from exc


def _resolve_callable(spec: str, target: _CallableSpec, kind: str) -> Callable[..., Any]:
    """Import the module and walk the (dotted) attribute; the result must be callable."""
    module = _import_source(spec, target, kind)
    obj: Any = module
    for part in target.attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"define {part} there"
            raise SpecError(f"{kind} factory {target.attr!r} not found in {target.source} (spec {spec!r}); {hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SpecError(f"{target.attr!r} in {target.source} is a {type(obj).__name__}, not a callable "
                        f"(spec {spec!r}); name a function or class")
    return obj

