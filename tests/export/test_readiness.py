"""Tests for minreal.export.readiness: standard ops at the opset, explicit symmetric QDQ for INT8, findings grouped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from minreal.app.report import tensorrt_lines
from minreal.export.int8 import QuantConfig, quantize_int8
from minreal.export.onnx_export import ExportResult
from minreal.export.readiness import tensorrt_readiness


def _graph_with(tmp_path: Path, op_type: str, domain: str = "") -> Path:
    """A one-node graph y = op(x) in the given domain, saved without checking the op."""
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain, name="the_node")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    path = tmp_path / f"{op_type}.onnx"
    save(helper.make_model(graph, opset_imports=opsets), path)
    return path


def test_exported_fp32_graph_is_ready(convnet_onnx: ExportResult) -> None:
    report = tensorrt_readiness(convnet_onnx.path, opset=convnet_onnx.opset)
    assert report == {
        "path": convnet_onnx.path, "kind": "fp32", "opset": 18, "ready": True, "offending_ops": [], "issues": [],
        "findings": [],
    }  # fmt: skip
    json.dumps(report)


def test_flags_non_standard_domain_op(tmp_path: Path) -> None:
    report = tensorrt_readiness(_graph_with(tmp_path, "FancyAct", domain="com.example"))
    assert not report["ready"]
    assert report["offending_ops"] == ["com.example:FancyAct"]
    assert report["issues"] == ["com.example:FancyAct on 1 node (the_node): outside the standard ONNX domain"]
    assert report["findings"] == [{"kind": "domain", "subject": "com.example:FancyAct", "ops": ["com.example:FancyAct"],
                                   "count": 1, "nodes": ["the_node"], "message": report["issues"][0]}]


def test_flags_unknown_standard_op_and_newer_opset(tmp_path: Path) -> None:
    report = tensorrt_readiness(_graph_with(tmp_path, "Frobnicate"), opset=17)
    assert report["offending_ops"] == ["Frobnicate"]
    assert report["issues"] == [
        "graph uses opset 18, above the stated opset 17",
        "Frobnicate on 1 node (the_node): not a standard ONNX op at opset 18",
    ]


@pytest.mark.parametrize(
    ("config", "ready", "offending"),
    [
        (QuantConfig(target="tensorrt"), True, []),
        (QuantConfig(target="cpu"), False, ["DequantizeLinear", "QuantizeLinear"]),
        (QuantConfig(mode="dynamic"), False, ["ConvInteger", "DynamicQuantizeLinear", "MatMulInteger"]),
    ],
)
def test_int8_graphs(
    convnet_onnx: ExportResult,
    calib_images: np.ndarray,
    tmp_path: Path,
    config: QuantConfig,
    ready: bool,
    offending: list[str],
) -> None:
    quantized = quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", calib_images, config)
    report = tensorrt_readiness(quantized.out_path, opset=convnet_onnx.opset)
    assert report["kind"] == "int8"
    assert report["ready"] is ready
    assert report["offending_ops"] == offending
    kinds = [(f["kind"], f["subject"]) for f in report["findings"]]
    assert len(kinds) == len(set(kinds)) == len(report["issues"])  # one line per kind of finding, never per node
    if config.target == "cpu" and config.mode == "static":
        model = onnx.load(quantized.out_path)
        zero_points = {t.name for t in model.graph.initializer if t.data_type == TensorProto.UINT8}
        uint8 = [n.name for n in model.graph.node if len(n.input) > 2 and n.input[2] in zero_points]
        (finding,) = [f for f in report["findings"] if f["subject"] == "uint8"]
        assert finding["nodes"] == uint8 and finding["count"] == len(uint8) > 3
        assert finding["message"] == (f"uint8 zero point on {len(uint8)} QuantizeLinear/DequantizeLinear nodes "
                                      f"(e.g. {', '.join(uint8[:3])}); TensorRT's Q/DQ needs int8")


def _qdq_chain(tmp_path: Path, pairs: int) -> Path:
    """x -> (QuantizeLinear -> DequantizeLinear) x ``pairs`` -> y, every zero point uint8 (CPU-style QDQ)."""
    nodes, prev = [], "x"
    for i in range(pairs):
        nodes += [helper.make_node("QuantizeLinear", [prev, "s", "z"], [f"q{i}"], name=f"q{i}"),
                  helper.make_node("DequantizeLinear", [f"q{i}", "s", "z"], [f"d{i}"], name=f"dq{i}")]
        prev = f"d{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    path = tmp_path / "chain.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_many_qdq_nodes_give_one_grouped_line(tmp_path: Path) -> None:
    report = tensorrt_readiness(_qdq_chain(tmp_path, pairs=106))
    names = [n for i in range(106) for n in (f"q{i}", f"dq{i}")]
    assert report["issues"] == [
        "uint8 zero point on 212 QuantizeLinear/DequantizeLinear nodes (e.g. q0, dq0, q1); TensorRT's Q/DQ needs int8",
    ]
    (finding,) = report["findings"]
    assert finding["nodes"] == names and finding["count"] == 212
    assert finding["ops"] == ["QuantizeLinear", "DequantizeLinear"] and finding["kind"] == "zero_point_type"
    assert report["offending_ops"] == ["DequantizeLinear", "QuantizeLinear"]
    json.dumps(report)


def test_report_renders_one_line_per_finding(tmp_path: Path) -> None:
    report = tensorrt_readiness(_qdq_chain(tmp_path, pairs=106))
    assert tensorrt_lines("original.int8", report) == ["- **original.int8** not TensorRT-ready:",
                                                        f"  - {report['issues'][0]}"]
    old = {"ready": False, "issues": [f"QuantizeLinear 'q{i}' has a zero point of type uint8" for i in range(212)]}
    lines = tensorrt_lines("x", old)  # a report.json written before findings were grouped
    assert len(lines) == 5 and lines[-1] == "  - ... and 209 more"
    assert tensorrt_lines("x", {"ready": True, "issues": [], "findings": []}) == tensorrt_lines("x", {}) == []
