"""Static model facts and the optimised graph's op types (used to count integer kernels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minreal.runtime_bench.errors import ModelFileError, ProviderUnavailableError
from minreal.runtime_bench.model_info import INTEGER_OP_TYPES, count_nodes, model_info, optimized_graph_ops
from minreal.runtime_bench.providers import available_providers


def test_model_info_reads_file_facts(reference_model: Path) -> None:
    info = model_info("ref", reference_model)
    assert info.name == "ref"
    assert info.file_size_bytes == reference_model.stat().st_size
    assert info.node_count == 2 == count_nodes(reference_model)
    assert info.opset == 17


def test_count_nodes_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found: .*missing.onnx"):
        count_nodes(tmp_path / "missing.onnx")


def test_optimized_graph_fuses_gemm_relu(reference_model: Path) -> None:
    ops = optimized_graph_ops(reference_model)
    assert ops == {"FusedGemm": 1}


def _matmul_model(path: Path) -> Path:
    w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def test_dynamic_int8_model_runs_integer_kernels(tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32 = _matmul_model(tmp_path / "mm.onnx")
    int8 = tmp_path / "mm.int8.onnx"
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    assert sum(n for op, n in optimized_graph_ops(fp32).items() if op in INTEGER_OP_TYPES) == 0
    ops = optimized_graph_ops(int8)
    assert sum(n for op, n in ops.items() if op in INTEGER_OP_TYPES) == 1, ops


@pytest.mark.skipif("cuda" in available_providers(), reason="CUDA is built into this onnxruntime")
@pytest.mark.filterwarnings("ignore:Specified provider")
def test_optimized_graph_ops_refuses_fallback(reference_model: Path) -> None:
    with pytest.raises(ProviderUnavailableError, match="fell back"):
        optimized_graph_ops(reference_model, provider="cuda")


def test_float_roundtrips_are_the_float_ops_between_dequantise_and_quantise() -> None:
    from onnx import TensorProto, helper

    from minreal.runtime_bench.model_info import float_roundtrips

    nodes = [helper.make_node("DequantizeLinear", ["q0", "s", "z"], ["f0"]),
             helper.make_node("Pad", ["f0", "pads"], ["f1"]),  # float between DQ and Q: a round trip
             helper.make_node("QuantizeLinear", ["f1", "s", "z"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["f2"]),
             helper.make_node("Relu", ["f2"], ["y"])]  # ends in float: not a round trip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("q0", TensorProto.UINT8, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    assert float_roundtrips(graph) == {"Pad": 1}


def test_gzip_bytes_is_gzips_payload_streamed(reference_model: Path, tmp_path: Path) -> None:
    """Streamed in small pieces, the deflate stream is the one gzip writes for the same bytes: exactly 18 bytes
    (gzip's header and trailer) shorter than ``gzip.compress`` of the file, and of several files their
    concatenation."""
    import gzip

    from minreal.runtime_bench.model_info import GZIP_LEVEL, gzip_bytes, model_files

    data = reference_model.read_bytes()
    assert gzip_bytes([reference_model], chunk=1000) + 18 == len(gzip.compress(data, GZIP_LEVEL, mtime=0))
    other = tmp_path / "other.bin"
    other.write_bytes(bytes(range(256)) * 50)
    both = gzip.compress(data + other.read_bytes(), GZIP_LEVEL, mtime=0)
    assert gzip_bytes([reference_model, other], chunk=777) + 18 == len(both)
    assert model_files(reference_model) == [reference_model]
    assert model_info("m", reference_model).gzip_bytes == gzip_bytes([reference_model])
