"""TensorRT-readiness of an ONNX file, checked statically (no TensorRT needed).

- A float graph must use only default-domain (``ai.onnx``) ops that exist at its opset, and that
  opset must not exceed the one stated by the caller.
- An INT8 graph must be explicit QDQ: QuantizeLinear/DequantizeLinear pairs around float ops, no
  integer operators (QLinear*, ConvInteger, MatMulInteger, DynamicQuantizeLinear, com.microsoft
  kernels), and int8 zero points equal to 0 (TensorRT's symmetric int8; int32-quantised biases and
  uint8 activations are flagged).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import numpy as np
import onnx
from onnx import numpy_helper

from runtime_bench.facts import INTEGER_OPS

__all__ = ["ReadinessReport", "tensorrt_readiness"]

_STANDARD_DOMAINS = ("", "ai.onnx")
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


class ReadinessReport(TypedDict):
    """Result of :func:`tensorrt_readiness` (a plain dict, JSON-ready).

    Keys:
        path: file checked.
        kind: ``"fp32"`` or ``"int8"`` (any quantisation op present).
        opset: default-domain opset of the file.
        ready: no issues found.
        offending_ops: distinct ``domain:op`` (or ``op``) names that TensorRT would reject.
        issues: one line per problem, naming the op or node.
    """

    path: str
    kind: str
    opset: int
    ready: bool
    offending_ops: list[str]
    issues: list[str]


def _iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Yield every node of ``graph`` and of its subgraphs (If/Loop/Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _iter_nodes(sub)


def _op_name(node: onnx.NodeProto) -> str:
    """``domain:op`` outside the default domain, else ``op``."""
    return node.op_type if node.domain in _STANDARD_DOMAINS else f"{node.domain}:{node.op_type}"


def _schema_issue(node: onnx.NodeProto, opset: int) -> str | None:
    """Return why ``node`` is not a standard op at ``opset``, or ``None`` if it is."""
    if node.domain not in _STANDARD_DOMAINS:
        return f"{_op_name(node)} (node {node.name!r}) is outside the standard ONNX domain"
    try:
        onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return f"{node.op_type} (node {node.name!r}) is not a standard ONNX op at opset {opset}"
    return None


def _zero_point_issue(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> str | None:
    """Return why a Q/DQ node's zero point is not TensorRT's symmetric int8, or ``None``."""
    if len(node.input) < 3 or node.input[2] not in initializers:
        return None
    zero_point = numpy_helper.to_array(initializers[node.input[2]])
    if zero_point.dtype != np.int8:
        return f"{node.op_type} {node.name!r} has a zero point of type {zero_point.dtype}; TensorRT's Q/DQ needs int8"
    if np.any(zero_point != 0):
        return f"{node.op_type} {node.name!r} has a non-zero zero point; TensorRT needs symmetric int8"
    return None


def _int8_issues(nodes: list[onnx.NodeProto], model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(op, issue) pairs that keep an INT8 graph from being explicit, symmetric QDQ."""
    integer = [n for n in nodes if n.op_type in INTEGER_OPS]
    issues = [(_op_name(n), f"{_op_name(n)} (node {n.name!r}) is an integer operator, not QDQ") for n in integer]
    qdq = [n for n in nodes if n.op_type in _QDQ_OPS]
    present = {n.op_type for n in qdq}
    if present != _QDQ_OPS:
        issues.append(("", f"INT8 graph lacks {sorted(_QDQ_OPS - present)}; TensorRT needs explicit Q/DQ pairs"))
    initializers = {t.name: t for t in model.graph.initializer}
    issues += [(n.op_type, issue) for n in qdq if (issue := _zero_point_issue(n, initializers))]
    return issues


def tensorrt_readiness(path: str | Path, opset: int | None = None) -> ReadinessReport:
    """Check that an ONNX file is what TensorRT's ONNX parser can build, without TensorRT.

    Args:
        path: ONNX file (float or INT8).
        opset: the opset the graph was meant to use (e.g. ``ExportResult.opset``); ``None``
            accepts the file's own.

    Returns:
        A :class:`ReadinessReport` dict; ``ready`` is ``False`` with one issue per problem.
    """
    model = onnx.load(str(path), load_external_data=False)
    file_opset = next((o.version for o in model.opset_import if o.domain in _STANDARD_DOMAINS), 0)
    nodes = list(_iter_nodes(model.graph))
    is_int8 = any(n.op_type in _QDQ_OPS | INTEGER_OPS for n in nodes)
    found: list[tuple[str, str]] = []
    if opset is not None and file_opset > opset:
        found.append(("", f"graph uses opset {file_opset}, above the stated opset {opset}"))
    for node in nodes:
        if node.op_type in INTEGER_OPS:
            continue  # reported once by _int8_issues, as not QDQ
        if issue := _schema_issue(node, file_opset):
            found.append((_op_name(node), issue))
    if is_int8:
        found += _int8_issues(nodes, model)
    offending = sorted({op for op, _ in found if op})
    return ReadinessReport(
        path=str(path), kind="int8" if is_int8 else "fp32", opset=file_opset, ready=not found,
        offending_ops=offending, issues=[issue for _, issue in found],
    )  # fmt: skip
