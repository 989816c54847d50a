"""Tracing a model for the width analysis: a :mod:`torch.fx` graph of a copy of it with shapes propagated.

``torch.nn`` layers (and subclasses that keep their ``forward``) stay whole as ``call_module`` nodes; user code
such as a ResNet's option-A shortcut lambda is traced through. A submodule torch.fx cannot trace through (a
Hugging Face attention layer's shape arithmetic), or whose traced graph fails where the module itself runs
(torchvision's 3-D Swin attention), is kept whole too, as one opaque layer whose channels stay as they are, and
tracing starts again (at most :data:`MAX_OPAQUE` classes, every instance of a class alike); a failure in the model's
own ``forward`` is refused. A ``torch.export`` program is refused: its layers are gone.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import itertools
import math
import re
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from ..errors import CompressionError
from ..evaluate import eval_mode
from ..inputs import Inputs, NamedInputs, args_of, call, repeat_to, sample_shapes, slice_axis
from .concrete import LANE_BATCHES, ConcreteTracer, built_inline, frame_name, lane_inputs, user_frame

__all__ = ["AXES_NOTE", "AXES_WARNING", "DECISIONS_NOTE", "trace", "trace_notes", "is_exported_program",
           "require_decisions_hold", "activation_batch", "FORWARD_BYTES", "BACKWARD_BYTES"]


FORWARD_BYTES = 256 * 2**20
"""What one batch's largest activation (a node's output) may take in a forward pass over a traced graph; several
such are alive at once, and values inside a layer or a fused op (attention's scores) are not seen. EfficientNet-B7
at 600×600 holds about 70 MB a sample in one tensor, so 128 samples would hold 9 GB each."""
BACKWARD_BYTES = 1024 * 2**20
"""What one batch's activations together may take in a pass that differentiates (autograd keeps them; views are
counted as copies, so this errs small)."""


def activation_batch(gm: fx.GraphModule, cap: int, backward: bool = False, copy_to: torch.dtype | None = None
                     ) -> int:
    """Samples per batch of a pass over a traced graph (scores, statistics): ``cap``, fewer where one batch's largest
    activation (all of them, for a pass that differentiates) would exceed :data:`FORWARD_BYTES`
    (:data:`BACKWARD_BYTES`); at least 1, also where one sample is over it. ``copy_to``: the pass also copies each
    value into that dtype (wanda's float64 sums). Per-sample sizes come from the trace's shapes, for the values that
    descend from the inputs (parameters, buffers and what only they make are no activations), the example's sample
    count being the first input's first axis; a graph without them keeps ``cap``."""
    nodes = list(gm.graph.nodes)
    inputs = [n for n in nodes if n.op == "placeholder"]
    first = inputs[0].meta.get("tensor_meta") if inputs else None
    samples = first.shape[0] if hasattr(first, "shape") and len(first.shape) and first.shape[0] > 0 else 0
    batched, extra = set(inputs), copy_to.itemsize if copy_to is not None else 0
    sizes = []
    for n in nodes:
        if n not in batched and not any(a in batched for a in n.all_input_nodes):
            continue
        batched.add(n)
        m = n.meta.get("tensor_meta")
        if samples and hasattr(m, "shape") and hasattr(m, "dtype"):
            sizes.append(math.prod(m.shape) * (m.dtype.itemsize + extra) / samples)
    need = sum(sizes) if backward else max(sizes, default=0.0)
    budget = BACKWARD_BYTES if backward else FORWARD_BYTES
    return cap if need <= 0 else max(1, min(cap, int(budget // need)))


def is_exported_program(model: nn.Module) -> bool:
    """Whether ``model`` is a loaded ``torch.export`` program (``ExportedProgram.module()``): a graph of ATen
    operators in which the layers are gone."""
    return isinstance(model, fx.GraphModule) and any(
        n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) for n in model.graph.nodes)



DECISIONS_NOTE = "traced carrying example values, as the model's forward decides on sizes in Python"
"""How the report's note on a trace that fixed Python's decisions begins (the CLI prints it on the console)."""
AXES_NOTE = "dynamic axes besides the batch:"
"""How the note (and the refusal) of :func:`require_decisions_hold` begins."""
AXES_WARNING = "dynamic axes besides the batch, decisions that rest on them:"
"""How its note begins where decisions rest on those lengths and kept their outcome (the CLI says it as a warning)."""

MAX_OPAQUE = 8
"""How many module classes :func:`trace` may keep whole (opaque) before it gives up on a model."""


class _Tracer(fx.Tracer):
    """Keeps every ``torch.nn`` layer whole, a subclass defined elsewhere that keeps the layer's ``forward``
    included (torchvision's video ``Conv3DSimple(nn.Conv3d)``), and the ``opaque`` classes (modules torch.fx could
    not trace through, or whose graph did not replay them); other user modules are traced through."""

    def __init__(self, opaque: frozenset[type] = frozenset()) -> None:
        super().__init__()
        self.opaque = opaque

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return (super().is_leaf_module(m, module_qualified_name) or _keeps_layer_forward(m)
                or type(m) in self.opaque)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        if built_inline(self, m):
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)


def _keeps_layer_forward(m: nn.Module) -> bool:
    """Whether ``m``'s ``forward`` (and a convolution's ``_conv_forward``) is a ``torch.nn`` layer's own (not a
    container's, not ``nn.Module``'s): a subclass that changes only how the layer is built, whose parameters the
    width rules read as the layer's."""
    owners = [next(c for c in type(m).__mro__ if f in vars(c)) for f in ("forward", "_conv_forward")
              if hasattr(type(m), f)]
    return all(o.__module__.startswith("torch.nn.") for o in owners) and owners[0] not in (nn.Module, nn.Sequential)


def trace(model: nn.Module, example: torch.Tensor, values: bool = False) -> fx.GraphModule:
    """A :class:`torch.fx.GraphModule` of a deep copy of ``model`` with shapes propagated on ``example``; with
    ``values``, traced carrying example values from the start (see :mod:`.concrete`), not only where plain torch.fx
    fails in the model's own ``forward``.

    Raises CompressionError with one line when the model cannot be traced (data-dependent control flow) or its graph
    does not replay it, in its own ``forward`` or in more than :data:`MAX_OPAQUE` module classes.
    """
    if is_exported_program(model):
        raise CompressionError("width methods need the model's Python modules (an nn.Module built by its code, e.g. "
                               "file.py:factory or a torchvision name): a torch.export program (.pt2) holds ATen "
                               "operations, whose layers cannot be resized")
    with torch.random.fork_rng(devices=[]):  # a model that draws noise is run several times: the state stays
        return _traced(model, example, values)


def _traced(model: nn.Module, example: Inputs, values: bool) -> fx.GraphModule:
    """:func:`trace`'s work: trace (plainly, then with example values), replay, check."""
    root = copy.deepcopy(model)
    _open_root_forward(root)
    converted = _as_linear(root)
    state = _plain_state(root)  # tracing runs forward, which may keep values on the modules (a cache, a counter)
    opaque: dict[type, str] = {}
    fixed = _unfed_defaults(root, example)
    replayed = repeat_to(example, 2) if len(example) == 1 else example  # a batch of 2: the batch dimension is plain
    first: Exception | None = None  # the first replay failure: the one the refusal names
    # the lanes the values are computed on, from the start or once plain tracing failed, and where checked
    concrete, replayed = (_lanes(example), repeat_to(example, 3)) if values else (None, replayed)
    plain = ""  # plain tracing's failure, in words (its traceback would hold the first copy)
    while True:
        try:
            gm: fx.GraphModule | None = _graph(model, root, opaque, fixed, concrete, state)
        except _ModelUntraceable as failed:
            if concrete is not None and first is not None:  # a class kept whole for a replay failure: name that
                raise _unreplayable(model, replayed, first, len(opaque)) from None
            if concrete is not None:
                raise _untraceable(model, plain, _said(failed.exc)) from None
            plain, gm = _said(failed.exc), None
        if gm is None:  # the model's own forward decides on a traced value: trace a fresh copy again carrying
            root = state = None  # example values, every class open again (the first copy freed before), checked
            root = copy.deepcopy(model)  # on batches of 3 and 1 below
            _open_root_forward(root)
            _as_linear(root)
            state = _plain_state(root)
            concrete, replayed, first = _lanes(example), repeat_to(example, 3), None
            opaque.clear()
            continue
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                eval_mode(gm):  # a BatchNorm in training mode would update its statistics
            try:  # ShapeProp prints a traceback of its own on failure; the user gets the one line below
                ShapeProp(gm).propagate(*args_of(_fresh(replayed)))
                break
            except Exception as exc:
                first = first or exc
                failing = _replay_class(root, gm, exc, opaque)
                if failing is None or len(opaque) >= MAX_OPAQUE:
                    raise _unreplayable(model, replayed, first, len(opaque)) from None
                opaque[failing] = f"its traced graph does not replay: {_first_line(exc.__cause__ or exc)}"
    _restore(state)
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        _require_same_outputs(model, root, gm, replayed)
        if concrete is not None:
            _require_same_outputs(model, root, gm, example[:1])
    gm.meta["as_linear"] = converted
    return gm


def trace_notes(gm: fx.GraphModule) -> list[str]:
    """The report's words on how :func:`trace` read the model: layers converted, decisions fixed at the example."""
    notes = []
    if n := gm.meta.get("as_linear"):
        notes.append(f"{n} Hugging Face Conv1D layer(s) (GPT-2's linear layer, its weight stored [in, out]) traced as "
                     "the nn.Linear that computes the same: the compressed model holds nn.Linear layers there")
    if decisions := gm.meta.get("decisions"):
        shown = "; ".join(decisions[:3]) + (f"; {len(decisions) - 3} more" if len(decisions) > 3 else "")
        notes.append(f"{DECISIONS_NOTE}: {len(decisions)} decision(s) on sizes and dtypes fixed at the calibration "
                     f"data's ({shown}), on the batch size only where the same for every batch of 2 or more; the "
                     "graph was checked against the model on batches of 3 and 1: use the compressed model on inputs "
                     "of that shape and dtype, its weights in that dtype (any batch size); traced in eval mode "
                     "(dropout written in the traced code stays off in training)")
    return notes


def require_decisions_hold(model: nn.Module, example: Inputs, decisions: list[str],
                           axes: Mapping[str, Mapping[int, str]]) -> str:
    """Check that a graph traced with example values (:mod:`.concrete`) holds along the dynamic axes besides the
    batch (``axes``: ``{input: {axis: dimension name}}``, one tensor named ``"input"``) that the compressed model is
    to keep. ``decisions``: the trace's decisions on ``example`` (``meta["decisions"]``), each with the sizes it rests
    on (``file:line: bool(32 > 8) = True``).

    ``model`` is traced again with one dimension at a time at other lengths: half of it, for a threshold between
    them, and one less, whose remainder differs from the length's by every divisor (``T % 2``, ``T % 16`` agree at
    32 and 16, never at 32 and 31); a length under 4 grows by one instead, which does both. A decision that goes the
    other way there, or a path through other lines, raises CompressionError (one line, naming the first); so does a
    model that does not trace at half the length. One that does not trace at one less (a model for multiples of a
    patch or window) is not refused: the note says that length was not checked. Decisions that go the same way on
    other sizes (a guard ``T <= 64``, a threshold ``T > 8`` on every side of it) hold only while they keep that
    outcome: the note returned starts with :data:`AXES_WARNING` and names them. Otherwise no decision rests on
    those lengths and the graph holds at others. Returns "" when there is nothing to check."""
    dims = sorted({dim for per in axes.values() for dim in per.values() if dim != "batch"})
    if not decisions or not dims:
        return ""
    where = (f"{AXES_NOTE} {', '.join(dims)}: the trace fixed {len(decisions)} decision(s) on sizes at the "
             f"calibration data's shape ({_shapes(example)})")
    lengths, tried, untraced = _axis_lengths(example, axes), [], []
    moved: dict[str, tuple[list[str], list[str]]] = {}
    for dim in dims:
        n = lengths[dim]
        for length in ((n // 2, n - 1) if n >= 4 else (n + 1,)):
            other = _at_length(example, axes, dim, length)
            try:
                again = trace(model, other, values=True).meta["decisions"]
            except CompressionError as exc:
                fails = re.search(r"with the example's values it fails (.*); give a factory", str(exc))
                if fails and length == n - 1:  # the model itself fails there: that length is not checked
                    untraced.append(f"{dim} {length} (the model fails {fails.group(1)})")
                    continue
                raise CompressionError(f"{where}, and at another {dim} ({_shapes(other)}) the model does not trace: "
                                       f"it fails {fails.group(1) if fails else str(exc)}; keep that axis static") \
                    from None
            tried.append(f"{dim} {length}")
            for record, there in _compare_decisions(decisions, again, where, f"{dim} {n}", tried[-1]):
                at, elsewhere = moved.setdefault(record, ([], []))  # one decision may rest on several dimensions
                if f"{dim} {n}" not in at:
                    at.append(f"{dim} {n}")
                elsewhere.append(there)
    unchecked = (f"; not traced at {', '.join(untraced)}, so a size that agrees at the lengths tried only (such as "
                 "T % 2) is not seen" if untraced else "")
    if moved:
        named = [f"{record} at {', '.join(at)}, {', '.join(there)}" for record, (at, there) in moved.items()]
        return (f"{AXES_WARNING} {', '.join(dims)}: {len(moved)} of the trace's {len(decisions)} decision(s) "
                f"rest on sizes that change with them and went the same way at the lengths tried: the graph holds "
                f"only where they still do ({'; '.join(named[:3])}{'; ...' if len(named) > 3 else ''}){unchecked}")
    return (f"{where}; traced again at {', '.join(tried)}, every decision rests on the same sizes: none depends on "
            f"those lengths, and the graph holds at others{unchecked}")


def _compare_decisions(first: list[str], second: list[str], where: str, at: str, there: str
                       ) -> list[tuple[str, str]]:
    """The decisions of two traces, at ``at`` and at ``there`` (``"seq 12"``): raises CompressionError where one
    goes the other way or the path differs; returns the ones that went the same way on other sizes, each as its
    record and what it rested on there."""
    moved = []
    for a, b in itertools.zip_longest(first, second, fillvalue="nothing"):
        (line_a, _, said_a), (line_b, _, said_b) = a.partition(": "), b.partition(": ")
        if line_a != line_b or said_a.rpartition(" = ")[2] != said_b.rpartition(" = ")[2]:
            raise CompressionError(f"{where}, and decides otherwise at {there}: {a} at {at}, {b} at {there}; the "
                                   "compressed graph would hold at the calibration shape only: keep that axis static "
                                   "(calibrate at the length it will run at)")
        if said_a != said_b:
            moved.append((a, f"{said_b.rpartition(' = ')[0]} at {there}"))
    return moved


def _at_length(example: Inputs, axes: Mapping[str, Mapping[int, str]], dim: str, length: int) -> Inputs:
    """``example`` with every axis named ``dim`` cut to ``length``, or grown to it by repeating its last slice."""
    return slice_axis(example, {name: {axis: length for axis, d in per.items() if d == dim}
                                for name, per in axes.items()})


def _axis_lengths(example: Inputs, axes: Mapping[str, Mapping[int, str]]) -> dict[str, int]:
    """Each dynamic dimension's length in ``example`` (besides the batch); CompressionError, one line, for an input
    ``example`` does not have or an axis beyond its dimensions."""
    tensors = dict(example.items()) if isinstance(example, NamedInputs) else {"input": example}
    lengths = {}
    for name, per in axes.items():
        if name not in tensors:
            raise CompressionError(f"dynamic axes name the input {name!r}, which the data does not have (it has "
                                   f"{', '.join(tensors)})")
        for axis, dim in per.items():
            if not -tensors[name].dim() <= axis < tensors[name].dim():
                raise CompressionError(f"dynamic axis {dim} is axis {axis} of {name}, which has "
                                       f"{tensors[name].dim()} dimensions (the batch's included)")
            if dim != "batch":
                lengths[dim] = int(tensors[name].shape[axis])
    return lengths


def _as_linear(root: nn.Module) -> int:
    """Replace each Hugging Face ``Conv1D`` in ``root`` (GPT-2's linear layer: ``x @ W + b`` by ``addmm``, its weight
    stored ``[in, out]``) by the ``nn.Linear`` that computes the same (weight transposed), whose widths the rules
    know; a layer used in several places stays one layer. Returns how many were replaced."""
    made: dict[int, nn.Linear] = {}
    for name, m in list(root.named_modules(remove_duplicate=False)):
        if not (type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers.")
                and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2 and name):
            continue
        if id(m) not in made:
            w, b = m.weight, getattr(m, "bias", None)
            linear = nn.utils.skip_init(nn.Linear, w.shape[0], w.shape[1], bias=b is not None, device=w.device,
                                        dtype=w.dtype)  # no initialisation: the random state stays as it was
            linear.weight = nn.Parameter(w.detach().t().contiguous(), requires_grad=w.requires_grad)
            if b is not None:
                linear.bias = nn.Parameter(b.detach().clone(), requires_grad=b.requires_grad)
            made[id(m)] = linear.train(m.training)
        parent, _, attr = name.rpartition(".")
        setattr(root.get_submodule(parent), attr, made[id(m)])
    return len(made)


class _ModelUntraceable(Exception):
    """torch.fx failed in the model's own ``forward`` (or in more than :data:`MAX_OPAQUE` classes): ``exc``."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


def _graph(model: nn.Module, root: nn.Module, opaque: dict[type, str], fixed: dict[str, Any] | None,
           concrete: tuple[Inputs, ...] | None, state: dict[nn.Module, dict[str, Any]]) -> fx.GraphModule:
    """Trace ``root``, keeping whole the ``opaque`` classes and each further class whose ``forward`` torch.fx fails
    in (added to ``opaque``, at most :data:`MAX_OPAQUE` in all); in the mode ``model`` is in. With ``concrete`` (three
    lanes of inputs), every traced value carries its values on them and Python's decisions on sizes take lane A's
    (see :mod:`.concrete`); they are kept in ``meta["decisions"]``. Each try starts from the modules' ``state``.
    Raises :class:`_ModelUntraceable`."""
    while True:
        _restore(state)
        tracer: fx.Tracer = _Tracer(frozenset(opaque))
        if concrete is not None:
            tracer = ConcreteTracer(tracer.is_leaf_module, lane_inputs(root, tuple(args_of(c) for c in concrete)),
                                    untraced=opaque)
        try:
            with eval_mode(root) if concrete is not None else contextlib.nullcontext():  # the mode the checks use
                graph = tracer.trace(root, concrete_args=fixed)
            break
        except Exception as exc:
            failing = _failing_class(root, exc, opaque)
            if failing is None or len(opaque) >= MAX_OPAQUE:
                raise _ModelUntraceable(exc) from None
            opaque[failing] = _first_line(exc)
    gm = fx.GraphModule(root, graph, class_name=type(model).__name__)
    gm.meta["decisions"] = _distinct(tracer.decisions) if isinstance(tracer, ConcreteTracer) else []
    gm.meta["opaque"] = {cls.__name__: reason for cls, reason in opaque.items()}
    gm.meta["opaque_modules"] = sorted(n.target for n in gm.graph.nodes
                                       if n.op == "call_module" and type(gm.get_submodule(n.target)) in opaque)
    gm.meta["fixed_args"] = fixed or {}
    gm.eval() if not model.training else gm.train()
    return gm


_REGISTRIES = ("_parameters", "_buffers", "_modules")


def _plain_state(root: nn.Module) -> dict[nn.Module, dict[str, Any]]:
    """Each module's plain attributes (not its parameters, buffers or submodules; a dict, list or set copied), to put
    back before each trace and after the last: a forward that keeps a value on its module (``self.pos = ...`` on a
    first call, a cache dict) leaves a traced one there."""
    return {m: {k: copy.copy(v) if isinstance(v, (dict, list, set)) else v for k, v in vars(m).items()
                if k not in _REGISTRIES} for m in root.modules()}


def _restore(state: dict[nn.Module, dict[str, Any]]) -> None:
    for m, attributes in state.items():
        for k in [k for k in vars(m) if k not in _REGISTRIES and k not in attributes]:
            delattr(m, k)
        vars(m).update({k: copy.copy(v) if isinstance(v, (dict, list, set)) else v for k, v in attributes.items()})


def _fresh(x: Inputs) -> Inputs:
    """A copy of ``x`` (a forward that writes into its input leaves the caller's example as it was)."""
    return NamedInputs({n: t.clone() for n, t in x.items()}) if isinstance(x, NamedInputs) else x.clone()


def _lanes(example: Inputs) -> tuple[Inputs, ...]:
    """The concrete trace's lanes: batches of :data:`~.concrete.LANE_BATCHES` rows, lane A's from the example's
    first rows, lanes B's and C's from its later rows where it has more than one."""
    later = example[1:] if len(example) > 1 else example
    return repeat_to(example, LANE_BATCHES[0]), repeat_to(later, LANE_BATCHES[1]), repeat_to(later, LANE_BATCHES[2])


def _distinct(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0][:120]


def _replay_class(root: nn.Module, gm: fx.GraphModule, exc: BaseException, opaque: Mapping[type, str]) -> type | None:
    """The innermost module class, outside ``torch`` and not yet kept whole, within whose ``forward`` the graph's
    failing operation was traced (torchvision's 3-D Swin attention passes a list that its window-size function
    changes in place, which the graph holds immutable), to be kept whole on the next try; None when the operation
    lies in the model's own ``forward``. A failing call of a layer is charged to the module that calls it: the layer
    is a leaf already."""
    name = re.search(r"node=%(\w+)", str(exc))
    node = next((n for n in gm.graph.nodes if name and n.name == name.group(1)), None)
    if node is None:
        return None
    stack = (node.meta.get("nn_module_stack") or {}).values()
    paths = [entry[0] if isinstance(entry, tuple) else entry for entry in stack]  # (path, class) in torch 2.x
    if node.op == "call_module" and paths and paths[-1] == node.target:
        paths = paths[:-1]
    for path in reversed(paths):
        try:
            cls = type(root.get_submodule(str(path)))  # the graph holds only the called layers, in plain containers
        except AttributeError:
            continue
        if cls not in opaque and not cls.__module__.startswith("torch."):
            return cls
    return None


def _require_same_outputs(model: nn.Module, root: nn.Module, gm: fx.GraphModule, example: Inputs) -> None:
    """Refuse a graph whose outputs are not the model's on ``example`` (both in eval mode, so that dropout and
    BatchNorm's batch statistics do not differ): code that tests a value's type (``isinstance(v, torch.Tensor)`` is
    false for torch.fx's Proxy) can drop outputs from the trace, which then returns less than the model does (a
    Hugging Face wrapper's dict came back empty), and a value decided in Python at trace time is baked in."""
    from ..evaluate import eval_mode, flatten_outputs

    def run(m: nn.Module) -> list[torch.Tensor]:  # the same random numbers for both (a model sampling noise)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return flatten_outputs(call(m, _fresh(example)), skip_other=True)  # a forward may write its inputs

    with eval_mode(root), eval_mode(gm):  # the model's second call: one that keeps a value on its first call (a
        run(root)                         # cache) computes as it will from then on, and a counter shows
        own, got = run(root), run(gm)
    on = f"on the example (a batch of {len(example)}"
    decided = gm.meta.get("decisions")
    fixed = f"; the trace fixed {len(decided)} decision(s) at a batch of {LANE_BATCHES[0]}" if decided else ""
    if [tuple(t.shape) for t in own] != [tuple(t.shape) for t in got]:
        raise CompressionError(
            f"the torch.fx graph of {type(model).__name__} returns {len(got)} tensor(s) where the model returns "
            f"{len(own)} {on}{fixed}; shapes {[tuple(t.shape) for t in got][:4]} against "
            f"{[tuple(t.shape) for t in own][:4]}): its code tests what a value is (isinstance), which a traced value "
            "is not; use factorize, which needs no trace")
    for i, (a, b) in enumerate(zip(own, got)):  # the same operations in the same order: equal up to rounding
        if not a.is_floating_point() or not a.numel():
            continue
        finite = a[torch.isfinite(a)]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-5 * scale + 1e-30, equal_nan=True):
            raise CompressionError(
                f"the torch.fx graph of {type(model).__name__} computes other values than the model {on}{fixed}; "
                f"output {i}: largest difference {float((a - b).nan_to_num().abs().max()):.3g}): its code decides "
                "something at trace time that it decides otherwise when it runs; use factorize, which needs no trace")


_CALLED, _DEFAULTS = "__minreal_decorated_forward", "__minreal_defaults"
"""The names :func:`_open_root_forward`'s generated ``forward`` calls the decorated one and reads defaults by."""


def _open_root_forward(root: nn.Module) -> bool:
    """Where ``root``'s ``forward`` is wrapped by a decorator and takes ``*args`` or ``**kwargs`` (transformers 5's
    ``@can_return_tuple`` on ``GPT2LMHeadModel.forward``), torch.fx cannot trace it as the root: it reads the
    unwrapped signature but patches the wrapper's code ("co_varnames is too small"). ``root``, a private copy, then
    becomes an instance of a subclass whose ``forward`` has the unwrapped function's named parameters, with their
    defaults, and calls the decorated ``forward`` with them: the same computation (the decorator still runs), in a
    signature torch.fx can trace. Returns whether it did."""
    cls = type(root)
    forward = getattr(cls, "forward", None)
    inner = inspect.unwrap(forward) if callable(forward) else None
    if inner is None or inner is forward:
        return False
    try:
        params = list(inspect.signature(inner).parameters.values())[1:]  # after self
    except (TypeError, ValueError):
        return False
    if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return False
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if any(p.name in ("self", _CALLED, _DEFAULTS) for p in named):  # the generated code's own names
        return False
    defaults = {p.name: p.default for p in named if p.default is not p.empty}
    head: list[str] = []
    for i, p in enumerate(named):
        if p.kind == p.KEYWORD_ONLY and (i == 0 or named[i - 1].kind != p.KEYWORD_ONLY):
            head.append("*")
        head.append(p.name + (f"={_DEFAULTS}[{p.name!r}]" if p.name in defaults else ""))
        if p.kind == p.POSITIONAL_ONLY and (i + 1 == len(named) or named[i + 1].kind != p.POSITIONAL_ONLY):
            head.append("/")
    passed = [p.name if p.kind == p.POSITIONAL_ONLY else f"{p.name}={p.name}" for p in named]
    space: dict[str, Any] = {_DEFAULTS: defaults, _CALLED: forward}
    exec(f"def forward(self, {', '.join(head)}):\n    return {_CALLED}(self, {', '.join(passed)})\n", space)
    opened = space["forward"]
    opened.__qualname__, opened.__doc__ = f"{cls.__qualname__}.forward", getattr(inner, "__doc__", None)
    root.__class__ = type(cls.__name__, (cls,), {"forward": opened, "__module__": cls.__module__})
    return True


def _unfed_defaults(root: nn.Module, example: Inputs) -> dict[str, Any] | None:
    """``forward``'s parameters the example does not feed, at their defaults (a Hugging Face wrapper's
    ``attention_mask=None``): traced as placeholders they would be tensors, and ``if attention_mask is not None``
    would take the branch the model never takes."""
    fed = len(args_of(example))
    try:
        params = list(inspect.signature(root.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    tensor = next((p.name for p in params if isinstance(p.default, torch.Tensor)), None)
    if tensor is not None:  # torch.fx writes it into the graph's code as a name it never defines
        raise CompressionError(f"{type(root).__name__}.forward's parameter {tensor!r} defaults to a tensor, which "
                               "torch.fx cannot trace; default it to None, or make the tensor a buffer of the model "
                               "(register_buffer)")
    rest = {p.name: p.default for p in params[fed:]  # None and scalars: fx cannot write a container as a default
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and (p.default is None or
                                                                        type(p.default) in (bool, int, float, str))}
    return rest or None


def _failing_class(root: nn.Module, exc: BaseException, opaque: Mapping[type, str]) -> type | None:
    """The class of the innermost submodule whose ``forward`` was running when tracing failed (a Hugging Face
    attention or embedding layer, whose shape arithmetic torch.fx cannot follow), to be kept whole on the next try;
    None when the failure lies in the model's own ``forward`` (or in a class already kept whole): nothing smaller
    than the model could be kept whole. Kept whole, a layer's channels are left as they are; the rest of the model
    (a transformer's MLP widths) can still be cut."""
    codes: dict[Any, type] = {}
    for m in root.modules():
        cls = type(m)
        forward = getattr(cls, "forward", None)
        if m is root or cls in opaque or cls.__module__.startswith("torch.") or forward is None:
            continue
        codes.setdefault(getattr(inspect.unwrap(forward), "__code__", None), cls)  # under its decorators
    frames = [frame.f_code for frame, _ in traceback.walk_tb(exc.__traceback__)]
    return next((codes[c] for c in reversed(frames) if c in codes), None)


def _said(exc: Exception) -> str:
    """`` at file.py:line (function): Error: first sentence`` of a tracing failure: where in the model's code (the
    innermost frame outside torch and this package) and torch's words."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    where = _model_frame(exc)
    return f"{f' at {where}' if where else ''}: {type(exc).__name__}: {first.split('. ')[0].rstrip('.')[:240]}"


def _untraceable(model: nn.Module, plain: str, again: str = "") -> CompressionError:
    """One line for a model torch.fx cannot trace: plain torch.fx's failure (:func:`_said`), and ``again``, that of
    the trace carrying example values, and what to do instead."""
    then = f"; with the example's values it fails{again}" if again and again != plain else ""
    why = " (Python control flow on a tensor)" if "TraceError" in plain else \
        (" (a layer the model's forward uses that is not one of its registered submodules, built inside forward or "
         "kept in a list or dict, with parameters or acting otherwise in training (dropout, a batch norm without "
         "running statistics); register it in __init__, as an attribute or in an nn.ModuleList, so that it is traced "
         "and model.eval() reaches it)") \
        if "not installed as a submodule" in plain else ""
    return CompressionError(
        f"width surgery needs a model torch.fx can trace; {type(model).__name__} cannot be traced{plain}{why}{then}; "
        "give a factory returning the part that traces (e.g. the backbone) or use factorize, which needs no trace")


def _unreplayable(model: nn.Module, example: Inputs, exc: Exception, kept: int = 0) -> CompressionError:
    """One line for a traced graph that fails where the model itself runs: the graph's operation (ShapeProp names it
    in its own wrapper), the underlying error's first sentence, and what to do instead; ``kept``: the module classes
    kept whole before giving up."""
    cause = exc.__cause__ or exc
    node = re.search(r"node=%(\w+)", str(exc))
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0].split(". ")[0].rstrip(".")
    after = f", even with {kept} module classes kept whole" if kept >= MAX_OPAQUE else ""
    return CompressionError(
        f"cannot run the traced {type(model).__name__} on an example input of shape {_shapes(example)}"
        f"{f' at its operation {node.group(1)}' if node else ''}: {type(cause).__name__}: {first[:160]} (torch.fx's "
        f"graph does not replay the model's code there{after}); use factorize, which needs no trace")


def _model_frame(exc: BaseException) -> str | None:
    """``file.py:line (function)`` of the innermost traceback frame in the model's own code; None when there is
    none."""
    frame = user_frame(traceback.extract_tb(exc.__traceback__))
    return f"{frame_name(frame)} ({frame.name})" if frame is not None else None


def _shapes(example: Inputs) -> str:
    return ", ".join(f"{n} {s}" for n, s in sample_shapes(example).items())
