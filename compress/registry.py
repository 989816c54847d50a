"""Registry of compression methods: each registers under a unique name with its config dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from .data import Dataset
from .errors import UnknownMethodError
from .report import CompressionReport

__all__ = ["Method", "MethodFn", "register_method", "get_method", "method_names", "compress"]

MethodFn = Callable[[nn.Module, Dataset, Any], "tuple[nn.Module, CompressionReport]"]


@dataclass(frozen=True)
class Method:
    """A registered method: ``fn(model, data, config) -> (compressed module, report)``."""

    name: str
    fn: MethodFn
    config_cls: type
    summary: str


_REGISTRY: dict[str, Method] = {}


def register_method(name: str, config_cls: type, summary: str) -> Callable[[MethodFn], MethodFn]:
    """Decorator registering ``fn`` as method ``name``; a duplicate name is an error."""

    def deco(fn: MethodFn) -> MethodFn:
        if name in _REGISTRY:
            raise ValueError(f"compression method {name!r} is already registered")
        _REGISTRY[name] = Method(name, fn, config_cls, summary)
        return fn

    return deco


def get_method(name: str) -> Method:
    """Look up a method by name."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownMethodError(
            f"unknown compression method {name!r}; choose one of: {', '.join(method_names())}") from None


def method_names() -> list[str]:
    """Registered method names, sorted."""
    return sorted(_REGISTRY)


def compress(model: nn.Module, data: Dataset, method: str, config: Any = None) -> tuple[nn.Module, CompressionReport]:
    """Run a registered method; ``config`` defaults to the method's config dataclass defaults."""
    m = get_method(method)
    cfg = m.config_cls() if config is None else config
    if not isinstance(cfg, m.config_cls):
        raise TypeError(f"method {method!r} expects a {m.config_cls.__name__}, got {type(cfg).__name__}")
    return m.fn(model, data, cfg)
