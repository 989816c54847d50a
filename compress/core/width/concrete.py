"""A torch.fx tracer that carries example values, for a model whose own ``forward`` branches on sizes.

A Hugging Face model checks what it is given before it computes: ViT compares ``pixel_values.dtype`` with its
weights', Whisper's encoder ``input_features.shape[-1]`` with the length it was built for, GPT-2's mask code the batch
size with its positions'. Plain torch.fx cannot decide such a test (a traced value has no truth value) and stops.
Here every traced value also holds its values on three examples, computed as the graph is recorded: **lane A**, a
batch of 2, **lane B**, a batch of 7 of other rows, and **lane C**, a batch of 2 of other rows. Where Python needs a
traced value as a truth value, a number or a length, lane A's is taken and the decision recorded (``file:line``, the
value), after three checks:

- a value that depends on the **values** of a tensor (``if x.mean() > 0``, ``.item()``) is refused: the branch would
  hold for the example only; so is a size that depends on them (``len(torch.nonzero(x))``, or any shape that
  differs between lanes A and C);
- a value that differs between the lanes depends on the **batch size** (or on the data): refused as a number
  (``range(x.size(0))`` would fix the graph at one batch size), and as a truth value unless it compares the batch size
  with 0 or 1 (``batch_size != 1``, the same for every batch of 2 or more; a batch of one is checked on its own by
  :func:`minreal.compress.core.width.tracing.trace`) or two batch sizes with each other, and even so where it comes
  from a call whose sizes the trace does not see (a layer kept whole, a ``torch.fx.wrap``-ped function): a filter
  in there that keeps every calibration row returns a count that looks like the batch size in every lane;
- anything else (a length, a channel count, a dtype: the same in both lanes) is decided as the example's and listed in
  the report, a comparison with the sizes it compared (``12 > 8 = True``: the record differs at another length even
  where the outcome does not): the graph is the model's computation on inputs shaped like the example, at any batch
  size (:func:`minreal.compress.core.width.tracing.require_decisions_hold` checks it at another length).

A size that merely coincides at batches 2 and 7 (``b % 5``) is not seen: the trace also checks the graph's outputs
against the model's on batches of 3 and 1.
"""

from __future__ import annotations

import copy
import functools
import inspect
import io
import itertools
import operator
import textwrap
import tokenize
import traceback
import weakref
from collections.abc import Callable, Collection, ItemsView, Iterator, KeysView, Mapping, ValuesView
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.fx.node import map_aggregate

__all__ = ["ConcreteTracer", "ConcreteProxy", "LANE_BATCHES", "frame_name", "lane_inputs", "user_frame", "value_of"]

LANE_BATCHES = (2, 7, 2)
"""The batch sizes of lanes A, B and C: A and B far apart, neither 1 (which code often special-cases); C has A's batch
size and other rows, so that a shape that differs between A and C is sized by the data."""

METADATA = frozenset({"shape", "size", "dim", "numel", "ndimension", "nelement", "ndim", "dtype", "device", "layout",
                      "is_cuda", "is_sparse", "is_quantized", "is_meta", "is_floating_point", "is_complex",
                      "requires_grad", "is_contiguous"})
"""Attributes and methods of a tensor that read what it is (sizes, dtype, device), not its values."""

RAGGED = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount", "nms",
                    "batched_nms"})

SIZED = frozenset({"view", "reshape", "expand", "repeat", "narrow", "new_zeros", "new_ones", "new_empty", "new_full",
                   "zeros", "ones", "empty", "full", "arange", "split", "tensor_split", "unflatten", "pad",
                   "interpolate"})
"""Operations that take sizes as arguments: given a size computed from tensor values, their result is ragged."""
"""Operations whose result's size depends on the values of their input."""

TRACED_PACKAGES = frozenset({"torch", "torchvision", "_operator", "operator", "builtins", "math"})
"""Where the functions a graph calls come from when their sizes are known: torch's operations, Python's operators
and torchvision's wrapped operators (``stochastic_depth`` keeps its input's size; ``nms`` is :data:`RAGGED`).
Anything else the graph calls was wrapped whole by the model's code (``torch.fx.wrap``), its sizes unseen."""

COMPARISONS = {operator.eq: "==", operator.ne: "!=", operator.gt: ">", operator.ge: ">=", operator.lt: "<",
               operator.le: "<="}


def value_of(x: Any, lane: int = 0) -> Any:
    """A traced value's value in ``lane`` (0: A, 1: B); anything else as it is."""
    if isinstance(x, ConcreteProxy):
        return x._lanes[lane]
    if isinstance(x, fx.proxy.Attribute):
        return getattr(value_of(x.root, lane), x.attr)
    return x


def _flag(x: Any, name: str) -> bool:
    """A traced value's flag (``data``, ``ragged``, ``varies``); an attribute of one reads the root's (a size read
    from a tensor is not data, unless the tensor is ragged)."""
    if isinstance(x, ConcreteProxy):
        return getattr(x, f"_{name}")
    if isinstance(x, fx.proxy.Attribute):
        if x.attr in METADATA and name == "data":
            return _flag(x.root, "ragged")
        if name == "varies":
            return not _same(value_of(x, 0), value_of(x, 1), _flag(x, "data")) or \
                (x.attr not in METADATA and _flag(x.root, "varies"))
        return _flag(x.root, name)
    return False


def _source(x: Any) -> str:
    """The call kept whole that a traced value comes from (its :class:`ConcreteProxy`'s ``opaque``), "" if none."""
    if isinstance(x, fx.proxy.Attribute):
        return _source(x.root)
    return x._opaque if isinstance(x, ConcreteProxy) else ""


class ConcreteProxy(fx.Proxy):
    """A traced value, its values in lanes A and B, and four flags: ``data`` (it depends on the values of a
    tensor), ``ragged`` (its size does), ``varies`` (it differs between the lanes: the batch size) and ``opaque``
    (the name of a layer or function kept whole that it comes from, whose sizes are not seen: "" if none)."""

    def __init__(self, node: fx.Node, tracer: ConcreteTracer, values: tuple[Any, ...], data: bool, ragged: bool,
                 varies: bool, opaque: str = "") -> None:
        super().__init__(node, tracer)  # private names: a model reads its own ``.values`` and ``.data``
        self._lanes, self._data, self._ragged, self._varies = values, data, ragged, varies
        self._opaque = opaque

    def __getattr__(self, k: str) -> Any:
        if k == "dtype" and isinstance(self._lanes[0], torch.Tensor):  # torch.finfo(x.dtype) needs a real one
            return self.tracer.decide(self, "dtype")  # type: ignore[attr-defined]
        if k.startswith("__") and k.endswith("__") and not hasattr(self._lanes[0], k):
            raise AttributeError(k)  # a probe (``__cuda_array_interface__``) answered as the value would
        return super().__getattr__(k)

    def __len__(self) -> int:
        return self.tracer.decide(self, "len")  # type: ignore[attr-defined]

    def __index__(self) -> int:
        return self.tracer.decide(self, "int")  # type: ignore[attr-defined]

    def __int__(self) -> int:
        return self.tracer.decide(self, "int")  # type: ignore[attr-defined]

    def __float__(self) -> float:
        return self.tracer.decide(self, "float")  # type: ignore[attr-defined]


def built_inline(tracer: fx.Tracer, m: nn.Module) -> bool:
    """Whether ``m`` is a layer without parameters or buffers that the model builds inside its ``forward`` (Hugging
    Face's DistilBERT classifier: ``nn.ReLU()(pooled)``), not one of the traced root's submodules: torch.fx refuses
    it ("module is not installed as a submodule"); its ``forward`` is traced through instead, as the function it
    calls. One with parameters stays refused (a layer made anew at every call), and so does one in training mode
    whose class reads ``training`` anywhere in its code or its bases' (a new layer is in training mode and
    ``model.eval()`` does not reach it: dropout, ``nn.RReLU``, a subclass calling ``super().forward``, a helper
    method branching on it), except a dropout of probability 0 (the identity)."""
    paths = getattr(tracer, "submodule_paths", None)
    if paths is None or m in paths or next(itertools.chain(m.parameters(), m.buffers()), None) is not None:
        return False
    if isinstance(m, nn.modules.dropout._DropoutNd) and m.p == 0:
        return True
    return not m.training or not _reads_training(type(m))


@functools.lru_cache(maxsize=256)
def _reads_training(cls: type) -> bool:
    """Whether the code of ``cls`` or of a base below ``nn.Module`` names ``training`` (as code: a docstring or a
    comment saying "pretraining" does not count); a class whose source cannot be read is assumed to."""
    for base in cls.__mro__:
        if base in (nn.Module, object):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(base))
            tokens = tokenize.generate_tokens(io.StringIO(source).readline)
            names = {t.string for t in tokens if t.type == tokenize.NAME}
        except (OSError, TypeError, tokenize.TokenError, SyntaxError, IndentationError):
            return True
        if "training" in names:
            return True
    return False


class ConcreteTracer(fx.Tracer):
    """Records the graph as :class:`torch.fx.Tracer` does (``is_leaf``: which modules stay whole) while computing every
    value on ``inputs`` (three lanes, each ``forward``'s parameter name → its value; see :func:`lane_inputs`); Python's
    decisions on traced values are checked and kept in :attr:`decisions`. ``untraced``: the module classes kept whole
    because torch.fx cannot trace them, whose results' sizes the trace does not see (a layer kept whole for keeping
    its torch ``forward``, a subclass of ``nn.Linear``, has known sizes)."""

    def __init__(self, is_leaf: Callable[[nn.Module, str], bool], inputs: tuple[Mapping[str, Any], ...],
                 untraced: Collection[type] = ()) -> None:
        super().__init__()
        self._is_leaf = is_leaf
        self._untraced = frozenset(untraced)
        self.inputs = tuple(dict(lane) for lane in inputs)
        self.decisions: list[str] = []
        self._evaluating = 0
        self._shadow: nn.Module | None = None
        self._numbers: dict[fx.Node, tuple[Any, Any]] = {}  # the lane values of traced numbers (not tensors)
        self._proxies: weakref.WeakSet[ConcreteProxy] = weakref.WeakSet()
        self._by_node: dict[fx.Node, ConcreteProxy] = {}  # while tracing: each node's proxy

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        """The graph of ``root`` (an ``nn.Module``). Values are computed on a copy in eval mode that shares the
        parameters: the model's buffers (a BatchNorm's running statistics) stay as they are."""
        if isinstance(root, nn.Module):
            self._shadow = copy.deepcopy(root, memo={id(p): p for p in root.parameters()}).eval()
        try:
            return super().trace(root, concrete_args)
        finally:  # a proxy kept past the trace (an lru_cache of the model's code) holds no values, no copy
            for proxy in self._proxies:
                proxy._lanes = (None,) * len(proxy._lanes)
            self._shadow, self._numbers, self._proxies, self.inputs = None, {}, weakref.WeakSet(), ()
            self._by_node, self.root = {}, None  # type: ignore[assignment]

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return self._is_leaf(m, module_qualified_name)

    def create_proxy(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     name: str | None = None, type_expr: Any | None = None,
                     proxy_factory_fn: Callable[[fx.Node], fx.Proxy] | None = None) -> fx.Proxy:
        values = tuple(self._evaluate(kind, target, args, kwargs, lane) for lane in range(len(self.inputs)))
        data, ragged, varies = _flags(kind, target, args, kwargs, values)
        opaque = self._kept_whole(kind, target) or _opaque_operand(args, kwargs)
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn=lambda node:
                                     ConcreteProxy(node, self, values, data, ragged, varies, opaque))
        if all(_is_number(v) for v in values):
            self._numbers[proxy.node] = values[:2]
        self._proxies.add(proxy)  # type: ignore[arg-type]
        self._by_node[proxy.node] = proxy  # type: ignore[assignment]
        return proxy

    def _kept_whole(self, kind: str, target: Any) -> str:
        """The name of a call whose result's sizes the trace does not see (a layer of an ``untraced`` class, a
        function the model's code wrapped with ``torch.fx.wrap``), "" for any other: the rows such a call returns may
        be a count set by the data (a filter's), which lanes of alike rows cannot tell from the batch size."""
        if kind == "call_module":
            cls = type(self._shadow.get_submodule(target)) if self._shadow is not None else None
            return f"{target} ({cls.__name__})" if cls in self._untraced else ""
        if kind == "call_function":
            package = (getattr(target, "__module__", None) or "torch").split(".")[0]
            return "" if package in TRACED_PACKAGES else getattr(target, "__name__", repr(target))
        return ""

    def _evaluate(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], lane: int) -> Any:
        if kind == "placeholder":  # a parameter the example feeds, or one fixed at its default (args holds it)
            return self.inputs[lane][target] if target in self.inputs[lane] else (args[0] if args else None)
        if kind == "output":
            return None
        a, k = map_aggregate((args, kwargs), lambda v: value_of(v, lane))
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
        if self._evaluating or built_inline(self, m):
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._evaluating:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def to_bool(self, obj: fx.Proxy) -> bool:
        return self.decide(obj, "bool")

    def iter(self, obj: fx.Proxy) -> Iterator[Any]:
        value = value_of(obj)
        if isinstance(value, Mapping):  # a dict's keys are what the code wrote, not traced values
            return iter(list(value.keys()))
        node = getattr(obj, "node", None)
        if isinstance(value, (KeysView, ValuesView, ItemsView)) and node is not None and node.op == "call_method" \
                and node.args and node.args[0] in self._by_node:  # ``out.items()`` of a traced dict: its own keys
            owner = self._by_node[node.args[0]]
            keys = list(value_of(owner).keys())
            if node.target == "keys":
                return iter(keys)
            return iter([owner[k] for k in keys] if node.target == "values" else [(k, owner[k]) for k in keys])
        return iter([obj[i] for i in range(self.decide(obj, "len"))])

    def keys(self, obj: fx.Proxy) -> Any:
        return value_of(obj).keys()

    def decide(self, obj: fx.Proxy, how: str) -> Any:
        """Lane A's ``how`` (``bool``, ``int``, ``float``, ``len``, ``dtype``) of ``obj``, where the model's code needs
        it as a Python value; recorded. Raises ``TraceError`` (one line) for a decision on tensor values, on a size that
        depends on them, or on the batch size (see the module's docstring)."""
        where = _user_frame()
        cast = {"bool": bool, "int": operator.index, "float": float, "len": len, "dtype": _dtype}[how]
        a, b = cast(value_of(obj, 0)), cast(value_of(obj, 1))
        label = how  # a dtype is what the tensor is, not its values: the graph holds the example's
        if how in ("bool", "int", "float"):  # the sizes it rests on: a threshold shows at another length
            rests = _compared(obj, self._numbers)
            label = f"{how}({rests})" if rests and (how == "bool" or _is_comparison(obj.node)) else how
        if how == "len" and _flag(obj, "ragged"):
            raise fx.proxy.TraceError("the model's code takes a size that depends on the values of a tensor (len): "
                                      "data-dependent control flow")
        if how in ("bool", "int", "float") and _flag(obj, "data"):
            raise fx.proxy.TraceError(f"the model's code decides on the values of a tensor ({how}): data-dependent "
                                      "control flow")
        if a != b if how in ("len", "dtype") else _flag(obj, "varies"):
            label = _batch_comparison(obj, self._numbers) if how == "bool" and a == b else ""
            if label and (source := _source(obj)):
                raise fx.proxy.TraceError(
                    f"the model's code decides on a size that comes from {source}, kept whole ({label}): a count it "
                    "sets from the data (the rows a filter keeps) cannot be told from the batch size")
            if not label:
                raise fx.proxy.TraceError(
                    f"the model's code takes the batch size as a Python {'condition' if how == 'bool' else 'number'} "
                    f"({how}: {a!r} at a batch of {LANE_BATCHES[0]}, {b!r} at {LANE_BATCHES[1]}): the graph would "
                    "hold for one batch size")
        self.decisions.append(f"{where}: {label} = {a!r}")
        return a


def _opaque_operand(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The first ``opaque`` flag among the operands (see :class:`ConcreteProxy`), "" if none."""
    operands: list[Any] = []
    map_aggregate((args, kwargs), operands.append)
    return next((source for a in operands if (source := _source(a))), "")


def _compared(obj: Any, numbers: Mapping[fx.Node, tuple[Any, Any]]) -> str:
    """What a decision on ``obj`` rests on, for its record: ``"a OP b"`` (lane A's values) where ``obj`` compares two
    traced numbers or sizes (``32 > 8``: the same outcome at another length, on other sizes), the number itself
    where it is one (the truth of ``T - 8``); "" where the outcome alone says it: equal sizes compared (the same
    outcome wherever they stay equal), a size read from a tensor whose test comes out the same for every size of 1
    or more (``bool(T)``, ``T > 0``), or not a traced number."""
    node = getattr(obj, "node", None)
    if node is None:
        return ""
    if _is_comparison(node):
        lanes = _comparison_lanes(node, numbers)
        if lanes is None:
            return ""
        (a, _), (b, _) = lanes
        left, right = node.args
        if a == b or (_reads_size(left) and _same_for_every_size(node.target, b, True)) or \
                (_reads_size(right) and _same_for_every_size(node.target, a, False)):
            return ""
        return f"{a!r} {COMPARISONS[node.target]} {b!r}"
    return repr(numbers[node][0]) if node in numbers and not _reads_size(node) else ""


def _is_comparison(node: Any) -> bool:
    """Whether a graph node compares two operands (:data:`COMPARISONS`)."""
    return isinstance(node, fx.Node) and node.target in COMPARISONS and len(node.args) == 2 and not node.kwargs


def _comparison_lanes(node: Any, numbers: Mapping[fx.Node, tuple[Any, Any]]) -> list[tuple[Any, Any]] | None:
    """Lanes A's and B's values of both operands of a comparison node (a constant: itself twice); None where the
    node is not a comparison or an operand is not a traced number."""
    if not _is_comparison(node):
        return None
    lanes = [numbers.get(a) if isinstance(a, fx.Node) else (a, a) for a in node.args]
    return None if None in lanes else lanes  # type: ignore[return-value]


def _reads_size(node: Any) -> bool:
    """Whether a graph node reads one size of a tensor as it is (``x.shape[1]``, ``x.size(1)``), not computed."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method" and node.target == "size":
        return len(node.args) == 2
    if node.op != "call_function" or node.target is not operator.getitem or not isinstance(node.args[0], fx.Node):
        return False
    shape = node.args[0]
    return (shape.op == "call_function" and shape.target is getattr and shape.args[1] == "shape") or \
        (shape.op == "call_method" and shape.target == "size" and len(shape.args) == 1)


def _same_for_every_size(op: Any, constant: Any, size_left: bool) -> bool:
    """Whether a size compared with ``constant`` by ``op`` gives one outcome for every size of 1 or more."""
    if isinstance(constant, bool) or not isinstance(constant, (int, float)):
        return False
    if op in (operator.eq, operator.ne):
        return constant < 1 or constant != int(constant)
    outcome = (lambda n: op(n, constant)) if size_left else (lambda n: op(constant, n))
    return outcome(1) == outcome(1 << 62)


def _is_number(v: Any) -> bool:
    """A number or a tuple of numbers (a size): what :func:`_batch_comparison` reads."""
    return isinstance(v, (int, float)) or (isinstance(v, tuple) and all(isinstance(i, int) for i in v))


def _dtype(t: torch.Tensor) -> torch.dtype:
    return t.dtype


def _batch_comparison(obj: Any, numbers: Mapping[fx.Node, tuple[Any, Any]]) -> str:
    """``"batch size OP c"`` where ``obj`` compares the batch size (a number whose lane values are
    :data:`LANE_BATCHES`) with a number ``c`` ≤ 1 that does not vary (the same outcome at every batch of 2 or more),
    or two sizes equal in both lanes with each other by ``==``/``!=`` (``x.shape == y.shape``); "" otherwise.
    ``numbers``: the lane values of the traced numbers and sizes."""
    node = getattr(obj, "node", None)
    lanes = _comparison_lanes(node, numbers)
    if lanes is None:
        return ""
    batch = [pair == LANE_BATCHES[:2] for pair in lanes]  # type: ignore[comparison-overlap]
    op = COMPARISONS[node.target]
    (a0, a1), (c0, c1) = lanes  # type: ignore[misc]
    if node.target in (operator.eq, operator.ne) and a0 == c0 and a1 == c1:  # equal sizes in both lanes
        return f"batch size {op} batch size" if all(batch) else f"size {op} size"
    if any(batch):
        c0, c1 = lanes[1] if batch[0] else lanes[0]  # type: ignore[misc]
        if c0 == c1 and isinstance(c0, (int, float)) and not isinstance(c0, bool) and c0 <= 1:
            return f"batch size {op} {c0}" if batch[0] else f"{c0} {op} batch size"
    return ""


def _flags(kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
           values: tuple[Any, ...]) -> tuple[bool, bool, bool]:
    """``data``, ``ragged`` and ``varies`` of a new node (see :class:`ConcreteProxy`): inputs and the model's own
    tensors are data; reading what a tensor is (its sizes, dtype) is not, unless its sizes depend on data. A result
    is ragged when an operand is, when its shape differs between lanes A and C (the same batch size, other rows), or
    when the operation sizes its result by values (:data:`RAGGED`, ``where`` of a condition alone,
    ``repeat_interleave`` by a tensor, a boolean mask as an index: seen even where the rows are alike). It varies
    when its values in lanes A and B differ (a tensor: in shape, or in values where they do not come from data) or an
    operand varies, except that reading a size (``x.shape``, ``x.shape[1]``) varies only where the sizes read
    differ."""
    operands: list[Any] = []
    map_aggregate((args, kwargs), operands.append)
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    reads_size = (kind == "call_function" and target is getattr and len(args) > 1 and args[1] in METADATA) or \
        (kind == "call_method" and target in METADATA) or (kind == "call_function" and target is torch.numel)
    ragged = any(_flag(a, "ragged") for a in operands) or name in RAGGED or _masks(target, args) or \
        _sized_by_values(name, target, args, kwargs) or \
        not _same(values[0], values[2]) or \
        (name == "where" and len(args) == 1 and not kwargs) or \
        (name == "repeat_interleave" and any(isinstance(value_of(a), torch.Tensor) for a in operands[1:]))
    if kind in ("placeholder", "get_attr"):
        data = True
    elif reads_size:
        data = _flag(args[0], "ragged")
    else:
        data = any(_flag(a, "data") for a in operands)
    by_size = reads_size or (target is operator.getitem and isinstance(value_of(args[0]), tuple))
    varies = not _same(values[0], values[1], data) or (not by_size and any(_flag(a, "varies") for a in operands))
    return data, ragged, varies


def _sized_by_values(name: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a size computed from tensor values (``n = mask.sum(-1).max()``) sizes the result: as a slice bound
    (``ids[:, :n]``) or a size argument of :data:`SIZED`."""
    if target is operator.getitem and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        bounds = [b for i in index if isinstance(i, slice) for b in (i.start, i.stop, i.step)]
        return any(_flag(b, "data") for b in bounds)
    if name not in SIZED:
        return False
    sizes: list[Any] = []
    map_aggregate((args[1:] if args and isinstance(value_of(args[0]), torch.Tensor) else args, kwargs), sizes.append)
    return any(_flag(a, "data") and (not isinstance(v := value_of(a), torch.Tensor) or v.ndim == 0) for a in sizes)


def _masks(target: Any, args: tuple[Any, ...]) -> bool:
    """Whether ``target(*args)`` indexes with a boolean tensor (``x[mask]``: as many rows as the mask has True)."""
    if target is not operator.getitem or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(v := value_of(i), torch.Tensor) and v.dtype == torch.bool for i in index)


def _same(a: Any, b: Any, data: bool = True) -> bool:
    """Whether two lane values agree: tensors in shape (and in values where they do not come from ``data``: a tensor
    built from sizes), containers item by item, anything else by ``==``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape):
            return False
        return data or torch.equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y, data) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], data) for k in a)
    try:
        return bool(a == b)
    except Exception:  # an object without a plain equality: taken as the same
        return True


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


def user_frame(frames: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    """The innermost of ``frames`` outside torch and ``minreal.compress``: the model's own code; None if none."""
    skip = (Path(torch.__file__).resolve().parent, Path(__file__).resolve().parents[2])
    return next((f for f in reversed(frames)
                 if not any(Path(f.filename).resolve().is_relative_to(d) for d in skip)), None)


def frame_name(frame: traceback.FrameSummary) -> str:
    """``file.py:line``, the path from its package folder where installed."""
    name = frame.filename.rpartition("site-packages/")[2] if "site-packages/" in frame.filename else \
        Path(frame.filename).name
    return f"{name}:{frame.lineno}"


def _user_frame() -> str:
    """``file.py:line`` of the model's code that is deciding now."""
    frame = user_frame(traceback.extract_stack())
    return frame_name(frame) if frame is not None else "?"


def lane_inputs(root: nn.Module, lanes: tuple[tuple[Any, ...], ...]) -> tuple[dict[str, Any], ...]:
    """Per lane, ``forward``'s parameter name (``*name`` for a ``*args`` parameter, as torch.fx names it) → a copy of
    the lane's value (the graph's computation may write in place)."""
    sig = inspect.signature(root.forward)
    out = []
    for args in lanes:
        bound = sig.bind_partial(*args).arguments
        star = {p.name for p in sig.parameters.values() if p.kind is p.VAR_POSITIONAL}
        out.append({("*" + k if k in star else k): _copied(v) for k, v in bound.items()})
    return tuple(out)


def _copied(v: Any) -> Any:
    return map_aggregate(v, lambda t: t.clone() if isinstance(t, torch.Tensor) else t)
