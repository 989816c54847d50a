"""Provider table, availability and fallback detection."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from minreal.facts import PROVIDERS
from minreal.runtime_bench.errors import UnknownProviderError
from minreal.runtime_bench.providers import available_providers, provider_mismatch, provider_name, unavailable_reason


def test_short_names_map_to_ort_names() -> None:
    assert provider_name("cpu") == "CPUExecutionProvider"
    assert provider_name("cuda") == "CUDAExecutionProvider"
    assert provider_name("tensorrt") == "TensorrtExecutionProvider"


def test_unknown_provider_lists_choices() -> None:
    with pytest.raises(UnknownProviderError, match="unknown provider 'rocm'.*cpu, cuda, tensorrt"):
        provider_name("rocm")


@pytest.mark.parametrize("short", sorted(PROVIDERS))
def test_unavailable_reason_matches_build(short: str) -> None:
    from minreal.runtime_bench.runtime import tensorrt_library_problem

    built = PROVIDERS[short] in ort.get_available_providers()
    if short == "tensorrt" and built:  # built in, yet unusable without TensorRT's own library
        built = tensorrt_library_problem() is None
    reason = unavailable_reason(short)
    assert (reason is None) == built
    assert (short in available_providers()) == built
    if not built:
        assert PROVIDERS[short] in reason and ort.__version__ in reason


def test_cpu_always_available() -> None:
    assert "cpu" in available_providers()


def test_provider_mismatch_detects_fallback() -> None:
    assert provider_mismatch("CPUExecutionProvider", ["CPUExecutionProvider"]) is None
    assert provider_mismatch("CUDAExecutionProvider", ["CUDAExecutionProvider", "CPUExecutionProvider"]) is None
    reason = provider_mismatch("CUDAExecutionProvider", ["CPUExecutionProvider"])
    assert reason is not None and "fell back" in reason and "CUDAExecutionProvider" in reason


def test_tensorrt_built_in_without_its_library_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime-gpu lists TensorrtExecutionProvider even where TensorRT's library cannot load; a session then
    silently runs on the CPU. The provider is unavailable, and the reason names the library and the install."""
    import ctypes
    import importlib
    import sys
    import types

    from minreal.runtime_bench import providers, runtime

    def no_library(name: str, *args: object, **kwargs: object) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    real_import = importlib.import_module

    def no_tensorrt(name: str) -> types.ModuleType:
        if name == "tensorrt":
            raise ImportError(name)
        return real_import(name)

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    monkeypatch.setattr(importlib, "import_module", no_tensorrt)
    fake_ort = types.SimpleNamespace(__version__="1.31.1", get_available_providers=lambda: [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(providers, "onnxruntime_module", lambda: fake_ort)
    runtime.tensorrt_library_problem.cache_clear()
    try:
        reason = unavailable_reason("tensorrt")
        assert reason is not None and runtime.TENSORRT_LIBRARY in reason and "minreal[tensorrt]" in reason
        assert unavailable_reason("cuda") is None
        assert providers.available_providers() == ("cpu", "cuda")  # the two functions agree
        fallback = provider_mismatch("TensorrtExecutionProvider", ["CPUExecutionProvider"])
        assert fallback is not None and "fell back" in fallback and runtime.TENSORRT_LIBRARY in fallback
    finally:
        runtime.tensorrt_library_problem.cache_clear()
