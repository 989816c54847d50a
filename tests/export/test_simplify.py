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
    """The simplified graph of a self-attention block keeps its standard MatMuls: no com.microsoft kernel, which
    TensorRT cannot run and the INT8 quantiser leaves in float; outputs equal within the default tolerance."""
    torch.manual_seed(0)
    x = torch.randn(1, 6, 16)
    exported = to_onnx(_SelfAttention().eval(), x, tmp_path / "attention.onnx")
    checks = [x.numpy(), torch.randn(3, 6, 16).numpy()]
    result = simplify(exported.path, tmp_path / "attention.sim.onnx", checks)
    assert result.simplified, result.reason
    graph = onnx.load(result.path_out).graph
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"}
    assert sum(n.op_type in ("MatMul", "Gemm") for n in graph.node) == 6  # 4 projections, the 2 attention products
    assert tensorrt_readiness(result.path_out)["ready"]


def test_ops_of_another_domain_keep_original(redundant_graph: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A simplified graph bringing in an op outside the exported graph's domains is not kept, whatever onnxsim
    version wrote it; the reason names the op and its count."""
    def contrib(model: onnx.ModelProto, **kwargs: object) -> tuple[onnx.ModelProto, bool]:
        assert set(CONTRIB_FUSIONS) <= set(kwargs["skipped_optimizers"])
        fused = onnx.ModelProto()
        fused.CopyFrom(model)
        del fused.graph.node[:]
        fused.graph.node.extend([helper.make_node("Add", ["a", "b"], ["c"]),
                                 helper.make_node("FusedMatMul", ["x", "c"], ["y"], domain="com.microsoft")])
        fused.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return fused, True

    monkeypatch.setattr(onnxsim, "simplify", contrib)
    result = simplify(redundant_graph, tmp_path / "out.onnx", CHECK_INPUTS)
    assert not result.simplified
    assert result.reason == ("onnxsim wrote ops outside the exported graph's domains (com.microsoft:FusedMatMul x1), "
                             "which TensorRT and ONNX Runtime's INT8 quantiser do not take")
    assert (tmp_path / "out.onnx").read_bytes() == redundant_graph.read_bytes()
