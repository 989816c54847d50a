"""Execution-provider names: the short-name table and what this onnxruntime build offers."""

from __future__ import annotations

from collections.abc import Sequence

from minreal.facts import INSTALL_HINTS, PROVIDERS

from .errors import ProviderUnavailableError, UnknownProviderError
from .runtime import onnxruntime_module, tensorrt_library_problem, wheel_conflict

__all__ = [
    "provider_name",
    "available_providers",
    "unavailable_reason",
    "require_available",
    "provider_mismatch",
]


def provider_name(short: str) -> str:
    """Return the onnxruntime provider name for a short name such as ``"cuda"``.

    Raises
    ------
    UnknownProviderError
        ``short`` is not in :data:`PROVIDERS`.
    """
    try:
        return PROVIDERS[short]
    except KeyError:
        known = ", ".join(PROVIDERS)
        raise UnknownProviderError(f"unknown provider {short!r}; choose one of: {known}") from None


def available_providers() -> tuple[str, ...]:
    """Short names of the table's providers that can run here: built into this onnxruntime, and for TensorRT with
    its library loadable (:func:`unavailable_reason` is None for exactly these)."""
    return tuple(short for short in PROVIDERS if unavailable_reason(short) is None)


def unavailable_reason(short: str) -> str | None:
    """Why provider ``short`` cannot run with this onnxruntime build, or None if it can.

    A built-in TensorRT provider can still not run: its TensorRT library must load too
    (:func:`~minreal.runtime_bench.runtime.tensorrt_library_problem`), else onnxruntime falls back to the CPU.
    """
    full = provider_name(short)
    ort = onnxruntime_module()
    built = ort.get_available_providers()
    if full in built:
        return tensorrt_library_problem() if short == "tensorrt" else None
    conflict = wheel_conflict()
    return (
        f"{full} is not in this onnxruntime {ort.__version__} build "
        f"(built: {', '.join(built)}); " + (conflict or f"install a build that has it: {INSTALL_HINTS[short]}")
    )


def require_available(shorts: Sequence[str]) -> None:
    """Fail before any work when a requested provider cannot run with this onnxruntime build.

    Raises
    ------
    UnknownProviderError
        a name is not in :data:`PROVIDERS`.
    ProviderUnavailableError
        one line naming each unavailable provider, why, and what installs it.
    """
    reasons = [f"provider {s} is unavailable: {r}" for s in shorts if (r := unavailable_reason(s)) is not None]
    if reasons:
        raise ProviderUnavailableError("; ".join(reasons))


def provider_mismatch(requested: str, actual: list[str]) -> str | None:
    """Compare a requested provider with ``session.get_providers()``.

    Returns
    -------
    str | None
        None when ``requested`` is the session's primary provider, else a one-line reason
        (onnxruntime silently falls back to CPU when a provider fails to initialise).
    """
    if actual and actual[0] == requested:
        return None
    why = tensorrt_library_problem() if requested == PROVIDERS["tensorrt"] else None
    reason = f"requested {requested} but the session runs on {actual} (onnxruntime fell back)"
    return f"{reason}: {why}" if why else reason
