"""One static or dynamic quantisation by ONNX Runtime, and the rewrites of the file it writes.

For the CPU targets a constant zero ``Pad`` between a dequantise and a re-quantise of one scale (an option-A ResNet
shortcut's zero channels) pads the quantised tensor with the zero point instead (:mod:`minreal.export.qdq_pads`).
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from minreal.export.int8.calibration import ArrayCalibrationReader, RangeSource
from minreal.export.int8.config import CALIBRATION_METHODS, QUANT_TYPES, QuantConfig
from minreal.export.int8.preprocess import ort_quantization
from minreal.export.int8.target import ORT_CPU_TARGETS
from minreal.export.qdq_channels import narrow_convs
from minreal.export.qdq_pads import integer_pads
from minreal.facts import INT8_TARGET_KEY

__all__ = ["run_static", "stamp_target", "run_dynamic"]

logger = logging.getLogger(__name__)


class _PerChannelAxisNoise(logging.Filter):
    """Drops onnxruntime's root-logger warning that a 1-D weight (e.g. a norm scale) has no per-channel axis 1;
    such weights are quantised per tensor, which is what we want."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is out-of-range for weight" not in record.getMessage()


def run_static(source: Path, dest: Path, ranges: RangeSource, config: QuantConfig,
               overrides: Mapping[str, list[dict[str, np.ndarray]]] | None = None,
               excluded: Sequence[str] = ()) -> None:
    """Static QDQ quantisation with the activation ranges of ``ranges``, leaving the ``excluded`` nodes in float; an
    excluded convolution that :func:`~minreal.export.int8.preprocess.preprocess` widened loses its zero channels and
    their ``Pad`` again (:func:`~minreal.export.qdq_channels.narrow_convs`: in float they only cost), in a copy of
    ``source`` in a temporary folder (the trained ranges of the tensors gone with the ``Pad`` dropped: the tensor
    above it keeps its own, where it has one)."""
    if excluded:
        model = onnx.load(str(source), load_external_data=False)
        narrowed, gone = narrow_convs(model, excluded)
        if narrowed:
            logger.debug("%s: zero input channels removed again from %s (left in float)", dest.name,
                         ", ".join(narrowed))
            kept = {k: v for k, v in (overrides or {}).items() if k not in gone}
            with tempfile.TemporaryDirectory(prefix="minreal-narrowed-") as folder:
                onnx.save(model, str(Path(folder) / source.name))
                run_static(Path(folder) / source.name, dest, ranges, config, kept, excluded)
            return
    act_type, symmetric = config.activation()
    noise = _PerChannelAxisNoise()
    logging.getLogger().addFilter(noise)
    try:
        with warnings.catch_warnings():
            # An infinite calibrated range makes ORT divide by an infinite scale; run_static_finite finds those
            # scales in the written graph, leaves their nodes in float and says so, so numpy's warning adds nothing.
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"onnxruntime\.quantization\.quant_utils")
            _quantize_static(source, dest, ranges, config, act_type, symmetric, list(excluded), overrides or {})
    finally:
        logging.getLogger().removeFilter(noise)
    if config.target in ORT_CPU_TARGETS:
        _pad_quantised(dest)


def stamp_target(path: Path, target: str) -> None:
    """Record the file's explicit INT8 target in its metadata (:data:`minreal.facts.INT8_TARGET_KEY`), so every
    ONNX Runtime session of it runs the graph its target's builds make (an ``arm64`` file: ARM's int8 fusions)."""
    model = onnx.load(str(path), load_external_data=False)
    kept = [p for p in model.metadata_props if p.key != INT8_TARGET_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=INT8_TARGET_KEY, value=target)
    onnx.save(model, str(path))


def _pad_quantised(path: Path) -> None:
    """Run the file's constant zero pads between a dequantise and a re-quantise of one scale on the quantised tensors
    (:func:`minreal.export.qdq_pads.integer_pads`; ONNX Runtime's CPU graph would run them in float)."""
    model = onnx.load(str(path), load_external_data=False)
    pads = integer_pads(model)
    if pads:
        onnx.save(model, str(path))
        logger.debug("%s: %d pad(s) run on quantised tensors: %s", path.name, len(pads), ", ".join(pads))


def _quantize_static(source: Path, dest: Path, ranges: RangeSource, config: QuantConfig,
                     act_type: str, symmetric: bool, excluded: list[str],
                     overrides: Mapping[str, list[dict[str, np.ndarray]]]) -> None:
    q = ort_quantization()
    if isinstance(ranges, ArrayCalibrationReader):
        ranges.rewind()
    feed = {"calibration_cache_path": str(ranges)} if isinstance(ranges, Path) else {"calibration_data_reader": ranges}
    q.quantize_static(
        str(source), str(dest), **feed, nodes_to_exclude=excluded,
        quant_format=q.QuantFormat.QDQ, per_channel=config.per_channel,
        activation_type=getattr(q.QuantType, QUANT_TYPES[act_type]),
        weight_type=getattr(q.QuantType, QUANT_TYPES[config.weight_type]), reduce_range=config.weights_reduced(),
        calibrate_method=getattr(q.CalibrationMethod, CALIBRATION_METHODS[config.calibration_method]),
        extra_options={
            "ActivationSymmetric": symmetric, "WeightSymmetric": config.weight_type == "int8",
            "QuantizeBias": config.target_defaults().quantize_bias,
            **({"TensorQuantOverrides": dict(overrides)} if overrides else {}),
        },
    )  # fmt: skip


def run_dynamic(source: Path, dest: Path, config: QuantConfig, excluded: Sequence[str] = ()) -> None:
    """Dynamic quantisation: int8 weights, activations quantised at run time; ``excluded`` nodes stay float."""
    q = ort_quantization()
    q.quantize_dynamic(str(source), str(dest), per_channel=config.per_channel, reduce_range=config.weights_reduced(),
                       weight_type=getattr(q.QuantType, QUANT_TYPES[config.weight_type]),
                       nodes_to_exclude=list(excluded))
