"""Activation ranges trained by quantisation-aware recovery, placed in the graph as ONNX Runtime's overrides.

Ranges trained by ``minreal.compress.core.qat`` (keyed by module name) replace the calibrated ones of the layers'
input tensors (ORT's ``TensorQuantOverrides``): each module is found by its weight initializer, named
``<module>.weight`` by the dynamo exporter (onnxsim keeps the name when it folds a BatchNorm into the Conv), else by
equal values (transposed for Gemm/MatMul). Every other tensor is calibrated.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from minreal.export.errors import QuantizationError
from minreal.export.int8.config import QuantConfig, weight_qmax
from minreal.export.int8.ops import WEIGHTED_OPS

__all__ = ["module_inputs", "trained_overrides", "applied_ranges", "check_ranges", "Placed"]


class Placed(NamedTuple):
    """A layer's input tensor that takes its trained range, and the tensors above it that take the same range (through
    ops whose quantisation parameters ORT shares, and zero pads)."""

    tensor: str
    above: tuple[str, ...]


_SHARED_PARAMS_OPS = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool"})
"""Ops whose output ORT's QDQ quantiser gives its input's scale and zero point, and which commute with a
per-tensor quantiser (they move or select values): a range trained for the output holds for the input too."""
_ZERO_POINT_TYPES = {"uint8": np.uint8, "int8": np.int8}


def _weight_consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Initializer name → the Conv/Gemm/MatMul nodes that take it as their weight (input 1)."""
    constants = {t.name for t in model.graph.initializer}
    found: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        if n.op_type in WEIGHTED_OPS and len(n.input) > 1 and n.input[1] in constants:
            found.setdefault(n.input[1], []).append(n)
    return found


def _same_values(tensor: onnx.TensorProto, weight: np.ndarray) -> bool:
    """The initializer holds ``weight``, as is or transposed (a Linear written as Gemm/MatMul with (in, out)), or
    widened with zero input channels (:func:`minreal.export.qdq_channels.align_conv_inputs`)."""
    dims = tuple(tensor.dims)
    if weight.ndim >= 3 and len(dims) == weight.ndim and dims[0] == weight.shape[0] and dims[2:] == weight.shape[2:] \
            and dims[1] > weight.shape[1]:
        value = numpy_helper.to_array(tensor)
        return np.array_equal(value[:, :weight.shape[1]], weight) and not value[:, weight.shape[1]:].any()
    if dims not in (weight.shape, weight.shape[::-1]):
        return False
    value = numpy_helper.to_array(tensor)
    return np.array_equal(value, weight) or (value.ndim == 2 and np.array_equal(value, weight.T))


def module_inputs(model: onnx.ModelProto, modules: Iterable[str],
                  weights: Mapping[str, np.ndarray] | None = None) -> dict[str, list[str]]:
    """Module name → input tensors of the Conv/Gemm/MatMul nodes whose weight comes from that module.

    A weight is found by the initializer name ``<module>.weight``, else (given ``weights``, module name → array)
    by equal values; modules found neither way are left out.
    """
    consumers = _weight_consumers(model)
    candidates = {t.name: t for t in model.graph.initializer if t.name in consumers}
    found = {}
    for name in modules:
        key = f"{name}.weight"
        if key not in consumers and weights is not None and name in weights:
            key = next((k for k, t in candidates.items() if _same_values(t, np.asarray(weights[name]))), key)
        if key in consumers:
            found[name] = list(dict.fromkeys(n.input[0] for n in consumers[key]))
    return found


def _zero_pad(node: onnx.NodeProto) -> bool:
    """A constant ``Pad`` with the default zero value (no ``constant_value`` input): ORT's QDQ quantiser gives its
    output its input's parameters, and padding with a zero commutes with a per-tensor quantiser whose range holds
    zero (every asymmetric uint8 range does)."""
    mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
    return node.op_type == "Pad" and mode == b"constant" and (len(node.input) < 3 or not node.input[2])


def _upstream(model: onnx.ModelProto, tensor: str) -> list[str]:
    """Tensors above ``tensor`` through :data:`_SHARED_PARAMS_OPS` and zero pads (:func:`_zero_pad`), each the only
    use of its value."""
    producers = {o: n for n in model.graph.node for o in n.output}
    uses = collections.Counter(i for n in model.graph.node for i in n.input)
    chain, node = [], producers.get(tensor)
    while node is not None and (node.op_type in _SHARED_PARAMS_OPS or _zero_pad(node)) and uses[node.input[0]] == 1:
        chain.append(node.input[0])
        node = producers.get(node.input[0])
    return chain


def _override(r: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
    return [{"scale": np.array(r["scale"], dtype=np.float32),
             "zero_point": np.array(r["zero_point"], dtype=_ZERO_POINT_TYPES[r["dtype"]])}]


def trained_overrides(model: onnx.ModelProto, ranges: Mapping[str, Mapping[str, Any]],
                      weights: Mapping[str, np.ndarray] | None = None
                      ) -> tuple[dict[str, list[dict[str, np.ndarray]]], dict[str, list[Placed]]]:
    """(``TensorQuantOverrides`` for ORT, module → its input tensors, :class:`Placed`) placing each trained range on
    its layer's input tensor, and on the tensors above it whose parameters ORT shares with it
    (:data:`_SHARED_PARAMS_OPS`: ORT would ignore an override below them). A range set directly on a layer's input
    wins over one reaching a tensor from further down."""
    direct = module_inputs(model, ranges, weights)
    overrides: dict[str, list[dict[str, np.ndarray]]] = {}
    above = {t: _upstream(model, t) for tensors in direct.values() for t in tensors}
    for name, tensors in direct.items():
        for t in tensors:
            overrides.setdefault(t, _override(ranges[name]))
    for name, tensors in direct.items():
        for up in (u for t in tensors for u in above[t]):
            overrides.setdefault(up, _override(ranges[name]))
    return overrides, {name: [Placed(t, tuple(above[t])) for t in tensors] for name, tensors in direct.items()}


def _written_params(path: Path) -> dict[str, tuple[float, int]]:
    """Tensor → (scale, zero point) of the QuantizeLinear that quantises it in a written QDQ model."""
    model = onnx.load(str(path), load_external_data=False)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.input[0]: (float(values[n.input[1]]), int(values[n.input[2]])) for n in model.graph.node
            if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[1] in values and n.input[2] in values
            and values[n.input[1]].size == 1}


def applied_ranges(path: Path, direct: Mapping[str, Sequence[Placed]], ranges: Mapping[str, Mapping[str, Any]]
                   ) -> tuple[int, list[str]]:
    """(tensors written with their trained scale and zero point, modules whose range is not in the graph). A tensor
    the written file no longer quantises (a zero pad moved onto the quantised tensor above it: ``integer_pads``)
    counts as written where a tensor above it, which took the same range, is."""
    written = _written_params(path)
    trained, untrained = set(), []
    for name, r in ranges.items():
        tensors = direct.get(name, [])
        params = (float(np.float32(r["scale"])), int(r["zero_point"]))
        hits = [p.tensor for p in tensors if written.get(p.tensor) == params
                or (p.tensor not in written and any(written.get(u) == params for u in p.above))]
        if tensors and len(hits) == len(tensors):
            trained.update(hits)
        else:
            untrained.append(name)
    return len(trained), untrained


def check_ranges(ranges: Mapping[str, Mapping[str, Any]], config: QuantConfig) -> None:
    """Trained ranges need static mode and the activation format they were trained in."""
    if config.mode != "static":
        raise QuantizationError("trained activation ranges apply to static quantisation; got mode='dynamic'")
    act_type, symmetric = config.activation()
    qmax = weight_qmax(config)
    for name, r in ranges.items():
        if (r["dtype"], bool(r["symmetric"])) != (act_type, symmetric):
            kind = lambda t, sym: f"{t} {'symmetric' if sym else 'asymmetric'}"  # noqa: E731
            raise QuantizationError(
                f"the activation range of {name!r} was trained for {kind(r['dtype'], r['symmetric'])} activations "
                f"but target {config.target!r} writes {kind(act_type, symmetric)}; recover for the same target")
        if int(r.get("weight_qmax", 127)) != qmax:
            raise QuantizationError(
                f"the layer {name!r} was trained with weights on [-{r.get('weight_qmax', 127)}, "
                f"{r.get('weight_qmax', 127)}] but target {config.target!r} writes [-{qmax}, {qmax}] (cpu-avx2 has "
                "7-bit weights, cpu-vnni 8-bit ones); recover for the same target")
