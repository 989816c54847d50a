"""onnxruntime sessions configured for fair, interleaved timing."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minreal.facts import PROVIDERS, error_line

from .errors import ModelFileError, SessionError
from .runtime import onnxruntime_module

__all__ = ["SPINNING_ENTRIES", "session_options", "create_session"]

#: Session config entries that stop idle thread pools from spinning. With one pool per session,
#: spinning threads of idle sessions steal cores from the timed one when models are interleaved.
SPINNING_ENTRIES: tuple[tuple[str, str], ...] = (
    ("session.intra_op.allow_spinning", "0"),
    ("session.inter_op.allow_spinning", "0"),
)


def session_options(threads: int | None, optimized_model_path: Path | None = None,
                    config: Mapping[str, str] | None = None) -> Any:
    """Session options: explicit intra-op threads, one inter-op thread, sequential, no spinning.

    Args:
        threads: Intra-op thread count; None leaves onnxruntime's default (the physical cores).
        optimized_model_path: If given, onnxruntime writes the optimised graph there.
        config: More session config entries (e.g. ``session.qdqisint8allowed``), added after the defaults.
    """
    ort = onnxruntime_module()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    for key, value in SPINNING_ENTRIES:
        options.add_session_config_entry(key, value)
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if optimized_model_path is not None:
        options.optimized_model_filepath = str(optimized_model_path)
    return options


def create_session(
    model: Path | bytes,
    provider: str = PROVIDERS["cpu"],
    threads: int | None = None,
    optimized_model_path: Path | None = None,
    provider_options: Mapping[str, str] | None = None,
    config: Mapping[str, str] | None = None,
) -> Any:
    """Create an inference session on ``provider`` (full onnxruntime name): the project's one session factory.

    The benchmark, the parity check and the simplifier's before/after comparison all open sessions here.
    The caller must compare ``session.get_providers()`` with the request
    (:func:`minreal.runtime_bench.providers.provider_mismatch`): onnxruntime may fall back to CPU.

    Args:
        model: An ONNX file, or a serialized model.
        provider: Full execution-provider name (``"CPUExecutionProvider"``, ...).
        threads: Intra-op threads; None leaves onnxruntime's default.
        optimized_model_path: If given, onnxruntime writes the optimised graph there.
        provider_options: ONNX Runtime options of ``provider`` (strings; see
            :func:`minreal.runtime_bench.provider_options.ort_options`).
        config: More session config entries (:func:`session_options`).

    Raises:
        ModelFileError: the file does not exist.
        SessionError: onnxruntime rejects the model.
    """
    if isinstance(model, bytes):
        source, where = model, "an in-memory model"
    else:
        path = Path(model)
        if not path.is_file():
            raise ModelFileError(f"model file not found: {path}")
        source, where = str(path), str(path)
    options = session_options(threads, optimized_model_path, config)
    providers: list[Any] = [(provider, dict(provider_options))] if provider_options else [provider]
    try:
        return onnxruntime_module().InferenceSession(source, sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own pybind exception types
        raise SessionError(f"onnxruntime cannot create a session for {where} on {provider}: "
                           f"{error_line(exc)}") from None
