"""The ONNX Runtime wheel: imported on first use, with one line saying what to install when it is missing.

minreal's base install carries no ONNX Runtime wheel, because the CPU wheel (``onnxruntime``) and the GPU wheel
(``onnxruntime-gpu``) own the same ``onnxruntime`` module and break each other when both are installed. A user
picks one through an extra: ``pip install 'minreal[cpu]'`` or ``pip install 'minreal[gpu]'``. Every module of
the project reaches onnxruntime through :func:`onnxruntime_module`, so importing the package, ``minreal --help``
and everything that needs no runtime keep working without one.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import importlib.metadata
import logging
import sys
from types import ModuleType

from minreal.facts import INSTALL_HINTS, PROVIDERS

__all__ = ["RUNTIME_WHEELS", "RuntimeMissingError", "TENSORRT_LIBRARY", "onnxruntime_module", "installed_wheels",
           "wheel_conflict", "tensorrt_library_problem"]

#: Distribution name -> the minreal extra that installs it.
RUNTIME_WHEELS: dict[str, str] = {"onnxruntime": "cpu", "onnxruntime-gpu": "gpu"}

_MISSING = ("ONNX Runtime is not installed (minreal's base install has no runtime wheel): "
            "pip install 'minreal[cpu]' for the CPU provider, or 'minreal[gpu]' for CUDA/TensorRT")


#: TensorRT's core library, which ONNX Runtime's TensorRT provider (built against TensorRT 10) needs by this name.
TENSORRT_LIBRARY = "libnvinfer.so.10"


class RuntimeMissingError(ImportError):
    """onnxruntime cannot be imported; the message says which extra installs it."""


def installed_wheels() -> list[str]:
    """The ONNX Runtime distributions installed in this environment (of :data:`RUNTIME_WHEELS`), sorted."""
    found = []
    for name in RUNTIME_WHEELS:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found.append(name)
    return sorted(found)


def wheel_conflict(wheels: list[str] | None = None) -> str | None:
    """One line when both the CPU and the GPU wheel are installed (they overwrite each other's ``onnxruntime``
    module, and the CUDA provider is then usually lost), saying how to fix it; ``None`` otherwise."""
    wheels = installed_wheels() if wheels is None else wheels
    if set(RUNTIME_WHEELS) - set(wheels):
        return None
    return ("both onnxruntime and onnxruntime-gpu are installed; they share one module and the GPU providers are "
            "lost: pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'minreal[gpu]' (or 'minreal[cpu]')")


def onnxruntime_module() -> ModuleType:
    """``import onnxruntime``, or :class:`RuntimeMissingError` naming the extra to install.

    Raises
    ------
    RuntimeMissingError
        no ONNX Runtime wheel can be imported.
    """
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError as exc:
        raise RuntimeMissingError(_MISSING) from exc
    _preload(ort)
    return ort


@functools.cache
def _preload(ort: ModuleType) -> None:
    """Load the CUDA and cuDNN libraries that the GPU wheel's ``cuda``/``cudnn`` extras installed, so its CUDA and
    TensorRT providers find them without LD_LIBRARY_PATH (once per process; a no-op for the CPU wheel)."""
    if not hasattr(ort, "preload_dlls") or PROVIDERS["cuda"] not in ort.get_available_providers():
        return
    try:
        ort.preload_dlls()
    except Exception as exc:
        logging.getLogger(__name__).info("onnxruntime.preload_dlls failed (%s); relying on the loader's search path",
                                         exc)


@functools.cache
def tensorrt_library_problem() -> str | None:
    """Load TensorRT's libraries for ONNX Runtime's TensorRT provider, once per process.

    The provider's library needs :data:`TENSORRT_LIBRARY` from the loader's search path. TensorRT's wheels keep it
    in their ``tensorrt_libs`` package, off that path, and ``import tensorrt`` loads it from there (TensorRT's own
    loader); once a library of that name is in the process, the provider finds it. Without it onnxruntime lists the
    provider as available, logs an error when a session asks for it and silently runs on the CPU instead (seen on an
    H200 machine with onnxruntime-gpu 1.31 and no TensorRT, ``benchmarks/gpu.json``).

    Returns
    -------
    str | None
        None when the library is loaded (or on a platform other than Linux, where it is not checked), else one line
        saying why not and what installs it.
    """
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(Exception):  # not installed, or its own loader failed: the check below says what
        importlib.import_module("tensorrt")  # is missing
    try:
        ctypes.CDLL(TENSORRT_LIBRARY)
    except OSError as exc:
        return (f"TensorRT's library {TENSORRT_LIBRARY} cannot be loaded ({exc}), so onnxruntime would run the "
                f"session on the CPU instead; install TensorRT 10: {INSTALL_HINTS['tensorrt']}")
    return None
