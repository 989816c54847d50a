"""A torch.fx tracer that carries the example's values, for a model whose own ``forward`` branches on them.

A Hugging Face model checks what it is given before it computes: ViT compares ``pixel_values.dtype`` with its
weights', Whisper's encoder ``input_features.shape[-1]`` with the length it was built for, GPT-2 the mask's rank.
Plain torch.fx cannot decide such a test (a traced value has no truth value) and stops. Here every traced value also
holds what the example gives it, computed as the graph is recorded, so a test takes the branch the example takes, and
the decision is recorded (``file:line``, the value) for the report. The graph is the model's computation on inputs
like the example; :func:`minreal.compress.core.width.tracing.trace` runs it on other batch sizes against the model
itself, so a decision that depends on the batch, or that the model decides otherwise, is refused there.

Static facts of a tensor (``dtype``, ``device``, ``ndim``) are read from the example without a node; sizes stay
traced (``x.shape[0]`` is an operation of the graph) until Python needs them as numbers. Each value knows whether it
depends on the values of a tensor or only on sizes: a decision on values (``if x.mean() > 0``) is refused, as it
would hold for the example only.
"""

from __future__ import annotations

import copy
import inspect
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.fx.node import map_aggregate

__all__ = ["ConcreteTracer", "ConcreteProxy", "example_inputs", "reads_data", "value_of"]

STATIC = frozenset({"dtype", "device", "ndim", "layout", "is_cuda", "is_sparse", "is_quantized", "is_meta"})
"""Tensor attributes read from the example's value directly: they do not change with the data."""


SIZES = frozenset({"shape", "size", "dim", "numel", "ndimension", "nelement"})
"""Attributes and methods of a tensor that read its sizes, not its values."""


def value_of(x: Any) -> Any:
    """The example's value of a traced value (a :class:`ConcreteProxy`, or an attribute of one), else ``x``."""
    if isinstance(x, ConcreteProxy):
        return x.value
    if isinstance(x, fx.proxy.Attribute):
        return getattr(value_of(x.root), x.attr)
    return x


def reads_data(x: Any) -> bool:
    """Whether a traced value depends on the values of a tensor the model is given or holds (not only on sizes)."""
    if isinstance(x, ConcreteProxy):
        return x.data
    if isinstance(x, fx.proxy.Attribute):
        return x.attr not in SIZES and reads_data(x.root)
    return False


class ConcreteProxy(fx.Proxy):
    """A traced value, the value the example gives it, and whether it depends on tensor values (``data``) or only
    on sizes: Python may decide on sizes, never on data."""

    def __init__(self, node: fx.Node, tracer: ConcreteTracer, value: Any, data: bool) -> None:
        super().__init__(node, tracer)
        self.value = value
        self.data = data

    def __getattr__(self, k: str) -> Any:
        if k in STATIC and isinstance(self.value, torch.Tensor):
            return getattr(self.value, k)
        return super().__getattr__(k)

    def __len__(self) -> int:
        return self.tracer.decide(self, len(self.value), "len")  # type: ignore[attr-defined]

    def __index__(self) -> int:
        return self.tracer.decide(self, self.value.__index__(), "int")  # type: ignore[attr-defined]

    def __int__(self) -> int:
        return self.tracer.decide(self, int(self.value), "int")  # type: ignore[attr-defined]

    def __float__(self) -> float:
        return self.tracer.decide(self, float(self.value), "float")  # type: ignore[attr-defined]


class ConcreteTracer(fx.Tracer):
    """Records the graph as :class:`torch.fx.Tracer` does (``is_leaf``: which modules stay whole) while computing every value
    on ``inputs`` (``forward``'s parameter name → the example's value). Where Python needs a traced value as a
    truth value, a number or a length, the example's is used and the decision kept in :attr:`decisions`."""

    def __init__(self, is_leaf: Callable[[nn.Module, str], bool], inputs: Mapping[str, Any]) -> None:
        super().__init__()
        self._is_leaf = is_leaf
        self.inputs = dict(inputs)
        self.decisions: list[str] = []
        self._evaluating = 0
        self._shadow: nn.Module | None = None

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        """The graph of ``root`` (an ``nn.Module``); its values are computed on a copy in eval mode: the model's
        buffers (a BatchNorm's running statistics) stay as they are."""
        self._shadow = copy.deepcopy(root).eval() if isinstance(root, nn.Module) else None
        try:
            return super().trace(root, concrete_args)
        finally:
            self._shadow = None

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return self._is_leaf(m, module_qualified_name)

    def create_proxy(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     name: str | None = None, type_expr: Any | None = None,
                     proxy_factory_fn: Callable[[fx.Node], fx.Proxy] | None = None) -> fx.Proxy:
        value = self._evaluate(kind, target, args, kwargs)
        data = _reads_data(kind, target, args, kwargs)
        return super().create_proxy(kind, target, args, kwargs, name, type_expr,
                                    proxy_factory_fn=lambda node: ConcreteProxy(node, self, value, data))

    def _evaluate(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kind == "placeholder":  # a parameter the example feeds, or one fixed at its default (args holds it)
            return self.inputs[target] if target in self.inputs else (args[0] if args else None)
        if kind == "output":
            return None
        a, k = map_aggregate((args, kwargs), value_of)
        self._evaluating += 1
        try:
            with torch.no_grad():
                if kind == "call_function":
                    return target(*a, **k)
                if kind == "call_method":
                    return getattr(a[0], target)(*a[1:], **k)
                if kind == "call_module":
                    return self._shadow.get_submodule(target)(*a, **k)  # type: ignore[union-attr]
                if kind == "get_attr":  # the copy's, or a constant the trace set on the root
                    return _attribute(self._shadow, target) if _has(self._shadow, target) else \
                        _attribute(self.root, target)
        finally:
            self._evaluating -= 1
        raise ValueError(f"unknown node kind {kind!r}")

    # while a value is computed, modules and attributes are the real ones, not recorded
    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        if self._evaluating:
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._evaluating:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def to_bool(self, obj: fx.Proxy) -> bool:
        return self.decide(obj, bool(value_of(obj)), "bool")

    def iter(self, obj: fx.Proxy) -> Iterator[Any]:
        n = self.decide(obj, len(value_of(obj)), "len")
        return iter([obj[i] for i in range(n)])

    def keys(self, obj: fx.Proxy) -> Any:
        return value_of(obj).keys()

    def decide(self, obj: fx.Proxy, value: Any, how: str) -> Any:
        """Record that Python took ``value`` (``how``: bool, int, float, len) for ``obj`` where the model's code
        needed it, and return it. A value that depends on tensor values is refused (``TraceError``): the branch
        would hold for the example only; a length of a tensor is its size, which may be decided."""
        if reads_data(obj) and not (how == "len" and isinstance(value_of(obj), torch.Tensor)):
            raise fx.proxy.TraceError(f"the model's code decides on the values of a tensor ({how} of "
                                      f"{getattr(obj, 'node', obj)} at {_user_frame()}): data-dependent control flow")
        self.decisions.append(f"{_user_frame()}: {how} = {value!r}")
        return value


def _reads_data(kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a new node's value depends on tensor values: inputs and the model's own tensors do; reading a size
    does not; anything else does when one of its operands does."""
    if kind in ("placeholder", "get_attr"):
        return True
    if (kind == "call_function" and target is getattr and len(args) > 1 and args[1] in SIZES) or \
            (kind == "call_method" and target in SIZES) or (kind == "call_function" and target is torch.numel):
        return False
    found: list[bool] = []
    map_aggregate((args, kwargs), lambda a: found.append(reads_data(a)))
    return any(found)


def _attribute(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _has(obj: Any, path: str) -> bool:
    try:
        _attribute(obj, path)
    except AttributeError:
        return False
    return True


def _user_frame() -> str:
    """``file.py:line`` of the innermost frame outside torch and this package: the model's code that decided."""
    skip = (Path(torch.__file__).resolve().parent, Path(__file__).resolve().parents[2])
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if not any(path.is_relative_to(d) for d in skip):
            name = frame.filename.rpartition("site-packages/")[2] if "site-packages/" in frame.filename else path.name
            return f"{name}:{frame.lineno}"
    return "?"


def example_inputs(root: nn.Module, args: tuple[Any, ...]) -> dict[str, Any]:
    """``forward``'s parameter name → a copy of the example's value (the graph's computation may write in place)."""
    bound = inspect.signature(root.forward).bind_partial(*args)
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in bound.arguments.items()}
