"""A mean over every spatial axis written as ``GlobalAveragePool``, so that a static QDQ graph's global pooling runs on
quantised tensors.

PyTorch exports ``adaptive_avg_pool2d(x, 1)`` and ``x.mean((2, 3), keepdim=True)`` as ``ReduceMean``. ONNX Runtime's
CPU graph optimiser fuses ``DequantizeLinear → GlobalAveragePool → QuantizeLinear`` into
``QLinearGlobalAveragePool`` (``UnaryOpQDQRules`` in ``qdq_selector_action_transformer.cc``) but has no such rule
for ``ReduceMean``, which then runs in float between a dequantise and a re-quantise. Both ops compute the same
values when the mean is over every axis after the first two and the reduced axes are kept. A tensor of rank 3 is
rewritten only when a convolution or pooling made it (through element-wise ops): there the last axis is a
length, but in a sequence model's ``(N, S, D)`` it is the features, and a mean over them (an RMSNorm's or decomposed
LayerNorm's) must stay a ``ReduceMean``, whose input the quantiser leaves in float.

References
----------
.. [1] ONNX Runtime, ``qdq_selector_action_transformer.cc`` (``UnaryOpQDQRules``): the fusion into
       ``QLinearGlobalAveragePool``, with no rule for ``ReduceMean``.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

__all__ = ["global_average_pools"]

_SPATIAL = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"}  # the float graph, before quantisation
# element-wise ops a convolution's output passes through to the pooled tensor (activations, SiLU's and GELU's parts,
# residual sums); a Pow (an RMSNorm's x²), a MatMul, a Reshape or a Transpose ends the search
_ELEMENTWISE = {"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh", "Elu", "Selu", "Gelu",
                "Softplus", "Erf", "BatchNormalization", "Identity", "DequantizeLinear", "QuantizeLinear", "Add", "Sub",
                "Mul", "Div"}


def _ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """Tensor name → rank, where the graph's inputs or shape-inferred value infos know it."""
    return {v.name: len(v.type.tensor_type.shape.dim) for v in (*graph.input, *graph.value_info, *graph.output)
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}


def _axes(node: onnx.NodeProto, values: dict[str, onnx.TensorProto]) -> list[int] | None:
    """The reduced axes of a ``ReduceMean`` (attribute before opset 18, constant input after); ``None`` when they are
    not constant or not given (all axes, or none with ``noop_with_empty_axes``)."""
    attribute = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
    if attribute is not None:
        return attribute
    if len(node.input) > 1 and node.input[1] in values:
        return [int(a) for a in numpy_helper.to_array(values[node.input[1]]).reshape(-1)]
    return None


def _from_convolution(name: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether a convolution or pooling made tensor ``name``: one reached upwards through element-wise ops only (any
    of their inputs: a residual sum, SiLU's ``x * sigmoid(x)``)."""
    stack, seen = [name], set()
    while stack:
        node = producers.get(stack.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type in _SPATIAL:
            return True
        if node.op_type in _ELEMENTWISE:
            stack.extend(node.input)
    return False


def _spatial_mean(node: onnx.NodeProto, values: dict[str, onnx.TensorProto], ranks: dict[str, int],
                  producers: dict[str, onnx.NodeProto]) -> bool:
    """A ``ReduceMean`` over every axis after the first two, keeping them, of a tensor of rank 4 or more, or of rank
    3 made by a convolution (see the module docstring)."""
    rank = ranks.get(node.input[0], 0) if node.op_type == "ReduceMean" and node.input else 0
    axes = _axes(node, values) if rank >= 3 else None
    keep = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
    spatial = rank >= 4 or (rank == 3 and _from_convolution(node.input[0], producers))
    return axes is not None and keep == 1 and sorted(a % rank for a in axes) == list(range(2, rank)) and spatial


def global_average_pools(model: onnx.ModelProto) -> list[str]:
    """Rewrite, in ``model``'s main graph (in place), every ``ReduceMean`` over all spatial axes with the axes kept
    (rank known from the graph's shape information) into ``GlobalAveragePool``; returns the names of the rewritten
    nodes (else their outputs). Node names and tensor names stay; an axes initializer no other node reads goes."""
    graph = model.graph
    values = {t.name: t for t in graph.initializer}
    ranks = _ranks(graph)
    producers = {o: n for n in graph.node for o in n.output}
    done, released = [], set()
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or not _spatial_mean(node, values, ranks, producers):
            continue
        released.update(node.input[1:])
        data = node.input[0]
        node.op_type = "GlobalAveragePool"
        del node.input[:]
        node.input.append(data)
        del node.attribute[:]
        done.append(node.name or node.output[0])
    unused = released - {i for n in graph.node for i in n.input}  # axes that no other node reads
    kept = [t for t in graph.initializer if t.name not in unused]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return done
