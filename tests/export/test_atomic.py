"""Tests for minreal.export.atomic: all-or-nothing writes, no leftovers, inputs protected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from minreal.export.atomic import ensure_distinct
from minreal.export.errors import SameFileError
from minreal.runtime_bench.atomic import atomic_path, atomic_write_bytes


def test_writer_that_raises_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    with pytest.raises(OSError, match="disk on fire"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half a model")
        (tmp.parent / (tmp.name + ".data")).write_bytes(b"external weights")
        raise OSError("disk on fire")
    assert list(tmp_path.iterdir()) == []


def test_writer_that_raises_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"good old model")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"good old model"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_success_replaces_file_with_umask_permissions(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".json" and tmp != target
        tmp.write_text("new")
        assert target.read_text() == "old"  # not visible until the block ends
    assert target.read_text() == "new"
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_atomic_write_bytes(tmp_path: Path) -> None:
    assert atomic_write_bytes(tmp_path / "a.bin", b"\x00\x01").read_bytes() == b"\x00\x01"


def test_ensure_distinct_refuses_to_overwrite_input(tmp_path: Path) -> None:
    source = tmp_path / "in.onnx"
    with pytest.raises(SameFileError, match="is the input file"):
        ensure_distinct(source, tmp_path / "." / "in.onnx")
    ensure_distinct(source, tmp_path / "out.onnx")


def test_the_atomic_writers_have_one_home() -> None:
    """The writers are defined in runtime_bench.atomic only; export.atomic neither copies nor re-exports them."""
    import minreal.runtime_bench.atomic as shared
    from minreal.export import atomic

    writers = {"atomic_path", "atomic_write_bytes", "atomic_write_text"}
    assert writers <= set(shared.__all__)
    assert not writers & set(vars(atomic)), sorted(writers & set(vars(atomic)))
