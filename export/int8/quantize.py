"""INT8 quantisation with ONNX Runtime: static QDQ (calibrated) or dynamic, the steps in order.

Static mode pre-processes the float file (:mod:`~minreal.export.int8.preprocess`), calibrates
(:mod:`~minreal.export.int8.calibration`; trained ranges from :mod:`~minreal.export.int8.overrides` replace the
calibrated ones of their layers' inputs), quantises in QDQ format with per-channel symmetric int8 weights in the
target's format (:mod:`~minreal.export.int8.target`, :mod:`~minreal.export.int8.passes`), and cleans the result up
(:mod:`~minreal.export.int8.cleanup`). The result counts Conv/MatMul/Gemm nodes that run as integer kernels in the
ORT-optimised CPU graph against those left in float (:mod:`~minreal.export.int8.ops`). Whether INT8 is actually
faster is for the benchmark to judge.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import minreal.runtime_bench.cpu as cpu_facts
from minreal.export.atomic import ensure_distinct
from minreal.export.errors import QuantizationError
from minreal.export.int8 import cleanup
from minreal.export.int8.calibration import (
    Calib,
    Calibration,
    check_calibration,
    file_reader,
    range_source,
    require_reusable,
)
from minreal.export.int8.config import WEIGHT_BITS, QuantConfig, QuantResult, aligns, weight_qmax
from minreal.export.int8.ops import dynamic_weight_nodes, kernel_counts
from minreal.export.int8.overrides import applied_ranges, check_ranges, trained_overrides
from minreal.export.int8.passes import run_dynamic, stamp_target
from minreal.export.int8.preprocess import int8_skip_reason, preprocess
from minreal.export.int8.target import TARGET_GRAPHS, saturates_here
from minreal.facts import error_line
from minreal.runtime_bench.atomic import atomic_path
from minreal.runtime_bench.model_info import float_roundtrips, op_counts, optimized_graph

__all__ = ["quantize_int8"]

logger = logging.getLogger(__name__)


def _excluded(source: Path, exclude: Sequence[str], static: bool) -> list[str]:
    """Nodes to leave in float: in static mode :func:`dynamic_weight_nodes` of the graph to quantise, then the
    caller's ``exclude`` (checked to name nodes of that graph: ONNX Runtime would ignore an unknown name)."""
    model = onnx.load(str(source), load_external_data=False)
    unknown = sorted(set(exclude) - {n.name for n in model.graph.node})
    if unknown:
        raise ValueError(f"exclude names nodes {unknown} that are not in the graph ONNX Runtime quantises; "
                         "take names from minreal.export.int8.quantizable_nodes")
    return list(dict.fromkeys([*(dynamic_weight_nodes(model) if static else []), *exclude]))


def quantize_int8(
    fp32_path: str | Path,
    out_path: str | Path,
    calib: Calib | None = None,
    config: QuantConfig | None = None,
    activation_ranges: Mapping[str, Mapping[str, Any]] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    exclude: Sequence[str] = (),
    calibration: Calibration | None = None,
) -> QuantResult:
    """Quantise a float ONNX model to INT8 with ONNX Runtime and count its integer kernels.

    Parameters
    ----------
    fp32_path : str | Path
        float model (not modified).
    out_path : str | Path
        destination (must differ from ``fp32_path``); written atomically.
    calib : Calib | None
        calibration inputs, batch along axis 0 (static mode): one array, or arrays by graph input name
        for several inputs (integer inputs such as token ids feed the calibration as they are; only float
        tensors get ranges). ``None`` is refused unless ``config.allow_random_calibration`` (and every input
        is float).
    config : QuantConfig | None
        options; default :class:`QuantConfig` (static, cpu target).
    activation_ranges : Mapping[str, Mapping[str, Any]] | None
        trained input ranges by module name (a recovery's ``activation_ranges``: ``scale``,
        ``zero_point``, ``dtype``, ``symmetric``); their layers' input tensors get exactly these parameters,
        all other tensors are calibrated on ``calib``.
    weights : Mapping[str, np.ndarray] | None
        module name → weight array, to find a module whose initializer the exporter renamed.
    exclude : Sequence[str]
        nodes to leave in float, named as in the pre-processed graph (:func:`quantizable_nodes`);
        added to those whose weights the graph computes.
    calibration : Calibration | None
        ranges from :func:`calibrate` of this model with this config's ``calibration_method`` (static
        mode): used instead of calibrating, for the same file; ``calib`` is then not read.

    Returns
    -------
    QuantResult
        A :class:`QuantResult`.

    Raises
    ------
    CalibrationError
        no or ill-shaped calibration data.
    ValueError
        ``exclude`` names a node that is not in the pre-processed graph, or ``calibration`` is of
        another graph or calibration method, or given in dynamic mode.
    QuantizationError
        ONNX Runtime could not quantise the model, the trained ranges are for another
        activation format (or for dynamic mode), the model keeps its weights in external data
        (:func:`int8_skip_reason`), or ``calibration`` is given to an ONNX Runtime that cannot use it
        (:func:`reusable_calibration`).
    """
    requested = (config or QuantConfig()).target
    config = (config or QuantConfig()).resolved()
    ranges = dict(activation_ranges or {})
    if ranges:
        check_ranges(ranges, config)
    ensure_distinct(fp32_path, out_path)
    skip = int8_skip_reason(fp32_path)
    if skip:
        raise QuantizationError(f"cannot quantise {Path(fp32_path).name} to INT8: {skip}")
    fp32_path, out_path = Path(fp32_path), Path(out_path)
    static = config.mode == "static"
    if calibration is not None:
        if not static:
            raise ValueError("calibration= is for mode='static'; dynamic quantisation calibrates nothing")
        require_reusable()
    model = onnx.load(str(fp32_path))
    reader, is_random = (file_reader(fp32_path, model, calib, config) if static and calibration is None
                         else (None, False))
    samples, digest = (0, "") if reader is None else (reader.rows, reader.digest())  # before anything is written
    if calib is not None and not static:
        logger.info("dynamic quantisation ignores the calibration data")
    with tempfile.TemporaryDirectory() as workdir, atomic_path(out_path) as tmp:
        source, note = preprocess(fp32_path, Path(workdir) / "preprocessed.onnx", aligns(config))
        overrides, direct = trained_overrides(onnx.load(str(source)), ranges, weights) if ranges else ({}, {})
        excluded = _excluded(source, exclude, static=static)
        if calibration is not None:
            check_calibration(calibration, source, config)
        try:
            roundtrip: list[str] = []
            if static:
                calibrated = range_source(source, Path(workdir), reader, calibration, config, is_random)
                nonfinite = cleanup.run_static_finite(source, tmp, calibrated, config, overrides, excluded,
                                                      fp32_path.name)
            else:
                nonfinite = []
                run_dynamic(source, tmp, config, excluded)
            graph = optimized_graph(tmp, "cpu", config=TARGET_GRAPHS.get(config.target))
            if static and config.drop_roundtrips and config.target in cpu_facts.CPU_TARGETS:
                roundtrip, graph = cleanup.drop_roundtrips(source, tmp, calibrated, config, overrides,
                                                           [*excluded, *nonfinite], graph)
        except QuantizationError:
            raise
        except Exception as exc:
            raise QuantizationError(f"{config.mode} quantisation of {fp32_path.name} failed: "
                                    f"{error_line(exc)}") from exc
        stamp_target(tmp, config.target)
    trained, untrained = applied_ranges(out_path, direct, ranges) if ranges else (0, [])
    if untrained:
        logger.warning("%s: the trained activation ranges of %s are not in the graph; calibrated instead",
                       out_path.name, ", ".join(untrained))
    if calibration is not None:
        samples, is_random, digest = calibration.samples, calibration.random, calibration.data_digest
    return dataclasses.replace(
        _result(fp32_path, out_path, graph, config, samples, is_random, note), calibration_digest=digest,
        excluded_nodes=[*excluded, *nonfinite, *roundtrip], nonfinite_nodes=nonfinite, roundtrip_nodes=roundtrip,
        requested_target=requested,
        range_source="trained" if trained else "calibrated", trained_ranges=trained, untrained_modules=untrained)


def _result(
    fp32_path: Path, out_path: Path, graph: onnx.GraphProto, config: QuantConfig, samples: int, is_random: bool,
    note: str | None
) -> QuantResult:
    """Assemble the :class:`QuantResult`, counting ops in the written graph and in ``graph``, ORT's optimised CPU
    graph of it."""
    static = config.mode == "static"
    act_type, symmetric = config.activation() if static else ("uint8", False)
    written = onnx.load(str(out_path), load_external_data=False)
    optimized, roundtrips = dict(op_counts(graph)), float_roundtrips(graph)
    integer, floating = kernel_counts(optimized)
    logger.info("%s: %d integer and %d float Conv/MatMul/Gemm kernels on CPU", out_path.name, integer, floating)
    return QuantResult(
        fp32_path=str(fp32_path), out_path=str(out_path), mode=config.mode, target=config.target,
        quant_format="QDQ" if static else "QOperator", activation_type=act_type, activation_symmetric=symmetric,
        weight_type=config.weight_type, per_channel=config.per_channel,
        weight_bits=WEIGHT_BITS[weight_qmax(config)],
        saturates_here=saturates_here(config.weight_type, config.weights_reduced()),
        quantized_bias=static and config.target_defaults().quantize_bias, calibration_samples=samples,
        random_calibration=is_random,
        preprocess_note=note, node_counts=dict(collections.Counter(n.op_type for n in written.graph.node)),
        optimized_ops=optimized, integer_kernels=integer, float_kernels=floating, float_roundtrips=roundtrips,
        size_fp32_bytes=fp32_path.stat().st_size, size_int8_bytes=out_path.stat().st_size,
    )  # fmt: skip
