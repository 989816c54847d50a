"""Description of the machine and software a benchmark ran on."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort
import psutil

__all__ = ["Environment", "collect_environment", "cpu_model"]


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


def cpu_model() -> str:
    """CPU model name from ``/proc/cpuinfo`` where present, else :func:`platform.processor`."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def collect_environment(intra_op_threads: int) -> Environment:
    """Snapshot of this host for a run using ``intra_op_threads`` (spinning is always disabled)."""
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
    )
