"""Convolutions whose input channels are not a multiple of 4 widened to it with zero channels, so that ONNX Runtime's
x86 int8 convolution runs them on its fast symmetric kernel.

MLAS's symmetric int8 convolution (``MlasConvSymPackWSize`` in onnxruntime's ``core/mlas/lib/convsym.cpp``) takes an
ungrouped convolution only when its input channels are a multiple of 4; any other goes through im2col and a packed
GEMM. An RGB stem (3 input channels) is the common case: in the pretrained CIFAR ResNet-32's INT8 file it runs at
about 9 GMAC/s against about 80 for its 16→16 convolutions (``benchmarks/int8_width.json``, batch 32).

A zero input channel with zero weights changes no output: the widened convolution sums the same products, in float
and in int8 (the extra channel quantises to the zero point, whose contribution the kernel takes out with the
weights' column sums, which the zero weights leave unchanged; a per-channel weight scale is a maximum over each
output channel's weights, which zeros do not move). The extra channel comes from a ``Pad`` on the convolution's
input, which runs before the input is quantised when that input is the graph's (the stem), and on quantised tensors
otherwise (:func:`minreal.export.qdq_pads.integer_pads`). A widened convolution that a quantisation leaves in float
(accuracy control's fallbacks) is narrowed again (:func:`narrow_convs`): in float the zero channel only costs.

Measured (``benchmarks/int8_align.json``, both files timed in 20 fresh processes, both orders, on an AVX-512 VNNI
Xeon): the CIFAR ResNet-32's INT8 file runs 0.982x as long at batch 1 and 0.960x at batch 32 with its stem widened,
lower in 18 and 20 of 20 processes, with bit-identical outputs; the ``Pad`` takes back part of what the faster stem
saves. On by default for the x86 CPU targets (``QuantConfig.align_channels``); an AVX2-only CPU was not measured.

References
----------
.. [1] ONNX Runtime, ``core/mlas/lib/convsym.cpp`` (``MlasConvSymPackWSize``): the symmetric int8 convolution takes
       input channels in multiples of 4.
"""

from __future__ import annotations

import collections
import copy
import re
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["ALIGN", "align_conv_inputs", "channel_pads", "narrow_convs"]

#: Input channels of an ungrouped convolution are widened to a multiple of this (MLAS's x86 symmetric int8 kernel).
ALIGN = 4


def _group(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or ``name`` with the first free numeric suffix; recorded as taken."""
    out, i = name, 1
    while out in taken:
        out, i = f"{name}_{i}", i + 1
    taken.add(out)
    return out


def _subgraphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """``graph`` and every graph nested in its nodes' attributes (If, Loop, Scan bodies), recursively."""
    out = [graph]
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                out += _subgraphs(g)
    return out


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _fast_after(cout: int) -> bool:
    """Whether MLAS's x86 symmetric int8 kernel takes the widened convolution: at least 16 output channels and a
    multiple of 8 of them (AVX2 and AVX-VNNI; AVX-512 needs a multiple of 4)."""
    return cout >= 16 and cout % 8 == 0


def _set_weight(graph: onnx.GraphProto, w: onnx.TensorProto, value: np.ndarray, own: bool, suffix: str,
                taken: set[str]) -> str:
    """Give a convolution the weight ``value`` in place of ``w``: in ``w`` itself when the convolution is its only
    reader (``own``; the input channels of an initializer listed as a graph input, or inferred, follow), else in a
    new initializer named ``w``'s name plus ``suffix``. Returns the name the convolution reads."""
    if not own:
        name = _fresh(f"{w.name}{suffix}", taken)
        graph.initializer.append(numpy_helper.from_array(value, name))
        return name
    w.CopyFrom(numpy_helper.from_array(value, w.name))
    for info in (*graph.input, *graph.value_info):
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else ()
        if info.name == w.name and len(dims) > 1:
            dims[1].dim_value = value.shape[1]
    return w.name


def align_conv_inputs(model: onnx.ModelProto, multiple: int = ALIGN) -> list[str]:
    """Widen, in ``model``'s main graph (in place), every ungrouped ``Conv`` whose weight is an initializer with a
    channel count off ``multiple`` to the next multiple, where the widened convolution is one MLAS's symmetric
    kernel takes (:func:`_fast_after`; otherwise the ``Pad`` would buy nothing): zero input channels on its weight
    (in place under its name; a new initializer when anything else reads it) and a ``Pad`` of as many zero channels
    on its input, named ``<conv>_channel_pad`` and placed right before it. Nothing changes below opset 11 (``Pad``
    takes its pads as an attribute there) or for a weight kept in external data. Returns the names of the widened
    convolutions (else their outputs)."""
    graph = model.graph
    if _opset(model) < 11:
        return []
    weights = {t.name: t for t in graph.initializer}
    every = _subgraphs(graph)
    taken = {t.name for g in every for t in g.initializer} | {i.name for g in every for i in g.input} \
        | {v for g in every for n in g.node for v in (*n.input, *n.output, n.name)}
    uses = collections.Counter(v for g in every for n in g.node for v in n.input)
    uses.update(o.name for o in graph.output)
    nodes, done, replaced = [], [], set()
    for node in graph.node:
        w = weights.get(node.input[1]) if node.op_type == "Conv" and node.domain in ("", "ai.onnx") \
            and len(node.input) > 1 else None
        if w is None or len(w.dims) < 3 or _group(node) != 1 or w.dims[1] % multiple == 0 \
                or not _fast_after(w.dims[0]) or w.data_location == onnx.TensorProto.EXTERNAL:
            nodes.append(node)  # (external data is not loaded here: such a weight is left as it is)
            continue
        array = numpy_helper.to_array(w)
        extra = -array.shape[1] % multiple
        wide = np.concatenate([array, np.zeros((array.shape[0], extra, *array.shape[2:]), array.dtype)], axis=1)
        # its own weight: widened in place, under its name (trained ranges find it by name); else a copy
        w_name = _set_weight(graph, w, wide, uses[w.name] == 1, "_aligned", taken)
        if w_name != w.name:
            replaced.add(w.name)
        pads = np.zeros(2 * array.ndim, np.int64)
        pads[array.ndim + 1] = extra  # after the last channel, on axis 1 of an (N, C, ...) input
        pads_name = _fresh(f"{node.name or node.output[0]}_channel_pads", taken)
        graph.initializer.append(numpy_helper.from_array(pads, pads_name))
        widened = _fresh(f"{node.input[0]}_aligned", taken)
        nodes.append(helper.make_node("Pad", [node.input[0], pads_name], [widened], mode="constant",
                                      name=_fresh(f"{node.name or node.output[0]}_channel_pad", taken)))
        node.input[0], node.input[1] = widened, w_name
        nodes.append(node)
        done.append(node.name or node.output[0])
    if done:
        nodes = [copy.deepcopy(n) for n in nodes]
        del graph.node[:]
        graph.node.extend(nodes)
        used = {v for g in every for n in g.node for v in n.input} | {v.name for v in (*graph.input, *graph.output)}
        stale = replaced - used  # an original weight nothing else reads
        keep = [t for t in graph.initializer if t.name not in stale]
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return done


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)


def channel_pads(model: onnx.ModelProto) -> dict[str, str]:
    """Convolution name → the name of the ``Pad`` :func:`align_conv_inputs` put before it, recognised by its name
    (``<conv>_channel_pad`` or ``…_channel_pad_N``) and its structure: a constant zero ``Pad`` (no value input) of
    only trailing channels on axis 1, pads an initializer, its output read by that convolution alone and not a graph
    output, and the convolution's weight zero on those channels. A user's ``Pad`` of that name is not one."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    readers = collections.Counter(v for g in _subgraphs(graph) for n in g.node for v in n.input)
    readers.update(o.name for o in graph.output)
    producers = {n.output[0]: n for n in graph.node if n.op_type == "Pad" and n.output}
    out = {}
    for conv in graph.node:
        pad = producers.get(conv.input[0]) if conv.op_type == "Conv" and len(conv.input) > 1 else None
        if pad is None or not conv.name or readers[pad.output[0]] != 1 or len(pad.input) != 2 \
                or pad.input[1] not in inits or conv.input[1] not in inits or _attr(pad, "mode", b"constant") \
                not in (b"constant", "constant") \
                or not re.fullmatch(re.escape(conv.name) + r"_channel_pad(_\d+)?", pad.name):
            continue
        w, pads = inits[conv.input[1]], numpy_helper.to_array(inits[pad.input[1]])
        rank = len(w.dims)
        extra = int(pads[rank + 1]) if pads.shape == (2 * rank,) else 0
        others = np.delete(pads, rank + 1) if pads.shape == (2 * rank,) else pads
        if not 0 < extra < w.dims[1] or others.any() or w.data_location == onnx.TensorProto.EXTERNAL \
                or numpy_helper.to_array(w)[:, w.dims[1] - extra :].any():
            continue
        out[conv.name] = pad.name
    return out


def narrow_convs(model: onnx.ModelProto, convs: Sequence[str]) -> tuple[list[str], list[str]]:
    """Undo :func:`align_conv_inputs` (in place) for the named convolutions (their ``Pad`` as :func:`channel_pads`
    recognises it): each reads its ``Pad``'s input again, its weight loses the zero channels (a copy where another
    node reads it too), and the ``Pad`` goes with its pads initializer. For convolutions left in float (accuracy
    control's fallbacks): the zero channels buy nothing there and cost a third more of a float stem's MACs. The
    calibration of the widened graph still holds (the narrowed graph's tensors are among its own). Returns the names
    of the narrowed convolutions and of the tensors gone with their ``Pad`` (whose trained ranges have no tensor
    any more)."""
    graph = model.graph
    pads = channel_pads(model)
    wanted = [n for n in graph.node if n.op_type == "Conv" and n.name in set(convs) and n.name in pads]
    if not wanted:
        return [], []
    every = _subgraphs(graph)
    taken = {t.name for g in every for t in g.initializer} | {i.name for g in every for i in g.input} \
        | {v for g in every for n in g.node for v in (*n.input, *n.output, n.name)}
    readers = collections.Counter(v for g in every for n in g.node for v in n.input)
    readers.update(o.name for o in graph.output)
    inits = {t.name: t for t in graph.initializer}
    pad_nodes = {n.name: n for n in graph.node if n.op_type == "Pad"}
    gone_nodes, gone_inits, gone_values = set(), set(), []
    for conv in wanted:
        pad = pad_nodes[pads[conv.name]]
        w = inits[conv.input[1]]
        extra = int(numpy_helper.to_array(inits[pad.input[1]])[len(w.dims) + 1])
        narrow = np.ascontiguousarray(numpy_helper.to_array(w)[:, : w.dims[1] - extra])
        conv.input[1] = _set_weight(graph, w, narrow, readers[w.name] == 1, "_narrow", taken)
        conv.input[0] = pad.input[0]
        gone_nodes.add(pad.name)
        gone_values.append(pad.output[0])
        gone_inits.add(pad.input[1])
    left = {v for g in every for n in g.node if n.name not in gone_nodes for v in n.input}
    nodes = [copy.deepcopy(n) for n in graph.node if n.name not in gone_nodes]
    del graph.node[:]
    graph.node.extend(nodes)
    keep = [t for t in graph.initializer if t.name not in gone_inits or t.name in left]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    values = [v for v in graph.value_info if v.name not in gone_values]
    del graph.value_info[:]
    graph.value_info.extend(values)
    return [c.name for c in wanted], gone_values
