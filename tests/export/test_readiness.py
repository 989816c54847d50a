"""Tests for export.readiness: standard ops at the opset, explicit symmetric QDQ for INT8."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, save

from export.onnx_export import ExportResult
from export.quantize import QuantConfig, quantize_int8
from export.readiness import tensorrt_readiness


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
    }  # fmt: skip
    json.dumps(report)


def test_flags_non_standard_domain_op(tmp_path: Path) -> None:
    report = tensorrt_readiness(_graph_with(tmp_path, "FancyAct", domain="com.example"))
    assert not report["ready"]
    assert report["offending_ops"] == ["com.example:FancyAct"]
    assert "outside the standard ONNX domain" in report["issues"][0] and "the_node" in report["issues"][0]


def test_flags_unknown_standard_op_and_newer_opset(tmp_path: Path) -> None:
    report = tensorrt_readiness(_graph_with(tmp_path, "Frobnicate"), opset=17)
    assert report["offending_ops"] == ["Frobnicate"]
    assert report["issues"] == [
        "graph uses opset 18, above the stated opset 17",
        "Frobnicate (node 'the_node') is not a standard ONNX op at opset 18",
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
    if config.target == "cpu" and config.mode == "static":
        assert any("zero point of type uint8" in issue for issue in report["issues"])
