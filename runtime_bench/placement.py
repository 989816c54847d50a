"""Where nodes actually run: each kernel's execution provider, read from onnxruntime's own profile.

onnxruntime silently places nodes its requested provider cannot run on the CPU. A profiled run records, for every
kernel of the optimised graph, the provider that ran it (``"cat": "Node"`` events named ``<node>_kernel_time``,
``args.provider`` and ``args.op_name``). :func:`parse_profile` turns those events into a :class:`Placement`
(pure: it takes the loaded JSON list); :func:`measure_placement` opens a separate profiled session and runs it
once, so profiling never slows the timed sessions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from minreal.facts import FLOAT_ATTENTION_OPS, INTEGER_KERNEL_OPS, PROVIDERS

from .inputs import ORT_SUFFIX, load_model_proto
from .sessions import create_session

if TYPE_CHECKING:  # imported where a graph is read (MAC counts), not when a timing worker imports this module
    import onnx

__all__ = [
    "PlacedNode",
    "Placement",
    "MAC_RULES",
    "COPY_OPS",
    "node_macs",
    "graph_macs",
    "parse_profile",
    "against_graph",
    "FUSING_PROVIDERS",
    "measure_placement",
    "measure_placements",
    "placement_from_dict",
    "describe_fallback",
]

Shape = Sequence[int]
MacRule = Callable[[Sequence[Shape | None], Sequence[Shape | None]], int | None]

#: Kernels onnxruntime inserts to copy tensors between devices: not nodes of the model, left out of the shares.
COPY_OPS: frozenset[str] = frozenset({"MemcpyFromHost", "MemcpyToHost"})
#: Ops that do hold MACs but have no rule here (integer kernels, recurrent, attention, transposed conv): a
#: placement with any of them reports its MAC share as unknown.
UNCOUNTED_OPS: frozenset[str] = INTEGER_KERNEL_OPS | FLOAT_ATTENTION_OPS | frozenset(
    {"ConvTranspose", "Einsum", "LSTM", "GRU", "RNN"}
)
#: onnxruntime contrib ops without MACs that CPU and CUDA graphs commonly hold (other non-ONNX op names, such as
#: a TensorRT engine's fused kernel, make the MAC share unknown).
MAC_FREE_CONTRIB_OPS: frozenset[str] = frozenset(
    {"ReorderInput", "ReorderOutput", "NhwcMaxPool", "BiasGelu", "FastGelu", "QuickGelu", "BiasAdd",
     "SkipLayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}
)
_KERNEL_SUFFIX = "_kernel_time"
#: Providers that run each subgraph they take as one fused kernel: their shares are counted against the graph.
FUSING_PROVIDERS: frozenset[str] = frozenset({PROVIDERS["tensorrt"]})


@dataclass(frozen=True)
class PlacedNode:
    """One kernel of the optimised graph: its node name, op type, provider and MACs (None: unknown)."""

    name: str
    op_type: str
    provider: str
    macs: int | None


@dataclass(frozen=True)
class Placement:
    """Share of a session's kernels (and of its MACs) that ran on the requested provider.

    ``nodes`` counts distinct kernels of the optimised graph, device copies (:data:`COPY_OPS`) excluded
    (``copies`` counts those); ``node_share`` is 1 for a graph with no kernels. ``macs``/``mac_share`` are
    None (unknown) when a kernel's MACs cannot be counted or the graph has no MAC-bearing kernel. ``fallback``
    lists the kernels that ran on another provider, in execution order.
    """

    requested: str
    nodes: int
    on_provider: int
    node_share: float
    macs: int | None
    mac_share: float | None
    copies: int
    fallback: tuple[PlacedNode, ...]


def _prod(shape: Shape) -> int:
    return math.prod(int(d) for d in shape)


def _at(shapes: Sequence[Shape | None], index: int) -> Shape | None:
    return shapes[index] if index < len(shapes) else None


def _conv(inputs: Sequence[Shape | None], outputs: Sequence[Shape | None]) -> int | None:
    """Every output element sums ``C/group * prod(kernel)`` products: ``prod(Y) * prod(W[1:])``."""
    y, w = _at(outputs, 0), _at(inputs, 1)
    return None if y is None or w is None or len(w) < 3 else _prod(y) * _prod(w[1:])


def _matmul(inputs: Sequence[Shape | None], outputs: Sequence[Shape | None]) -> int | None:
    """``prod(Y) * K``; K from A's last two dims over Y's rows, so a transposed A (FusedMatMul) counts alike."""
    a, y = _at(inputs, 0), _at(outputs, 0)
    if a is None or y is None or not a:
        return None
    if len(a) == 1 or len(y) < 2 or not y[-2]:
        return _prod(y) * int(a[-1])
    return _prod(y) * (_prod(a[-2:]) // int(y[-2]))


def _gemm(inputs: Sequence[Shape | None], outputs: Sequence[Shape | None]) -> int | None:
    """``M * N * K`` with ``K = prod(A) / M`` (A is ``[M, K]`` or, transposed, ``[K, M]``)."""
    a, y = _at(inputs, 0), _at(outputs, 0)
    if a is None or y is None or len(y) != 2 or not y[0]:
        return None
    return _prod(y) * (_prod(a) // int(y[0]))


#: Op type -> MACs from its input and output shapes (the float Conv/Gemm/MatMul kernels, fused forms included).
MAC_RULES: Mapping[str, MacRule] = {
    "Conv": _conv, "FusedConv": _conv, "NhwcConv": _conv,
    "Gemm": _gemm, "FusedGemm": _gemm,
    "MatMul": _matmul, "FusedMatMul": _matmul,
}  # fmt: skip


def node_macs(op_type: str, inputs: Sequence[Shape | None], outputs: Sequence[Shape | None]) -> int | None:
    """MACs of one kernel from its input/output shapes (None for an unknown shape): 0 for an op without MACs,
    None when the op may hold MACs this module cannot count (:data:`UNCOUNTED_OPS`, unrecognised op names)."""
    if op_type in MAC_RULES:
        return MAC_RULES[op_type](inputs, outputs)
    if op_type in UNCOUNTED_OPS:
        return None
    import onnx

    return 0 if op_type in MAC_FREE_CONTRIB_OPS or op_type in COPY_OPS or onnx.defs.has(op_type) else None


def graph_macs(path: Path, input_shapes: Mapping[str, Shape]) -> dict[str, int | None]:
    """MACs of the named Conv/Gemm/MatMul nodes of the model at ``path``, from onnx shape inference with its
    inputs fixed to ``input_shapes``; ``{}`` when shape inference fails. Only nodes onnxruntime did not rename
    while optimising match a profile's kernel names, so :func:`parse_profile` prefers the profile's own shapes. An
    ORT-format file (``.ort``), which the onnx package cannot read, gives ``{}`` too."""
    if Path(path).suffix == ORT_SUFFIX:
        return {}
    import onnx

    model = load_model_proto(Path(path))
    for value in model.graph.input:
        for dim, n in zip(value.type.tensor_type.shape.dim, input_shapes.get(value.name, ())):
            dim.dim_value = int(n)
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        return {}
    shapes: dict[str, Shape | None] = {v.name: _static(v) for v in (*graph.input, *graph.value_info, *graph.output)}
    shapes.update({t.name: list(t.dims) for t in graph.initializer})
    return {n.name: node_macs(n.op_type, [shapes.get(i) for i in n.input], [shapes.get(o) for o in n.output])
            for n in graph.node if n.name and n.op_type in MAC_RULES}


def _static(value: onnx.ValueInfoProto) -> Shape | None:
    """The dims of a tensor value when all are known numbers, else None."""
    tensor = value.type.tensor_type
    dims = tensor.shape.dim if tensor.HasField("shape") else None
    if dims is None or not all(d.HasField("dim_value") for d in dims):
        return None
    return [d.dim_value for d in dims]


def _event_shapes(args: Mapping[str, Any], key: str) -> list[Shape | None] | None:
    """Shapes from a profile event's ``input_type_shape``/``output_type_shape`` (``[{"float": [2, 8]}, ...]``)."""
    entries = args.get(key)
    if not isinstance(entries, list):
        return None
    return [next(iter(e.values()), None) if isinstance(e, dict) else None for e in entries]


def _kernel(event: Mapping[str, Any], graph: Mapping[str, int | None]) -> PlacedNode:
    args, name = event["args"], event["name"][: -len(_KERNEL_SUFFIX)]
    op = str(args.get("op_name", ""))
    inputs, outputs = _event_shapes(args, "input_type_shape"), _event_shapes(args, "output_type_shape")
    if inputs is None or outputs is None:
        macs = graph.get(name) if op in MAC_RULES else node_macs(op, [], [])
    else:
        macs = node_macs(op, inputs, outputs)
    return PlacedNode(name, op, str(args.get("provider", "")), macs)


def parse_profile(
    events: Sequence[Mapping[str, Any]], requested: str, graph: Mapping[str, int | None] | None = None
) -> Placement:
    """Placement of one session from its profile (the JSON list ``session.end_profiling()`` wrote).

    Kernels are the ``"cat": "Node"`` events named ``<node>_kernel_time``, each counted once (several runs,
    loop bodies). A kernel's MACs come from the shapes the profile recorded for it; without them, from
    ``graph`` (:func:`graph_macs`, keyed by node name).

    Parameters
    ----------
    events : Sequence[Mapping[str, Any]]
        The profile's events.
    requested : str
        Full name of the provider the session was asked for (``"CUDAExecutionProvider"``, ...).
    graph : Mapping[str, int | None] | None
        MACs per node name of the model's graph, for kernels whose event records no shapes.
    """
    kernels: dict[str, PlacedNode] = {}
    for event in events:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith(_KERNEL_SUFFIX):
            node = _kernel(event, graph or {})
            kernels.setdefault(node.name, node)
    model_nodes = [k for k in kernels.values() if k.op_type not in COPY_OPS]
    on = [k for k in model_nodes if k.provider == requested]
    macs = [k.macs for k in model_nodes]
    total = None if None in macs else sum(m for m in macs if m is not None)
    mac_share = None if not total else sum(k.macs or 0 for k in on) / total
    return Placement(
        requested=requested, nodes=len(model_nodes), on_provider=len(on),
        node_share=len(on) / len(model_nodes) if model_nodes else 1.0, macs=total or None, mac_share=mac_share,
        copies=len(kernels) - len(model_nodes), fallback=tuple(k for k in model_nodes if k.provider != requested),
    )


def measure_placement(
    path: Path, provider: str, threads: int | None, feeds: Mapping[str, np.ndarray],
    provider_options: Mapping[str, str] | None = None,
) -> Placement:
    """Run the model at ``path`` once in a separate, profiled session on ``provider`` and read its placement.

    The session has the timed sessions' options and graph (:func:`minreal.runtime_bench.sessions.create_session`, the
    same provider options) plus profiling; the profile is written to, and removed with, a temporary folder.

    Parameters
    ----------
    path : Path
        ONNX model file.
    provider : str
        Full execution-provider name.
    threads : int | None
        Intra-op threads (None: onnxruntime's default).
    feeds : Mapping[str, np.ndarray]
        Inputs by name for the one run.
    provider_options : Mapping[str, str] | None
        ONNX Runtime options of ``provider``, as the timed session had them.
    """
    with tempfile.TemporaryDirectory(prefix="minreal-profile-") as tmp:
        session = create_session(Path(path), provider, threads, provider_options=provider_options,
                                 profile_prefix=Path(tmp) / "profile")  # the timed sessions' options and graph
        session.run(None, dict(feeds))
        events = json.loads(Path(session.end_profiling()).read_text())
    shapes = {k: v.shape for k, v in feeds.items()}
    placement = parse_profile(events, provider)
    if placement.macs is None:  # the profile's shapes did not suffice; shape inference is the fallback
        placement = parse_profile(events, provider, graph_macs(path, shapes))
    if provider in FUSING_PROVIDERS:
        macs = graph_macs(path, shapes)
        total = None if not macs or None in macs.values() else sum(v for v in macs.values() if v)
        return against_graph(placement, len(load_model_proto(Path(path)).graph.node), total)
    return placement


def against_graph(placement: Placement, graph_nodes: int, graph_total_macs: int | None) -> Placement:
    """Shares of a provider that runs whole subgraphs as one kernel (a TensorRT engine), counted against the
    model's own graph: every ONNX node that did not fall back ran on the provider. ``graph_total_macs``: the
    graph's Conv/Gemm/MatMul MACs (None: unknown, so is the MAC share unless nothing fell back)."""
    on = max(graph_nodes - len(placement.fallback), 0)
    fallback_macs = [k.macs for k in placement.fallback]
    if not placement.fallback:
        mac_share = 1.0 if graph_total_macs else None
    elif graph_total_macs and None not in fallback_macs:
        mac_share = max(0.0, 1.0 - sum(m or 0 for m in fallback_macs) / graph_total_macs)
    else:
        mac_share = None
    return dataclasses.replace(placement, nodes=graph_nodes, on_provider=on,
                               node_share=on / graph_nodes if graph_nodes else 1.0, macs=graph_total_macs,
                               mac_share=mac_share)


def measure_placements(
    names: Sequence[str], paths: Sequence[str], provider: str, threads: int | None,
    feeds: Sequence[Mapping[str, np.ndarray]], provider_options: Sequence[Mapping[str, str]] = (),
) -> dict[str, dict[str, Any]]:
    """:func:`measure_placement` for each model (``provider_options`` per model, or none), as JSON-ready dicts by
    model name (a worker's result)."""
    options = list(provider_options) or [{} for _ in paths]
    return {name: asdict(measure_placement(Path(path), provider, threads, f, opts))
            for name, path, f, opts in zip(names, paths, feeds, options)}


def placement_from_dict(data: Mapping[str, Any]) -> Placement:
    """The :class:`Placement` that ``asdict`` turned into ``data``."""
    return Placement(**{**data, "fallback": tuple(PlacedNode(**n) for n in data["fallback"])})


def describe_fallback(placement: Placement, limit: int = 5) -> str:
    """The first ``limit`` kernels not on the requested provider, ``name (Op on Provider)``, and how many more;
    ``""`` when none fell back."""
    shown = [f"{n.name} ({n.op_type} on {n.provider})" for n in placement.fallback[:limit]]
    more = len(placement.fallback) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")
