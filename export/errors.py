"""Errors raised by the export stage.

Each error subclasses a built-in (``ValueError`` for bad arguments or data, ``RuntimeError`` for a
stage that ran and failed) and carries a one-line message naming the culprit and what to do.
"""

from __future__ import annotations

__all__ = [
    "CalibrationError",
    "ExportError",
    "OrtConversionError",
    "ParityError",
    "QuantizationError",
    "SameFileError",
]


class ExportError(RuntimeError):
    """Neither ONNX exporter could convert the module (names the module and the op)."""


class OrtConversionError(RuntimeError):
    """ONNX Runtime's converter could not write an ORT-format model (names the file and the converter's error)."""


class ParityError(RuntimeError):
    """ONNX Runtime outputs differ from the torch module beyond the stated tolerance.

    Attributes
    ----------
    result
        the full :class:`minreal.export.verify.ParityResult` with every measured check.
    """

    def __init__(self, message: str, result: object | None = None) -> None:
        super().__init__(message)
        self.result = result


class CalibrationError(ValueError):
    """Calibration data is missing or does not fit the model's input."""


class QuantizationError(RuntimeError):
    """ONNX Runtime quantisation failed for the given model."""


class SameFileError(ValueError):
    """An output path points at an input file; inputs are never overwritten."""
