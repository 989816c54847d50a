"""Constant zero padding on quantised tensors: a static QDQ graph's ``DequantizeLinear → Pad → QuantizeLinear`` with
one scale and zero point becomes one ``Pad`` of the quantised tensor whose pad value is the zero point.

ONNX Runtime's quantiser gives a constant zero ``Pad`` its input's scale and zero point (``QDQPad``: the calibrated
range always holds 0, which the zero point represents exactly), but its CPU graph optimiser has no rule that drops
the Q/DQ pair around a ``Pad`` (``DropQDQNodesRules`` in ``qdq_selector_action_transformer.cc`` lists Slice, Reshape,
Transpose, ... but not Pad), so the pad runs in float between a dequantise and a re-quantise. The option-A
shortcut of a CIFAR ResNet (stride-2 subsample, then zero channels on each side) is such a pad at every stage change.

The rewrite is exact: ``Q(Pad(DQ(x), 0)) = Pad(x, zero_point)`` elementwise, since ``Q(DQ(x)) = x`` for one scale
and zero point and ``Q(0) = zero_point``. ONNX Runtime's CPU ``Pad`` takes uint8 and int8 tensors.

References
----------
.. [1] ONNX Runtime, ``qdq_selector_action_transformer.cc`` (``DropQDQNodesRules``): the ops whose Q/DQ pair the CPU
       graph optimiser drops, Pad not among them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["integer_pads"]


def _constant(values: Mapping[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    """The value of initializer ``name`` (``None`` for an empty name or a computed tensor)."""
    return numpy_helper.to_array(values[name]) if name in values else None


def _params(node: onnx.NodeProto, values: Mapping[str, onnx.TensorProto]
            ) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, zero point) of a Q/DQ node when both are constant scalars (per-tensor), else ``None``."""
    if len(node.input) < 3:
        return None
    scale, zero = _constant(values, node.input[1]), _constant(values, node.input[2])
    if scale is None or zero is None or scale.size != 1 or zero.size != 1:
        return None
    return scale, zero


def _zero_pad(node: onnx.NodeProto, values: Mapping[str, onnx.TensorProto]) -> bool:
    """A ``Pad`` (opset 11 or later: pads as an input) in constant mode whose pad value is absent or a constant 0."""
    mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
    if mode != b"constant" or len(node.input) < 2:
        return False
    value = _constant(values, node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(1)
    return value is not None and value.size == 1 and float(value.reshape(-1)[0]) == 0.0


def _same(a: tuple[np.ndarray, np.ndarray] | None, b: tuple[np.ndarray, np.ndarray]) -> bool:
    """Equal scale and zero point (value and type)."""
    return a is not None and a[0].item() == b[0].item() and a[1].dtype == b[1].dtype and a[1].item() == b[1].item()


def integer_pads(model: onnx.ModelProto) -> list[str]:
    """Rewrite, in ``model``'s main graph (in place), every constant zero ``Pad`` read only by one ``QuantizeLinear``
    with the scale and zero point of the per-tensor ``DequantizeLinear`` that feeds it into a ``Pad`` of the quantised
    tensor padded with the zero point (see the module doc); returns the rewritten pads' names (else outputs).

    The quantiser goes; the dequantiser goes too unless another node or a graph output still reads it.
    """
    graph = model.graph
    values = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}
    names = {*values, *producer, *consumers, *(i.name for i in graph.input)}
    done, drop, gone = [], [], set()
    for pad in graph.node:
        dq = producer.get(pad.input[0]) if pad.op_type == "Pad" and pad.input else None
        if dq is None or dq.op_type != "DequantizeLinear" or not _zero_pad(pad, values):
            continue
        params, users = _params(dq, values), consumers.get(pad.output[0], [])
        q = users[0] if len(users) == 1 and pad.output[0] not in outputs else None
        if params is None or q is None or q.op_type != "QuantizeLinear" or not _same(_params(q, values), params):
            continue
        label = pad.name or pad.output[0]
        fill = _fresh(f"{label}_zero_point_fill", names)
        graph.initializer.append(numpy_helper.from_array(params[1].reshape(()), fill))
        inputs = [dq.input[0], pad.input[1], fill, *pad.input[3:]]
        del pad.input[:]
        pad.input.extend(inputs)
        gone.add(pad.output[0])
        pad.output[0] = q.output[0]
        drop.append(q)
        if all(c is pad for c in consumers[dq.output[0]]) and dq.output[0] not in outputs:
            drop.append(dq)
            gone.add(dq.output[0])
        done.append(label)
    for node in drop:
        graph.node.remove(node)
    kept = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return done


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or ``name_<k>`` for the first ``k`` not in ``taken``; added to ``taken``."""
    k, fresh = 0, name
    while fresh in taken:
        k += 1
        fresh = f"{name}_{k}"
    taken.add(fresh)
    return fresh
