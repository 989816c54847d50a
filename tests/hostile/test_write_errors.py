"""Write failures (permission, read-only file system, full disk) end in one line naming the output file.

Tests run as root, so the failures are simulated in :mod:`minreal.runtime_bench.atomic`'s namespace, in process,
through the console entry point ``minreal.app.cli.main``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minreal.runtime_bench import atomic

QUICK_BENCH = ["--batch", "1", "--warmup", "0", "--min-runs", "1", "--min-seconds", "0", "--repeats", "1", "-q"]


def _matmul_model(path: Path) -> Path:
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _fail_for(target: Path, real, err: int, match):
    """A stand-in for ``real`` that raises ``OSError(err)`` when ``match(args, kwargs, target)`` holds."""
    def fake(*args, **kwargs):
        if match(args, kwargs, target):
            raise OSError(err, os.strerror(err))
        return real(*args, **kwargs)
    return fake


def _in_folder(args, kwargs, target: Path) -> bool:
    return Path(kwargs.get("dir", "")).resolve() == target.parent.resolve()


def _onto_target(args, kwargs, target: Path) -> bool:
    return Path(args[1]).resolve() == target.resolve()


def _temp_of_target(args, kwargs, target: Path) -> bool:
    return Path(args[0]).name.startswith(f".{target.name}.") and "w" in (args[1] if len(args) > 1 else "r")


@pytest.mark.parametrize("where, err", [
    ("mkstemp", errno.EACCES),
    ("replace", errno.EROFS),
    ("open", errno.ENOSPC),
])
def test_write_failure_is_one_line_naming_the_output(where: str, err: int, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, run_cli: Callable) -> None:
    monkeypatch.chdir(tmp_path)
    model = _matmul_model(tmp_path / "m.onnx")
    target = tmp_path / "out" / "b.json"
    target.parent.mkdir()
    if where == "mkstemp":
        monkeypatch.setattr(atomic.tempfile, "mkstemp", _fail_for(target, atomic.tempfile.mkstemp, err, _in_folder))
    elif where == "replace":
        monkeypatch.setattr(atomic.os, "replace", _fail_for(target, atomic.os.replace, err, _onto_target))
    else:
        monkeypatch.setattr(atomic, "open", _fail_for(target, open, err, _temp_of_target), raising=False)
    code, _, stderr = run_cli(["bench", str(model), "--out", str(target), *QUICK_BENCH])
    assert code == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr
    assert lines[0].startswith(f"minreal: error: cannot write {target}: {os.strerror(err)}")
    assert os.listdir(target.parent) == []  # neither the report nor a temporary file is left
