"""Tests for minreal.export.onnx_files: ONNX graphs and their external data written, copied and moved as one unit."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minreal.export import onnx_files
from minreal.export.errors import SameFileError
from minreal.export.onnx_files import copy_onnx, data_files, move_onnx, onnx_size, staged_onnx
from minreal.runtime_bench.atomic import OutputWriteError
from minreal.runtime_bench.sessions import create_session

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def _model(scale: float) -> onnx.ModelProto:
    """y = (x @ w1) @ w2 with 4x64 and 64x3 weights (big enough to leave the graph as external data)."""
    w1 = numpy_helper.from_array(np.full((4, 64), scale, np.float32), "w1")
    w2 = numpy_helper.from_array(np.linspace(-1, 1, 192, dtype=np.float32).reshape(64, 3), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save(path: Path, scale: float = 0.5, location: str | None = "weights.bin", one_file: bool = True) -> Path:
    """Save :func:`_model` at ``path``: embedded (``location=None``) or with external data."""
    if location is None:
        onnx.save_model(_model(scale), str(path))
    else:
        onnx.save_model(_model(scale), str(path), save_as_external_data=True, all_tensors_to_one_file=one_file,
                        location=location, size_threshold=0)
    return path


def _run(path: Path) -> np.ndarray:
    return create_session(path).run(None, {"x": X})[0]


def _locations(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}


def test_copy_puts_the_data_beside_the_new_graph_under_its_name(tmp_path: Path) -> None:
    src = _save(tmp_path / "a.onnx")
    expected = _run(src)
    out = tmp_path / "sub" / "b.onnx"
    out.parent.mkdir()
    copy_onnx(src, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.onnx", "b.onnx.data"]
    assert _locations(out) == {"b.onnx.data"}
    assert data_files(out) == [out.parent / "b.onnx.data"]
    np.testing.assert_array_equal(_run(out), expected)
    assert (tmp_path / "weights.bin").exists() and _run(src).shape == (2, 3)  # the source is untouched
    assert onnx_size(out) == out.stat().st_size + (out.parent / "b.onnx.data").stat().st_size


def test_move_removes_the_source_graph_and_data(tmp_path: Path) -> None:
    src = _save(tmp_path / "a.onnx")
    expected = _run(src)
    out = move_onnx(src, tmp_path / "b.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.onnx", "b.onnx.data"]
    np.testing.assert_array_equal(_run(out), expected)


def test_move_of_an_embedded_graph_has_no_data_file(tmp_path: Path) -> None:
    src = _save(tmp_path / "a.onnx", location=None)
    expected = _run(src)
    move_onnx(src, tmp_path / "b.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["b.onnx"]
    assert data_files(tmp_path / "b.onnx") == []
    np.testing.assert_array_equal(_run(tmp_path / "b.onnx"), expected)


def test_a_file_per_tensor_is_gathered_into_one_data_file(tmp_path: Path) -> None:
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = _save(src_dir / "a.onnx", location="unused", one_file=False)  # one file per tensor, named after it
    assert len(data_files(src)) == 2
    expected = _run(src)
    out = copy_onnx(src, tmp_path / "b.onnx")
    assert _locations(out) == {"b.onnx.data"}
    offsets = [int(e.value) for t in onnx.load(str(out), load_external_data=False).graph.initializer
               for e in t.external_data if e.key == "offset"]
    assert all(o % 4096 == 0 for o in offsets)
    np.testing.assert_array_equal(_run(out), expected)


def test_refuses_to_overwrite_the_input_or_its_data(tmp_path: Path) -> None:
    src = _save(tmp_path / "a.onnx", location="b.onnx.data")
    with pytest.raises(SameFileError, match="is the input file"):
        copy_onnx(src, tmp_path / "." / "a.onnx")
    with pytest.raises(SameFileError, match="is a file of the input model"):
        move_onnx(src, tmp_path / "b.onnx")  # b.onnx.data is the input's data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "b.onnx.data"]


def _fail_on_graph_move(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the move of the new graph onto ``target`` fail with ENOSPC, after its data was moved in."""
    real = os.replace

    def fake(src: object, dst: object) -> None:
        if Path(dst) == target and Path(src).name == target.name:  # the staged graph, not the old one put back
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(src, dst)

    monkeypatch.setattr(onnx_files.os, "replace", fake)


def test_failed_move_leaves_no_half_written_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "in").mkdir()
    src = _save(tmp_path / "in" / "a.onnx")
    out = tmp_path / "out" / "b.onnx"
    out.parent.mkdir()
    _fail_on_graph_move(out, monkeypatch)
    with pytest.raises(OutputWriteError, match=f"cannot write {out}: No space left on device"):
        move_onnx(src, out)
    assert list(out.parent.iterdir()) == []  # neither the data file nor a temporary folder is left
    assert sorted(p.name for p in src.parent.iterdir()) == ["a.onnx", "weights.bin"]  # the source is kept


def test_failed_replace_restores_the_previous_graph_and_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "b.onnx"
    copy_onnx(_save(tmp_path / "old.onnx", scale=0.25), out)
    before = {p.name: p.read_bytes() for p in (out, tmp_path / "b.onnx.data")}
    src = _save(tmp_path / "new.onnx", scale=2.0, location="new.bin")
    _fail_on_graph_move(out, monkeypatch)
    with pytest.raises(OutputWriteError):
        copy_onnx(src, out)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in (out, tmp_path / "b.onnx.data")} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.onnx", "b.onnx.data", "new.bin", "new.onnx",
                                                          "old.onnx", "weights.bin"]


def test_replacing_with_an_embedded_graph_drops_the_old_data_file(tmp_path: Path) -> None:
    out = copy_onnx(_save(tmp_path / "old.onnx"), tmp_path / "b.onnx")
    assert (tmp_path / "b.onnx.data").exists()
    copy_onnx(_save(tmp_path / "new.onnx", location=None), out)
    assert not (tmp_path / "b.onnx.data").exists() and data_files(out) == []


def test_writer_that_raises_publishes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "m.onnx"
    with pytest.raises(RuntimeError, match="exporter crashed"), staged_onnx(target) as staged:
        _save(staged, location=f"{staged.name}.data")
        raise RuntimeError("exporter crashed")
    assert list(tmp_path.iterdir()) == []
