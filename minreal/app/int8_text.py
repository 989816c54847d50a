"""INT8 records in words, for the console and report.md: a file's format, the nodes left in float and the likely cause
of an accuracy loss (what :mod:`minreal.app.report`, :mod:`minreal.app.single` and :mod:`minreal.app.pipeline` print
about an INT8 file)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minreal.export.settings import int8_format
from minreal.facts import ARM64_TARGET

__all__ = ["int8_format_text", "format_suffix", "node_names", "dropped_suffix", "roundtrip_summary", "int8_cause",
           "roundtrip_suffix"]


def int8_format_text(q: Mapping[str, Any]) -> str:
    """An INT8 record's format in words (:func:`minreal.export.settings.int8_format`), e.g. ``S8S8: symmetric int8
    activations, 8-bit per-channel int8 weights``; ``""`` for a record without its format."""
    if "weight_bits" not in q:
        return ""
    return int8_format(q.get("activation_type", "uint8"), bool(q.get("activation_symmetric")), q["weight_bits"],
                       q.get("weight_type", "int8"), bool(q.get("per_channel", True)))


def format_suffix(q: Mapping[str, Any]) -> str:
    """`` (U8S8: asymmetric uint8 activations, 7-bit per-channel int8 weights; cpu resolved for this CPU)`` for an
    INT8 line: the file's format."""
    if "weight_bits" not in q:
        return ""
    resolved = "; `cpu` resolved for this CPU" if q.get("requested_target") == "cpu" else ""
    saturates = "; CAN SATURATE on this CPU (x86 without VNNI)" if q.get("saturates_here") else ""
    return f" ({int8_format_text(q)}{resolved}{saturates})"


def node_names(nodes: list[str], first: int = 5) -> str:
    """The first ``first`` node names, then how many there are in all."""
    return ", ".join(nodes[:first]) + (f", ... ({len(nodes)} in all)" if len(nodes) > first else "")


def dropped_suffix(nodes: list[str]) -> str:
    """``; left in float ...`` for an INT8 line: nodes a first quantisation ran in float between a dequantise and a
    re-quantise, whose Q/DQ pairs a second quantisation removed (``QuantConfig.drop_roundtrips``); ``""`` for none."""
    if not nodes:
        return ""
    return f"; left in float without Q/DQ pairs (no integer kernel; the pairs only cost time): {node_names(nodes)}"


def roundtrip_summary(roundtrips: Mapping[str, int]) -> str:
    """``N node(s) run in float between a dequantise and a re-quantise: Pad 3, ...`` from an INT8 record's
    ``float_roundtrips`` (ops that ORT's CPU graph runs in float between a DequantizeLinear and a QuantizeLinear:
    pure overhead, why such a file can be slower than fp32); ``""`` when there are none."""
    if not roundtrips:
        return ""
    ops = ", ".join(f"{op} {n}" for op, n in roundtrips.items())
    return f"{sum(roundtrips.values())} node(s) run in float between a dequantise and a re-quantise: {ops}"


def int8_cause(quantization: Mapping[str, Any]) -> str:
    """The likely cause of an INT8 file's accuracy loss, from its record's ``quantization`` (a
    :class:`~minreal.export.int8.QuantResult` as JSON): saturation on this CPU, non-finite scales, float round
    trips, else the quantisation of its layers."""
    if quantization.get("saturates_here") and quantization.get("target") == "tensorrt":
        return ("saturation of ONNX Runtime's int16 step on this CPU (x86 without VNNI), which TensorRT on a GPU "
                "does not have: its accuracy here understates the GPU's")
    if quantization.get("saturates_here") and quantization.get("target") == ARM64_TARGET:
        return ("saturation of ONNX Runtime's int16 step on this CPU (x86 without VNNI, where the int8 activations "
                "run as uint8), which ARM's kernels do not have: its accuracy here understates ARM's")
    if quantization.get("saturates_here"):
        return ("saturation: its 8-bit weights overflow ONNX Runtime's int16 step on this CPU (x86 without VNNI), "
                "so its accuracy here is not a VNNI CPU's; quantise with --quant-target cpu-avx2 (what cpu picks here)")
    if quantization.get("nonfinite_nodes"):
        return (f"non-finite calibration scales (an infinite value such as a -inf mask) around "
                f"{len(quantization['nonfinite_nodes'])} node(s), left in float")
    if summary := roundtrip_summary(quantization.get("float_roundtrips") or {}):
        return f"{summary} (each adds a dequantise/re-quantise error)"
    bits = " with 7-bit weights (cpu-avx2)" if quantization.get("weight_bits") == 7 else ""
    return (f"the rounding of its layers{bits}; `minreal tune` leaves the most sensitive layers in float "
            "(accuracy control)")


def roundtrip_suffix(roundtrips: Mapping[str, int]) -> str:
    """``; N node(s) run in float ...`` for an INT8 line (:func:`roundtrip_summary`); ``""`` when there are none."""
    summary = roundtrip_summary(roundtrips)
    return f"; {summary}" if summary else ""
