"""Names resolved on first use, so that describing a method (its name, config and phases) imports no torch: a
:class:`LazyCallable` stands for ``"package.module:function"`` until called, and :func:`lazy_exports` gives a
package a module ``__getattr__`` that imports the submodule holding a name when that name is first read."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["LazyCallable", "import_target", "lazy_exports"]


def _split(target: str) -> tuple[str, str]:
    """(module, attribute) of ``"package.module:attribute"``; ValueError for any other form."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{target!r} is not a 'package.module:attribute' reference")
    return module_name, attr


def import_target(target: str) -> Any:
    """The object named by ``"package.module:attribute"`` (the attribute may be dotted)."""
    module_name, attr = _split(target)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class LazyCallable:
    """A function named by ``"package.module:function"``, imported on its first call (then kept)."""

    __slots__ = ("target", "_fn")

    def __init__(self, target: str) -> None:
        _split(target)
        self.target = target
        self._fn: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        """The function itself (imported once)."""
        if self._fn is None:
            fn = import_target(self.target)
            if not callable(fn):
                raise TypeError(f"{self.target} is a {type(fn).__name__}, not a function")
            self._fn = fn
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyCallable) and other.target == self.target

    def __hash__(self) -> int:
        return hash(self.target)

    def __repr__(self) -> str:
        return f"LazyCallable({self.target!r})"

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return LazyCallable, (self.target,)


def lazy_exports(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: reading one of ``names`` (``{name: module}``, the module
    relative to the package as in an import statement, e.g. ``".method"``) imports that module and returns its
    attribute of that name."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    def __dir__() -> list[str]:
        return sorted({*names, *vars(importlib.import_module(package))})

    return __getattr__, __dir__
