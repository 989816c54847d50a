"""The ONNX Runtime wheel: imported on first use, with one line saying what to install when it is missing.

minreal's base install carries no ONNX Runtime wheel, because the CPU wheel (``onnxruntime``) and the GPU wheel
(``onnxruntime-gpu``) own the same ``onnxruntime`` module and break each other when both are installed. A user
picks one through an extra: ``pip install 'minreal[cpu]'`` or ``pip install 'minreal[gpu]'``. Every module of
the project reaches onnxruntime through :func:`onnxruntime_module`, so importing the package, ``minreal --help``
and everything that needs no runtime keep working without one.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from types import ModuleType

from minreal.facts import PROVIDERS

__all__ = ["RUNTIME_WHEELS", "RuntimeMissingError", "onnxruntime_module", "installed_wheels", "wheel_conflict"]

#: Distribution name -> the minreal extra that installs it.
RUNTIME_WHEELS: dict[str, str] = {"onnxruntime": "cpu", "onnxruntime-gpu": "gpu"}

_MISSING = ("ONNX Runtime is not installed (minreal's base install has no runtime wheel): "
            "pip install 'minreal[cpu]' for the CPU provider, or 'minreal[gpu]' for CUDA/TensorRT")


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
