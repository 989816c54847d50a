"""Tests for minreal.export.simplify: node counts and sizes, keeping the original when onnxsim misbehaves."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxsim
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import minreal.export.simplify as simplify_module
from minreal.export.errors import SameFileError
from minreal.export.onnx_export import to_onnx
from minreal.export.readiness import tensorrt_readiness
from minreal.export.simplify import CONTRIB_FUSIONS, simplify

CHECK_INPUTS = [np.ones((1, 4), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)]


@pytest.fixture
def redundant_graph(tmp_path: Path) -> Path:
    """y = Identity(x * (a + b)) with constant a, b: onnxsim folds it to a single Mul."""
    a = numpy_helper.from_array(np.full(4, 0.5, np.float32), "a")
    b = numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")
    nodes = [
        helper.make_node("Add", ["a", "b"], ["c"]),
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Identity", ["m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "redundant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[a, b],
    )  # fmt: skip
    path = tmp_path / "redundant.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_simplify_folds_and_reports_counts_and_sizes(redundant_graph: Path, tmp_path: Path) -> None:
    before = redundant_graph.read_bytes()
    result = simplify(redundant_graph, tmp_path / "simple.onnx", CHECK_INPUTS)
    assert result.simplified and result.reason is None
    assert (result.nodes_before, result.nodes_after) == (3, 1)
    assert result.nodes_after == len(onnx.load(result.path_out).graph.node)
    assert result.size_before_bytes == len(before)
    assert result.size_after_bytes == Path(result.path_out).stat().st_size
    assert result.max_abs_diff == 0.0
    assert redundant_graph.read_bytes() == before


def test_simplify_keeps_exported_cnn_outputs(convnet_onnx, tmp_path: Path, make_images) -> None:
    checks = [make_images(1, 5).numpy(), make_images(6, 6).numpy()]
    result = simplify(convnet_onnx.path, tmp_path / "cnn.sim.onnx", checks)
    assert result.simplified
    assert 0 < result.nodes_after <= result.nodes_before
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5


def test_one_session_at_a_time_without_the_arena(redundant_graph: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The original's session is closed before the simplified graph's opens, and neither keeps onnxruntime's memory
    arena: one session's memory at a time, returned after each run."""
    open_now, most, arenas = [0], [0], []
    real = simplify_module.create_session

    def counted(*args: Any, **kwargs: Any) -> Any:
        session = real(*args, **kwargs)
        arenas.append(session.get_session_options().enable_cpu_mem_arena)
        open_now[0] += 1
        most[0] = max(most[0], open_now[0])
        weakref.finalize(session, lambda: open_now.__setitem__(0, open_now[0] - 1))
        return session

    monkeypatch.setattr(simplify_module, "create_session", counted)
    assert simplify(redundant_graph, tmp_path / "simple.onnx", CHECK_INPUTS).simplified
    assert (arenas, most[0], open_now[0]) == ([False, False], 1, 0)


def test_onnxsim_failure_keeps_original(redundant_graph: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simplifier crashed\nwith a traceback")

    monkeypatch.setattr(onnxsim, "simplify", broken)
    result = simplify(redundant_graph, tmp_path / "out.onnx", CHECK_INPUTS)
    assert not result.simplified
    assert result.reason == "onnxsim failed: RuntimeError: simplifier crashed"
    assert (tmp_path / "out.onnx").read_bytes() == redundant_graph.read_bytes()
    assert result.nodes_before == result.nodes_after == 3 and result.max_abs_diff is None


def test_changed_outputs_keep_original(redundant_graph: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong(model: onnx.ModelProto, **kwargs: object) -> tuple[onnx.ModelProto, bool]:
        bad = onnx.ModelProto()
        bad.CopyFrom(model)
        bad.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full(4, 0.6, np.float32), "a"))
        return bad, True

    monkeypatch.setattr(onnxsim, "simplify", wrong)
    result = simplify(redundant_graph, tmp_path / "out.onnx", CHECK_INPUTS, rtol=1e-4, atol=1e-5)
    assert not result.simplified
    assert result.reason is not None and "changed outputs beyond rtol=0.0001, atol=1e-05" in result.reason
    assert "output 'y' at batch 1" in result.reason
    assert result.max_abs_diff == pytest.approx(0.1 * CHECK_INPUTS[1].max(), rel=1e-5)
    assert (tmp_path / "out.onnx").read_bytes() == redundant_graph.read_bytes()


def test_refuses_to_overwrite_input(redundant_graph: Path) -> None:
    before = redundant_graph.read_bytes()
    with pytest.raises(SameFileError):
        simplify(redundant_graph, redundant_graph, CHECK_INPUTS)
    assert redundant_graph.read_bytes() == before


def test_needs_check_inputs(redundant_graph: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one check input"):
        simplify(redundant_graph, tmp_path / "out.onnx", [])


class _SelfAttention(torch.nn.Module):
    """A hand-written, mask-free self-attention block (a Hugging Face encoder's after a width trace fixes
    ``attention_mask=None``): the pattern onnxsim 0.8 fuses into ``com.microsoft`` ``Attention``."""

    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head = heads, width // heads
        self.q, self.k, self.v, self.out = (torch.nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, s, w = x.shape  # the sequence length is static, the batch dynamic: constant reshape targets

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(-1, s, self.heads, self.head)

        q, v = heads(self.q(x)).transpose(1, 2), heads(self.v(x)).transpose(1, 2)
        scores = (q @ heads(self.k(x)).permute(0, 2, 3, 1)) * self.head**-0.5
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(-1, s, w))


def test_attention_stays_in_standard_ops(tmp_path: Path) -> None:
    """The simplified graph of a self-attention block keeps its standard MatMuls, and INT8 quantises every one:
    onnxsim 0.8 had fused them into com.microsoft Attention, which TensorRT cannot run and the INT8 quantiser left in
    float (with an onnxsim without that fusion, this holds with or without the fix)."""
    from minreal.export.int8 import quantize_int8

    torch.manual_seed(0)
    x = torch.randn(1, 6, 16)
    exported = to_onnx(_SelfAttention().eval(), x, tmp_path / "attention.onnx")
    checks = [x.numpy(), torch.randn(3, 6, 16).numpy()]
    result = simplify(exported.path, tmp_path / "attention.sim.onnx", checks)
    assert result.simplified, result.reason
    graph = onnx.load(result.path_out).graph
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"}
    weights = {i.name for i in graph.initializer}
    assert sum(n.op_type == "MatMul" and not weights & set(n.input) for n in graph.node) == 2  # the two products
    assert tensorrt_readiness(result.path_out)["ready"]
    quantize_int8(result.path_out, tmp_path / "attention.int8.onnx", calib=torch.randn(8, 6, 16).numpy())
    q = onnx.load(tmp_path / "attention.int8.onnx").graph
    dequantized = {o for n in q.node if n.op_type == "DequantizeLinear" for o in n.output}
    products = [n for n in q.node if n.op_type in ("MatMul", "Gemm")]
    assert len(products) >= 4 and all(set(n.input) - {""} <= dequantized for n in products)


def _model(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph)


def test_foreign_ops_are_new_ops_outside_the_standard_domain_in_any_subgraph() -> None:
    """A new op of a domain the exported graph already uses counts, as does one inside an If's branch; the
    ``ai.onnx`` alias and the ops the exported graph already has do not."""
    gelu = helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    before = _model([gelu, helper.make_node("Relu", ["y"], ["z"], domain="ai.onnx")])
    branch = helper.make_graph([helper.make_node("Attention", ["x"], ["b"], domain="com.microsoft")], "then", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])])
    after = _model([gelu, helper.make_node("Relu", ["y"], ["z"]),
                    helper.make_node("Attention", ["x"], ["a"], domain="com.microsoft"),
                    helper.make_node("If", ["c"], ["d"], then_branch=branch, else_branch=branch)])
    assert simplify_module._foreign_ops(before, after) == ["com.microsoft:Attention x3"]
    assert simplify_module._foreign_ops(before, before) == []


def _fused(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its nodes replaced by one Add and one com.microsoft FusedMatMul (what a fusion would write)."""
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    del fused.graph.node[:]
    fused.graph.node.extend([helper.make_node("Add", ["a", "b"], ["c"]),
                             helper.make_node("FusedMatMul", ["x", "c"], ["y"], domain="com.microsoft")])
    fused.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return fused


def test_ops_of_another_domain_simplify_again_without_fusions(redundant_graph: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A fusion of another onnxsim version that writes a com.microsoft op: the graph is simplified again without
    onnxsim's fusions (folding and shape inference), and that is kept."""
    real, calls = onnxsim.simplify, []

    def fusing(model: onnx.ModelProto, **kwargs: Any) -> tuple[onnx.ModelProto, bool]:
        calls.append(kwargs["perform_optimization"])
        assert set(CONTRIB_FUSIONS) <= set(kwargs["skipped_optimizers"])
        return (_fused(model), True) if kwargs["perform_optimization"] else real(model, **kwargs)

    monkeypatch.setattr(onnxsim, "simplify", fusing)
    result = simplify(redundant_graph, tmp_path / "out.onnx", CHECK_INPUTS)
    assert calls == [True, False] and result.simplified and result.reason is None
    assert {n.domain for n in onnx.load(result.path_out).graph.node} == {""}


def test_ops_of_another_domain_keep_original(redundant_graph: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A simplified graph bringing in an op outside the standard domain, even without onnxsim's fusions, is not
    kept; the reason names the op and its count."""
    monkeypatch.setattr(onnxsim, "simplify", lambda model, **kwargs: (_fused(model), True))
    result = simplify(redundant_graph, tmp_path / "out.onnx", CHECK_INPUTS)
    assert not result.simplified
    assert result.reason == ("onnxsim wrote ops outside the standard domain the exported graph does not have "
                             "(com.microsoft:FusedMatMul x1), which TensorRT and ONNX Runtime's INT8 quantiser may "
                             "not take")
    assert (tmp_path / "out.onnx").read_bytes() == redundant_graph.read_bytes()
