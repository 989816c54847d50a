"""TensorRT-readiness of an ONNX file, checked statically (no TensorRT needed).

- A float graph must use only default-domain (``ai.onnx``) ops that exist at its opset, and that
  opset must not exceed the one stated by the caller.
- An INT8 graph must be explicit QDQ: QuantizeLinear/DequantizeLinear pairs around float ops, no
  integer operators (QLinear*, ConvInteger, MatMulInteger, DynamicQuantizeLinear, com.microsoft
  kernels), and int8 zero points equal to 0 (TensorRT's symmetric int8; int32-quantised biases and
  uint8 activations are flagged).

Findings are grouped: one :class:`Finding` per kind of problem and subject (an op, a zero-point type), with
every node it concerns, and one line naming the count and the first few nodes, e.g.
``uint8 zero point on 212 QuantizeLinear/DequantizeLinear nodes (e.g. a, b, c); TensorRT's Q/DQ needs int8``.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, TypedDict

import numpy as np
import onnx
from onnx import numpy_helper

from minreal.export.onnx_files import iter_nodes
from minreal.facts import INTEGER_OPS

__all__ = ["Finding", "ReadinessReport", "tensorrt_readiness", "EXAMPLE_NODES"]

_STANDARD_DOMAINS = ("", "ai.onnx")
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
#: Node names quoted in a finding's line (the finding itself lists them all).
EXAMPLE_NODES = 3


class Finding(TypedDict):
    """One kind of problem, grouped over the nodes that have it (a plain dict, JSON-ready).

    Keys:
        kind: ``opset``, ``domain``, ``unknown_op``, ``integer_op``, ``missing_qdq``, ``zero_point_type`` or
            ``zero_point_nonzero``.
        subject: what the group shares: the op (``domain:op`` outside the default domain), the zero point's
            type, or ``""`` for a graph-level finding.
        ops: distinct op names of the nodes (``[]`` for a graph-level finding).
        count: number of nodes (0 for a graph-level finding).
        nodes: every node's name, in graph order.
        message: one line with the count and the first :data:`EXAMPLE_NODES` names.
    """

    kind: str
    subject: str
    ops: list[str]
    count: int
    nodes: list[str]
    message: str


class ReadinessReport(TypedDict):
    """Result of :func:`tensorrt_readiness` (a plain dict, JSON-ready).

    Keys:
        path: file checked.
        kind: ``"fp32"`` or ``"int8"`` (any quantisation op present).
        opset: default-domain opset of the file.
        ready: no issues found.
        offending_ops: distinct ``domain:op`` (or ``op``) names that TensorRT would reject.
        issues: one line per finding (``findings[i]["message"]``).
        findings: the grouped findings, with full node lists.
    """

    path: str
    kind: str
    opset: int
    ready: bool
    offending_ops: list[str]
    issues: list[str]
    findings: list[Finding]


class _Hit(NamedTuple):
    """One node's problem before grouping (``node`` is ``""`` for a graph-level problem)."""

    kind: str
    subject: str
    op: str
    node: str


#: kind -> (line template, whether the node phrase names the ops: the subject already does for op-kinds).
_TEMPLATES: dict[str, tuple[str, bool]] = {
    "domain": ("{subject} on {nodes}: outside the standard ONNX domain", False),
    "unknown_op": ("{subject} on {nodes}: not a standard ONNX op at opset {opset}", False),
    "integer_op": ("{subject} on {nodes}: an integer operator, not QDQ", False),
    "zero_point_type": ("{subject} zero point on {nodes}; TensorRT's Q/DQ needs int8", True),
    "zero_point_nonzero": ("non-zero zero point on {nodes}; TensorRT needs symmetric int8", True),
}
_OFFENDING_KINDS = frozenset({"domain", "unknown_op", "integer_op", "zero_point_type", "zero_point_nonzero"})


def _op_name(node: onnx.NodeProto) -> str:
    """``domain:op`` outside the default domain, else ``op``."""
    return node.op_type if node.domain in _STANDARD_DOMAINS else f"{node.domain}:{node.op_type}"


def _node_name(node: onnx.NodeProto, index: int) -> str:
    """The node's name, or ``<op #index>`` for an unnamed node (``index`` in graph order)."""
    return node.name or f"<{node.op_type} #{index}>"


def _schema_hit(node: onnx.NodeProto, name: str, opset: int) -> _Hit | None:
    """Why ``node`` is not a standard op at ``opset``, or ``None`` if it is."""
    op = _op_name(node)
    if node.domain not in _STANDARD_DOMAINS:
        return _Hit("domain", op, op, name)
    try:
        onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return _Hit("unknown_op", op, op, name)
    return None


def _zero_point_hit(node: onnx.NodeProto, name: str, initializers: dict[str, onnx.TensorProto]) -> _Hit | None:
    """Why a Q/DQ node's zero point is not TensorRT's symmetric int8, or ``None``."""
    if len(node.input) < 3 or node.input[2] not in initializers:
        return None
    zero_point = numpy_helper.to_array(initializers[node.input[2]])
    if zero_point.dtype != np.int8:
        return _Hit("zero_point_type", str(zero_point.dtype), node.op_type, name)
    if np.any(zero_point != 0):
        return _Hit("zero_point_nonzero", "", node.op_type, name)
    return None


def _int8_hits(named: list[tuple[onnx.NodeProto, str]], model: onnx.ModelProto) -> tuple[list[_Hit], list[str]]:
    """Node problems that keep an INT8 graph from being explicit, symmetric QDQ, and graph-level lines."""
    hits = [_Hit("integer_op", _op_name(n), _op_name(n), name) for n, name in named if n.op_type in INTEGER_OPS]
    qdq = [(n, name) for n, name in named if n.op_type in _QDQ_OPS]
    missing = sorted(_QDQ_OPS - {n.op_type for n, _ in qdq})
    lines = [f"INT8 graph lacks {missing}; TensorRT needs explicit Q/DQ pairs"] if missing else []
    initializers = {t.name: t for t in model.graph.initializer}
    hits += [hit for n, name in qdq if (hit := _zero_point_hit(n, name, initializers))]
    return hits, lines


def _nodes_phrase(nodes: list[str], ops: list[str]) -> str:
    """``212 QuantizeLinear/DequantizeLinear nodes (e.g. a, b, c)``; ``1 node (x)`` without ops."""
    shown = ", ".join(nodes[:EXAMPLE_NODES])
    examples = f"(e.g. {shown})" if len(nodes) > EXAMPLE_NODES else f"({shown})"
    noun = "node" if len(nodes) == 1 else "nodes"
    return " ".join([str(len(nodes)), *(["/".join(ops)] if ops else []), noun, examples])


def _group(hits: list[_Hit], opset: int) -> list[Finding]:
    """One :class:`Finding` per (kind, subject), in order of first appearance, nodes in graph order."""
    groups: dict[tuple[str, str], list[_Hit]] = {}
    for hit in hits:
        groups.setdefault((hit.kind, hit.subject), []).append(hit)
    out = []
    for (kind, subject), members in groups.items():
        ops = sorted({h.op for h in members}, reverse=True)  # QuantizeLinear before DequantizeLinear
        nodes = [h.node for h in members]
        template, with_ops = _TEMPLATES[kind]
        phrase = _nodes_phrase(nodes, ops if with_ops else [])
        out.append(Finding(kind=kind, subject=subject, ops=ops, count=len(nodes), nodes=nodes,
                           message=template.format(subject=subject, nodes=phrase, opset=opset)))
    return out


def _graph_finding(kind: str, message: str) -> Finding:
    return Finding(kind=kind, subject="", ops=[], count=0, nodes=[], message=message)


def tensorrt_readiness(path: str | Path, opset: int | None = None) -> ReadinessReport:
    """Check that an ONNX file is what TensorRT's ONNX parser can build, without TensorRT.

    Parameters
    ----------
    path : str | Path
        ONNX file (float or INT8).
    opset : int | None
        the opset the graph was meant to use (e.g. ``ExportResult.opset``); ``None``
        accepts the file's own.

    Returns
    -------
    ReadinessReport
        A :class:`ReadinessReport` dict; ``ready`` is ``False`` with one grouped finding per kind of problem.
    """
    model = onnx.load(str(path), load_external_data=False)
    file_opset = next((o.version for o in model.opset_import if o.domain in _STANDARD_DOMAINS), 0)
    named = [(n, _node_name(n, i)) for i, n in enumerate(iter_nodes(model.graph))]
    is_int8 = any(n.op_type in _QDQ_OPS | INTEGER_OPS for n, _ in named)
    findings: list[Finding] = []
    if opset is not None and file_opset > opset:
        findings.append(_graph_finding("opset", f"graph uses opset {file_opset}, above the stated opset {opset}"))
    # Integer operators are reported once, by _int8_hits, as not QDQ.
    hits = [hit for n, name in named if n.op_type not in INTEGER_OPS and (hit := _schema_hit(n, name, file_opset))]
    lines: list[str] = []
    if is_int8:
        int8_hits, lines = _int8_hits(named, model)
        hits += int8_hits
    findings += _group(hits, file_opset) + [_graph_finding("missing_qdq", line) for line in lines]
    offending = sorted({op for f in findings if f["kind"] in _OFFENDING_KINDS for op in f["ops"]})
    return ReadinessReport(
        path=str(path), kind="int8" if is_int8 else "fp32", opset=file_opset, ready=not findings,
        offending_ops=offending, issues=[f["message"] for f in findings], findings=findings,
    )  # fmt: skip
