"""Tests for minreal.export.atomic: all-or-nothing writes, no leftovers, inputs protected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from minreal.export.atomic import atomic_path, atomic_write_bytes, ensure_distinct
from minreal.export.errors import SameFileError


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


def test_export_atomic_reexports_the_runtime_bench_writers() -> None:
    import minreal.runtime_bench.atomic as shared
    from minreal.export import atomic

    assert atomic.atomic_path is shared.atomic_path
    assert atomic.atomic_write_bytes is shared.atomic_write_bytes
    assert atomic.atomic_write_text is shared.atomic_write_text
