"""The environment record: GPUs from nvidia-smi (a stand-in script here), CUDA library wheels, ORT wheels."""

from __future__ import annotations

import os
import shutil
import stat
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from minreal.runtime_bench.environment import (
    NVIDIA_SMI_QUERY,
    GpuInfo,
    collect_environment,
    gpus,
    parse_nvidia_smi,
    wheel_versions,
)

SMI_OUTPUT = "NVIDIA H200, 143771 MiB, 570.86.15\nNVIDIA H200, 143771 MiB, 570.86.15\n"


def _fake_smi(folder: Path, body: str) -> Path:
    """An executable ``nvidia-smi`` in ``folder`` running ``body`` (a shell script)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_parse_nvidia_smi() -> None:
    assert parse_nvidia_smi(SMI_OUTPUT) == (GpuInfo("NVIDIA H200", 143771, "570.86.15"),) * 2
    assert parse_nvidia_smi("Tesla T4, [N/A], 535.104.05\n\n") == (GpuInfo("Tesla T4", None, "535.104.05"),)
    assert parse_nvidia_smi("") == ()


def test_gpus_read_from_nvidia_smi_with_the_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the stand-in answers only the exact query minreal sends
    _fake_smi(tmp_path / "bin", f'[ "$*" = "{" ".join(NVIDIA_SMI_QUERY)}" ] || exit 9\nprintf "{SMI_OUTPUT}"')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert gpus() == (GpuInfo("NVIDIA H200", 143771, "570.86.15"),) * 2
    assert collect_environment(1).gpus == gpus()


@pytest.mark.parametrize("body", ["echo 'NVIDIA H200, 1 MiB, 1'; exit 3", f"exec {shutil.which('sleep')} 30"])
def test_failing_or_hanging_nvidia_smi_gives_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    _fake_smi(tmp_path / "bin", body)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    start = time.monotonic()
    assert gpus(timeout_s=0.5) is None
    assert time.monotonic() - start < 10  # a hanging nvidia-smi is cut off by the timeout


def test_no_nvidia_smi_gives_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus() is None and collect_environment(1).gpus is None


def test_wheel_versions() -> None:
    import onnx

    assert wheel_versions(["no-such-wheel-minreal", "onnx"]) == f"{onnx.__version__} (onnx)"
    assert wheel_versions(["no-such-wheel-minreal"]) is None


def test_environment_records_runtime_wheels_and_a_broken_install(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime

    env = collect_environment(2)
    assert f"onnxruntime {onnxruntime.__version__}" in env.onnxruntime_wheels or any(
        w.startswith("onnxruntime-gpu ") for w in env.onnxruntime_wheels)
    keys = {"gpus", "cuda_runtime", "cudnn", "tensorrt", "onnxruntime_cuda_build", "onnxruntime_wheels",
            "onnxruntime_install_problem"}
    assert keys <= set(asdict(env))
    # a second runtime wheel (its metadata only) on the path: both installed is recorded as a broken install
    other = "onnxruntime_gpu" if env.onnxruntime_wheels[0].startswith("onnxruntime ") else "onnxruntime"
    info = tmp_path / f"{other}-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {other.replace('_', '-')}\nVersion: 9.9.9\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = collect_environment(2)
    assert len(broken.onnxruntime_wheels) == 2 and f"{other.replace('_', '-')} 9.9.9" in broken.onnxruntime_wheels
    assert "onnxruntime-gpu" in broken.onnxruntime_install_problem


def test_markdown_shows_gpus_and_library_versions(bench_report, tmp_path: Path) -> None:
    from minreal.runtime_bench import write_markdown

    report, _ = bench_report
    env = replace(report.environment, gpus=(GpuInfo("NVIDIA H200", 143771, "570.86.15"),), cudnn="9.10.2.21 (x)")
    text = write_markdown(replace(report, environment=env), tmp_path / "r.md").read_text()
    assert "- gpus: NVIDIA H200 (143771 MiB, driver 570.86.15)" in text and "- cudnn: 9.10.2.21 (x)" in text
    for key in ("cuda_runtime", "tensorrt", "onnxruntime_cuda_build", "onnxruntime_wheels",
                "onnxruntime_install_problem"):
        assert f"- {key}: " in text


def test_environment_records_the_int8_instruction_sets() -> None:
    from minreal.runtime_bench.cpu import cpu_int8_target, cpu_isa, u8s8_saturates

    env = collect_environment(1)
    assert env.cpu_flags == cpu_isa().flags and env.int8_u8s8_saturates == u8s8_saturates()
    assert env.cpu_int8_target == cpu_int8_target() and env.cpu_int8_target in ("cpu-vnni", "cpu-avx2")
