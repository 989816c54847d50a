"""ONNX Runtime's quantisation pre-processing and the graph rewrites that keep tensors quantised.

``quant_pre_process`` runs shape inference and basic optimisation (:func:`preprocess`). Two rewrites then keep
tensors quantised where ORT's CPU graph optimiser has no fusion of its own: a mean over every spatial axis
(``ReduceMean``, as PyTorch exports a global average pool) is written as ``GlobalAveragePool`` before quantisation
(:mod:`minreal.export.qdq_pools`; ORT fuses it into ``QLinearGlobalAveragePool``), and, for the x86 CPU targets,
convolutions whose input channels are not a multiple of 4 are widened with zero channels
(:mod:`minreal.export.qdq_channels`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import onnx

from minreal.export.onnx_files import data_files
from minreal.export.qdq_channels import align_conv_inputs
from minreal.export.qdq_pools import global_average_pools
from minreal.facts import error_line
from minreal.runtime_bench.runtime import onnxruntime_module

__all__ = ["ort_quantization", "preprocess", "preprocessed_kept", "int8_skip_reason", "file_sha256"]

logger = logging.getLogger(__name__)


def ort_quantization() -> ModuleType:
    """``onnxruntime.quantization`` (imported on first use: the base install may have no runtime wheel)."""
    onnxruntime_module()
    import onnxruntime.quantization

    return onnxruntime.quantization


@contextlib.contextmanager
def _working_directory(folder: Path) -> Iterator[None]:
    """Run the block in ``folder``: ONNX Runtime's symbolic shape inference, when it fails, saves a debugging copy of
    the model (``sym_shape_infer_temp.onnx`` and an external-data file) into the current directory, which must not
    be the user's."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@dataclass
class _KeptPreprocessed:
    """The pre-processed files of one :func:`preprocessed_kept` block: key → (a kept copy, or None where the float
    model is used as is; the note; the warnings logged)."""

    folder: Path
    files: dict[tuple[str, str, bool], tuple[Path | None, str | None, list[str]]] = field(default_factory=dict)


_KEPT: ContextVar[_KeptPreprocessed | None] = ContextVar("minreal_kept_preprocessed", default=None)


@contextlib.contextmanager
def preprocessed_kept() -> Iterator[None]:
    """Within this block, :func:`preprocess` of one float file (its path and bytes; one without external data) with
    one ``align`` runs ONNX Runtime's pre-processing once: later calls get a copy of its output, its note and
    minreal's warnings again (ONNX Runtime's own log lines are not repeated; accuracy control quantises the same
    model once per ranked layer). A block inside another shares
    the outer one's. The block is a context variable's: it covers this thread's calls."""
    if _KEPT.get() is not None:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="minreal-preprocessed-") as folder:
        token = _KEPT.set(_KeptPreprocessed(Path(folder)))
        try:
            yield
        finally:
            _KEPT.reset(token)


def preprocess(fp32_path: Path, out: Path, align: bool = False) -> tuple[Path, str | None]:
    """Run ``quant_pre_process`` (then :func:`_rewrite` on its output); retry without symbolic shape inference, else
    use the float model as is. Inside :func:`preprocessed_kept`, once per file and ``align``."""
    kept = _KEPT.get()
    key = None if kept is None or data_files(fp32_path) else (str(fp32_path.resolve()), file_sha256(fp32_path),
                                                                align)
    if key is not None and key in kept.files:
        copy, note, warned = kept.files[key]
        for line in warned:
            logger.warning("%s", line)
        if copy is None:
            return fp32_path, note
        shutil.copyfile(copy, out)
        return out, note
    warned: list[str] = []
    result = _preprocessed(fp32_path, out, align, warned)
    if key is not None:
        copy = None
        if result[0] == out:
            copy = kept.folder / f"{key[1]}-{int(align)}.onnx"
            shutil.copyfile(out, copy)
        kept.files[key] = copy, result[1], warned
    return result


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of one file's bytes, read 1 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _preprocessed(fp32_path: Path, out: Path, align: bool, warned: list[str]) -> tuple[Path, str | None]:
    """:func:`preprocess`'s work; the warnings it logs are appended to ``warned``."""
    ort_quantization()
    from onnxruntime.quantization.shape_inference import quant_pre_process

    note, source, dest = None, str(fp32_path.resolve()), str(out.resolve())
    for options in ({}, {"skip_symbolic_shape": True}):
        try:
            with _working_directory(out.parent):
                quant_pre_process(source, dest, **options)
        except Exception as exc:
            note = f"quant_pre_process{' without symbolic shapes' if options else ''} failed: {error_line(exc)}"
            then = "quantising the file as exported" if options else "retrying without symbolic shape inference"
            warned.append(f"{note} ({fp32_path.name}; {then})")
            logger.warning("%s", warned[-1])
            continue
        _rewrite(out, align)
        return out, note
    return fp32_path, note


def _rewrite(path: Path, align: bool) -> None:
    """Rewrite the pre-processed file's graph once: means over every spatial axis as ``GlobalAveragePool``
    (:func:`minreal.export.qdq_pools.global_average_pools`: ONNX Runtime runs that one on quantised tensors) and, when
    ``align``, convolutions widened to input channels on a multiple of 4
    (:func:`minreal.export.qdq_channels.align_conv_inputs`). External data stays where it is."""
    model = onnx.load(str(path), load_external_data=False)
    pooled = global_average_pools(model)
    widened = align_conv_inputs(model) if align else []
    if pooled or widened:
        onnx.save(model, str(path))
    if widened:
        logger.debug("%s: input channels widened to a multiple of 4 for %s", path.name, ", ".join(widened))


def int8_skip_reason(fp32_path: str | Path) -> str | None:
    """Why INT8 is not made for ``fp32_path`` (``None`` when it can be): a model with external data (weights
    beside the graph, e.g. one over 2 GiB) is not quantised; the pipeline records this line instead."""
    if not data_files(fp32_path):
        return None
    return ("the model keeps its weights in external data; INT8 quantisation here loads one in-memory protobuf "
            "(at most 2 GiB)")
