"""The ONNX Runtime wheel is optional at import: a base install says which extra to install, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minreal.runtime_bench.runtime import RuntimeMissingError, onnxruntime_module, wheel_conflict

_NO_ORT = "import sys\nsys.modules['onnxruntime'] = None  # every import of onnxruntime now fails\n"


def test_both_wheels_are_a_conflict_with_its_fix() -> None:
    line = wheel_conflict(["onnxruntime", "onnxruntime-gpu"])
    assert line is not None and "pip uninstall -y onnxruntime onnxruntime-gpu" in line and "\n" not in line
    assert wheel_conflict(["onnxruntime"]) is None and wheel_conflict(["onnxruntime-gpu"]) is None
    assert wheel_conflict([]) is None


def test_missing_runtime_names_the_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(RuntimeMissingError, match=r"minreal\[cpu\].*minreal\[gpu\]"):
        onnxruntime_module()


def _without_ort(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(_NO_ORT)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=False)


def test_cli_without_a_runtime_prints_one_line_not_a_traceback(tmp_path: Path) -> None:
    helped = _without_ort(tmp_path, "-m", "minreal.app.cli", "--help")
    assert helped.returncode == 0 and "bench" in helped.stdout
    (tmp_path / "m.onnx").write_bytes(b"")
    done = _without_ort(tmp_path, "-m", "minreal.app.cli", "bench", str(tmp_path / "m.onnx"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "ONNX Runtime is not installed" in lines[0] and "minreal[cpu]" in lines[0]
    assert "Traceback" not in done.stderr


def test_library_imports_without_a_runtime(tmp_path: Path) -> None:
    code = ("import runtime_bench, minreal.runtime_bench.bench, minreal.runtime_bench.worker, "
            "minreal.export.int8.quantize, minreal.export.verify, minreal.app.pipeline; print('ok')")
    done = _without_ort(tmp_path, "-c", code)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
