"""Description of the machine and software a benchmark ran on."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import onnx
import psutil

from .cpu import cpu_int8_target, cpu_isa, cpuinfo_text, u8s8_saturates
from .load import MachineLoad, machine_load
from .runtime import installed_wheels, onnxruntime_module, wheel_conflict

__all__ = ["GpuInfo", "Environment", "collect_environment", "cpu_model", "gpus", "parse_nvidia_smi",
           "wheel_versions", "NVIDIA_SMI_QUERY"]

#: The ``nvidia-smi`` arguments whose output :func:`parse_nvidia_smi` reads.
NVIDIA_SMI_QUERY: tuple[str, ...] = ("--query-gpu=name,memory.total,driver_version", "--format=csv,noheader")
#: Wheels that carry the CUDA runtime, cuDNN and TensorRT libraries (none of them is torch).
CUDA_WHEELS: tuple[str, ...] = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime")
CUDNN_WHEELS: tuple[str, ...] = ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13")
TENSORRT_WHEELS: tuple[str, ...] = ("tensorrt", "tensorrt-cu12", "tensorrt-cu13")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as ``nvidia-smi`` lists it; ``memory_mib`` is None when it reports none."""

    name: str
    memory_mib: int | None
    driver_version: str


@dataclass(frozen=True)
class Environment:
    """Host, versions and thread settings recorded with every report."""

    cpu_model: str
    physical_cores: int | None
    logical_cores: int | None
    os: str
    python: str
    onnxruntime: str
    onnx: str
    available_providers: tuple[str, ...]
    intra_op_threads: int
    inter_op_threads: int
    thread_spinning: bool
    omp_wait_policy: str | None
    gpus: tuple[GpuInfo, ...] | None = None
    cuda_runtime: str | None = None
    cudnn: str | None = None
    tensorrt: str | None = None
    onnxruntime_cuda_build: str | None = None
    onnxruntime_wheels: tuple[str, ...] = ()
    onnxruntime_install_problem: str | None = None
    cpu_flags: tuple[str, ...] = ()
    """The instruction sets that decide ONNX Runtime's int8 kernels (:data:`minreal.runtime_bench.cpu.ISA_FLAGS`)."""
    cpu_flags_source: str = "unknown"
    int8_u8s8_saturates: bool | None = None
    """Measured: this ONNX Runtime's uint8 × int8 kernel saturates here
    (:func:`minreal.runtime_bench.cpu.u8s8_saturates`)."""
    cpu_int8_target: str | None = None
    """What ``--quant-target cpu`` means on this machine (``cpu-vnni`` or ``cpu-avx2``)."""
    machine_load: MachineLoad | None = None
    """How busy the machine was over the run (:class:`minreal.runtime_bench.load.MachineLoad`); a release gate
    compares it between a baseline and a report."""


def cpu_model() -> str:
    """CPU model name from ``/proc/cpuinfo`` where present, else :func:`platform.processor`."""
    for line in (cpuinfo_text() or "").splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def parse_nvidia_smi(text: str) -> tuple[GpuInfo, ...]:
    """GPUs from ``nvidia-smi`` output for :data:`NVIDIA_SMI_QUERY` (``NVIDIA H200, 143771 MiB, 570.86.15``)."""
    found = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.rsplit(",", 2)]
        if len(fields) == 3 and fields[0]:
            memory = fields[1].split()
            mib = int(memory[0]) if memory and memory[0].isdigit() and memory[-1] == "MiB" else None
            found.append(GpuInfo(fields[0], mib, fields[2]))
    return tuple(found)


def gpus(timeout_s: float = 5.0) -> tuple[GpuInfo, ...] | None:
    """This host's GPUs from ``nvidia-smi`` (run with a timeout); None when it is absent, fails or hangs."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else None


def wheel_versions(names: Sequence[str]) -> str | None:
    """``version (wheel)`` of each of ``names`` that is installed, comma-separated; None when none is."""
    found = []
    for name in names:
        try:
            found.append(f"{importlib.metadata.version(name)} ({name})")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(found) or None


def _onnxruntime_cuda_build() -> str | None:
    """The CUDA version onnxruntime was built for (GPU wheels record it), or None."""
    try:
        info = importlib.import_module("onnxruntime.capi.build_and_package_info")
    except ImportError:
        return None
    version = getattr(info, "cuda_version", None)
    return str(version) if version else None


def collect_environment(intra_op_threads: int, since: tuple[float, float | None] | None = None) -> Environment:
    """Snapshot of this host for a run using ``intra_op_threads`` (spinning is always disabled).

    ``since`` is the run's :func:`minreal.runtime_bench.load.cpu_counters` at its start: the machine load then
    covers the run (steal time between the two readings).

    GPUs, CUDA, cuDNN and TensorRT are read without torch: ``nvidia-smi``, the NVIDIA library wheels' metadata
    and onnxruntime's build info; each is None where it cannot be found.
    """
    ort = onnxruntime_module()
    wheels = installed_wheels()
    isa, saturates = cpu_isa(), u8s8_saturates()
    return Environment(
        cpu_model=cpu_model(),
        physical_cores=psutil.cpu_count(logical=False),
        logical_cores=psutil.cpu_count(logical=True),
        os=platform.platform(),
        python=sys.version.split()[0],
        onnxruntime=ort.__version__,
        onnx=onnx.__version__,
        available_providers=tuple(ort.get_available_providers()),
        intra_op_threads=intra_op_threads,
        inter_op_threads=1,
        thread_spinning=False,
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
        gpus=gpus(),
        cuda_runtime=wheel_versions(CUDA_WHEELS),
        cudnn=wheel_versions(CUDNN_WHEELS),
        tensorrt=wheel_versions(TENSORRT_WHEELS),
        onnxruntime_cuda_build=_onnxruntime_cuda_build(),
        onnxruntime_wheels=tuple(f"{w} {importlib.metadata.version(w)}" for w in wheels),
        onnxruntime_install_problem=wheel_conflict(wheels),
        cpu_flags=isa.flags,
        cpu_flags_source=isa.source,
        int8_u8s8_saturates=saturates,
        cpu_int8_target=cpu_int8_target(isa, saturates),
        machine_load=machine_load(since),
    )
