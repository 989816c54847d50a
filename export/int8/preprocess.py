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
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import onnx

from minreal.export.onnx_files import data_files
from minreal.export.qdq_channels import align_conv_inputs
from minreal.export.qdq_pools import global_average_pools
from minreal.facts import error_line
from minreal.runtime_bench.runtime import onnxruntime_module

__all__ = ["ort_quantization", "preprocess", "int8_skip_reason"]

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


def preprocess(fp32_path: Path, out: Path, align: bool = False) -> tuple[Path, str | None]:
    """Run ``quant_pre_process`` (then :func:`_rewrite` on its output); retry without symbolic shape inference, else
    use the float model as is."""
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
            logger.warning("%s (%s; %s)", note, fp32_path.name, then)
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
