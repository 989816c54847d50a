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
    built = PROVIDERS[short] in ort.get_available_providers()
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
