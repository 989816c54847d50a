"""Errors raised by :mod:`runtime_bench`; each message is one line naming the culprit."""

from __future__ import annotations

from minreal.facts import FieldError

__all__ = [
    "BenchInputError",
    "ModelFileError",
    "UnknownProviderError",
    "WorkerError",
    "ProviderUnavailableError",
    "SessionError",
    "ReportSchemaError",
    "CheckError",
]


class BenchInputError(FieldError):
    """Bad benchmark input: data, shapes, dtypes or configuration values (a :class:`minreal.facts.FieldError`: a
    configuration value's message names its field)."""


class ModelFileError(BenchInputError):
    """A model file is missing or is not a readable ONNX model."""


class UnknownProviderError(BenchInputError):
    """A provider short name is not in the provider table."""


class WorkerError(RuntimeError):
    """A benchmark worker process failed or returned an unreadable result."""


class ProviderUnavailableError(RuntimeError):
    """A provider cannot run here (not built in, or onnxruntime fell back to another one)."""


class SessionError(RuntimeError):
    """onnxruntime could not create a session for a model (invalid graph, unsupported op, ...)."""


class ReportSchemaError(ValueError):
    """A report file is missing, unreadable or has an unsupported schema version."""


class CheckError(FieldError):
    """A release-gate threshold cannot be evaluated against the given report (a :class:`minreal.facts.FieldError`:
    the message names the threshold's parameter)."""
