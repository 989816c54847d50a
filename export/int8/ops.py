"""Which nodes of an ONNX graph INT8 quantises or leaves in float, and how many kernels run as integers."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from minreal.export.int8.preprocess import preprocess
from minreal.facts import FLOAT_ATTENTION_OPS, FLOAT_KERNEL_OPS, INTEGER_KERNEL_OPS
from minreal.runtime_bench import optimized_graph_ops
from minreal.runtime_bench.model_info import float_roundtrip_nodes, op_counts

__all__ = ["WEIGHTED_OPS", "QDQ_OPS", "dynamic_weight_nodes", "optimized_op_counts", "kernel_counts",
           "nonfinite_scales", "nonfinite_scale_nodes", "qdq_cost", "quantizable_nodes"]


WEIGHTED_OPS = ("Conv", "Gemm", "MatMul")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def _value_dependent(model: onnx.ModelProto) -> set[str]:
    """Tensors whose values depend on the graph inputs' values (Shape/Size outputs depend only on shapes)."""
    live = {i.name for i in model.graph.input}
    for node in model.graph.node:  # ONNX nodes are stored in topological order
        if node.op_type not in ("Shape", "Size") and any(i in live for i in node.input):
            live.update(node.output)
    return live


def dynamic_weight_nodes(model: onnx.ModelProto) -> list[str]:
    """Nodes that static quantisation should leave in float: weight-generating nodes (no input depends on the
    data, e.g. an SSM kernel built from its parameters and the sequence length) and Conv/ConvTranspose/Gemm
    nodes whose weight is computed in the graph rather than stored."""
    live = _value_dependent(model)
    constants = {i.name for i in model.graph.initializer}
    excluded = []
    for n in model.graph.node:
        generates = not any(i in live for i in n.input)
        computed_weight = (n.op_type in ("Conv", "ConvTranspose", "Gemm") and len(n.input) > 1
                           and n.input[1] not in constants)
        if n.name and (generates or computed_weight):
            excluded.append(n.name)
    return excluded


def optimized_op_counts(path: str | Path, provider: str = "cpu") -> dict[str, int]:
    """Op counts of the graph ONNX Runtime actually runs for ``provider`` (all optimisations on).

    Delegates to :func:`minreal.runtime_bench.optimized_graph_ops` so the project counts kernels one way.
    """
    return optimized_graph_ops(Path(path), provider)


def kernel_counts(op_counts: dict[str, int]) -> tuple[int, int]:
    """Return (integer, float) Conv/MatMul/Gemm kernel counts from domain-prefixed op counts; a fused attention
    kernel (:data:`~minreal.facts.FLOAT_ATTENTION_OPS`) counts as a float one: its products run in float."""
    integer = sum(n for op, n in op_counts.items() if op.rsplit(":", 1)[-1] in INTEGER_KERNEL_OPS)
    floating = sum(n for op, n in op_counts.items()
                   if op.rsplit(":", 1)[-1] in FLOAT_KERNEL_OPS | FLOAT_ATTENTION_OPS)
    return integer, floating


def _constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Initializers and Constant-node tensors by name."""
    consts = {i.name: i for i in model.graph.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in model.graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR})
    return consts


def nonfinite_scales(model: onnx.ModelProto) -> list[str]:
    """Scale tensors of Q/DQ nodes that are not finite."""
    consts = _constants(model)
    return sorted({n.input[1] for n in model.graph.node if n.op_type in QDQ_OPS and len(n.input) > 1
                   and n.input[1] in consts and not np.isfinite(numpy_helper.to_array(consts[n.input[1]])).all()})


def nonfinite_scale_nodes(model: onnx.ModelProto) -> list[str]:
    """Float nodes of a QDQ graph that read or write a tensor quantised with a scale that is not finite (inf or
    NaN: calibration met an infinite value, e.g. a 0/-inf attention mask), in graph order."""
    consts = _constants(model)
    bad, dequantised = set(), {}
    for n in model.graph.node:
        if n.op_type in QDQ_OPS and len(n.input) > 1 and n.input[1] in consts:
            if not np.isfinite(numpy_helper.to_array(consts[n.input[1]])).all():
                bad.update((n.input[0], n.output[0]))
        if n.op_type == "DequantizeLinear":
            dequantised[n.output[0]] = n.input[0]
    bad |= {out for out, src in dequantised.items() if src in bad}
    return [n.name for n in model.graph.node
            if n.op_type not in QDQ_OPS and n.name and bad & {*n.input, *n.output}]


def qdq_cost(graph: onnx.GraphProto) -> tuple[int, int, set[str]]:
    """(Q/DQ nodes, integer Conv/MatMul/Gemm kernels, names of the float round-trip nodes) of an ORT CPU graph."""
    ops = op_counts(graph)
    return (ops["QuantizeLinear"] + ops["DequantizeLinear"], kernel_counts(dict(ops))[0],
            {n.name for n in float_roundtrip_nodes(graph)})


def quantizable_nodes(fp32_path: str | Path) -> list[str]:
    """Conv/Gemm/MatMul nodes that static :func:`quantize_int8` quantises, in graph order, named as in the graph
    ONNX Runtime's quantiser sees (after ``quant_pre_process``): the names its ``exclude`` takes.

    Unnamed nodes (which cannot be excluded) and nodes whose weights the graph computes are left out.
    """
    with tempfile.TemporaryDirectory() as workdir:
        source, _ = preprocess(Path(fp32_path), Path(workdir) / "preprocessed.onnx")
        model = onnx.load(str(source), load_external_data=False)
    computed = set(dynamic_weight_nodes(model))
    return [n.name for n in model.graph.node if n.op_type in WEIGHTED_OPS and n.name and n.name not in computed]
