"""``minreal export``: one model → ONNX → simplified → verified → optional INT8 and FP16, written atomically."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from minreal.app import data as app_data
from minreal.app.callables import SpecError
from minreal.app.int8_text import int8_cause, int8_format_text
from minreal.app.models import align_inputs, check_input_shape, checked_dataset, load_model, packed_model
from minreal.app.preprocess import ImagePreprocess
from minreal.app.report import ORT_FP16_NOTE
from minreal.app.shapes import InputShapes, check_shape_names, merge_axes, random_inputs
from minreal.compress.core.inputs import Inputs, NamedInputs
from minreal.export.fp16 import Fp16Config
from minreal.export.int8 import int8_skip_reason
from minreal.export.int8.target import resolve_target, target_text
from minreal.export.ort_format import ort_variant
from minreal.export.record import Laps, VariantRecord
from minreal.export.settings import FEW_CALIBRATION_SAMPLES, OrtConfig, VariantConfig
from minreal.export.variant import PARITY_BATCH_SIZES, export_variant, fp16_variant, quantize_variant
from minreal.export.verify import feeds_of, output_agreement

__all__ = ["ExportOptions", "export_single"]


@dataclass(frozen=True)
class ExportOptions:
    """Settings of the ``export`` subcommand: the variant settings, and whether to write INT8 and FP16 too."""

    variant: VariantConfig = field(default_factory=VariantConfig)
    int8: bool = False
    fp16: Fp16Config | None = None
    """Write ``NAME.fp16.onnx`` with these options (``None``: no FP16 copy)."""
    preprocess: ImagePreprocess | None = None
    """How an image folder given as ``--data`` becomes inputs (None: 224x224, ImageNet statistics)."""
    ort: OrtConfig | None = None
    """Also write ``NAME.ort`` (and ``NAME.int8.ort`` with INT8) with these settings (``None``: ONNX only)."""


def _example(module: torch.nn.Module, model_spec: str, data_spec: str | None, opts: ExportOptions,
             input_shape: InputShapes | None, progress: Callable[[str], None]) -> tuple[torch.nn.Module, Inputs]:
    """The module to export (wrapped when its forward takes one dict of the named inputs) and its example: all of
    ``--data`` (nothing is measured on held-out data here), or a seeded random example."""
    cfg = opts.variant
    app_data.require_image_folder(opts.preprocess, data_spec)
    if data_spec and input_shape:
        raise SpecError("--input-shape makes a random example when there is no --data; with --data the example is "
                        "the data: drop --input-shape (dynamic axes: --dynamic-axes NAME:batch,seq)")
    if data_spec:
        data = app_data.load_dataset(data_spec, preprocess=opts.preprocess)
        module = packed_model(module, data.x, model_spec)
        x = checked_dataset(module, data, model_spec, data_spec).x
        progress(_data_line(len(x), cfg.calib_samples if opts.int8 and cfg.quant_mode == "static" else None))
        return module, x
    if opts.int8 and cfg.quant_mode == "static" and not cfg.allow_random_calibration:
        raise SpecError("--int8 needs calibration data: pass --data SPEC (or --allow-random-calibration)")
    if input_shape:
        x = random_inputs(input_shape, 2)
        module = packed_model(module, x, model_spec)
        x = align_inputs(module, x, model_spec, "--input-shape")
        check_input_shape(module, x, model_spec)
        if opts.int8 and cfg.quant_mode == "static":
            _refuse_random_integer_calibration(x)
        return module, x
    raise SpecError("export needs an example input: pass --data SPEC or --input-shape C,H,W (named inputs: "
                    "--input-shape NAME:BxL:DTYPE, repeated)")


def _data_line(rows: int, calib: int | None) -> str:
    """The progress line on what ``--data`` is used for (``calib``: INT8 calibration's sample cap, None without
    static INT8); a WARNING where calibration has fewer than :data:`FEW_CALIBRATION_SAMPLES` samples."""
    if calib is None:
        return f"using all {rows} samples of --data for the example input and parity"
    used = min(rows, calib)
    line = (f"using all {rows} samples of --data for the example input and parity, "
            f"{'all of them' if used == rows else f'a seeded random {used} of them'} for INT8 calibration")
    if used < FEW_CALIBRATION_SAMPLES:
        line += (f"; WARNING: INT8 ranges from {used} sample(s) hold for those only: give --data with "
                 f"{FEW_CALIBRATION_SAMPLES} or more")
    return line


def _refuse_random_integer_calibration(x: Inputs) -> None:
    """Random calibration makes sense for float inputs only: refuse, before anything is written, when an input
    holds integers (token ids, masks), whose valid values random data would not respect."""
    tensors = dict(x.items()) if isinstance(x, NamedInputs) else {"input": x}
    integer = [name for name, t in tensors.items() if not t.is_floating_point()]
    if integer:
        raise SpecError(f"--allow-random-calibration cannot calibrate integer input(s) {', '.join(integer)} (random "
                        "values would be out of range): pass --data SPEC with real inputs for --int8")


def export_single(model_spec: str, out: Path, data_spec: str | None, weights: str | None, trust_pickle: bool,
                  opts: ExportOptions, progress: Callable[[str], None],
                  input_shape: InputShapes | tuple[int, ...] | None = None,
                  dynamic_axes: Mapping[str, Mapping[int, str]] | None = None) -> VariantRecord:
    """Load, export, simplify, verify and optionally quantise one model (see
    :func:`minreal.export.variant.export_variant`).

    The record's paths are relative to ``out``'s folder; with INT8 its ``quantization`` describes ``NAME.int8.onnx``,
    with FP16 its ``fp16`` describes ``NAME.fp16.onnx``; with ``opts.ort`` its ``ort`` describes ``NAME.ort`` (parity
    against torch) and ``quantization["ort"]`` ``NAME.int8.ort`` (parity against ``NAME.int8.onnx``).
    ``dynamic_axes`` (``{input: {axis: name}}``) adds dynamic axes besides the batch, as do the axes along which
    repeated named ``input_shape`` entries differ.
    """
    if isinstance(input_shape, tuple):
        input_shape = InputShapes(per_sample=input_shape)
    requested, mode = opts.variant.quant_target, opts.variant.quant_mode
    variant = replace(opts.variant, quant_target=resolve_target(requested, mode))  # everything below: explicit
    laps = Laps()
    module = load_model(model_spec, weights=weights, trust_pickle=trust_pickle)
    module, x = _example(module, model_spec, data_spec, opts, input_shape, progress)
    laps.lap("load")
    batches = " and ".join(map(str, PARITY_BATCH_SIZES))
    progress(f"exporting {model_spec}; verifying parity with ONNX Runtime at batch sizes {batches}")
    axes = merge_axes(input_shape.dynamic if input_shape else {}, dynamic_axes or {})
    check_shape_names(x, axes, variant.fixed_shapes)  # a typo is a usage error, before any export
    record = export_variant(module, x, out, variant, dynamic_axes=axes or None)
    laps.take(record.timings_s)
    if opts.ort is not None:
        progress(f"converting {out.name} to ORT format ({opts.ort.optimization}, {opts.ort.style}); checking it "
                 "against torch with ONNX Runtime")
        record.ort = ort_variant(record, out.parent, x, variant, opts.ort, module)
        laps.lap("ort")
    if opts.int8 and (skip := int8_skip_reason(out)):
        progress(f"INT8 skipped: {skip}")
        record.quantization = {"skipped": skip}
    elif opts.int8:
        progress(f"quantising to INT8 ({mode}, {target_text(requested, variant.quant_target)})")
        calib = x if data_spec else None
        q = quantize_variant(record, out.parent, calib, variant)
        record.quantization = {**q.quantization, "mobile": q.mobile}
        for line in _int8_lines(out, out.parent / q.onnx, record.quantization, calib):
            progress(line)
        laps.lap("int8")
        if opts.ort is not None:
            progress(f"converting {q.onnx} to ORT format; checking it against {q.onnx} with ONNX Runtime")
            record.quantization["ort"] = ort_variant(q, out.parent, x, variant, opts.ort)
            laps.lap("ort")
    if opts.fp16 is not None:
        progress(f"converting to FP16 ({'fp32' if opts.fp16.keep_io_types else 'fp16'} inputs and outputs)")
        record.fp16 = fp16_variant(record, out.parent, x, variant, opts.fp16).fp16
        if opts.ort is not None:  # in the record too: --json and -q must not lose it
            record.fp16 = {**record.fp16, "ort": {"skipped": ORT_FP16_NOTE}}
            progress(f"note: {ORT_FP16_NOTE}")
        laps.lap("fp16")
    record.timings_s = laps.timings
    progress("wall time by phase: " + ", ".join(f"{phase} {s:.1f} s" for phase, s in laps.timings.items()))
    return record


INT8_MIN_AGREEMENT = 0.99
"""``export --int8`` warns when the INT8 file's top-1 agreement with its fp32 source on ``--data`` is below this..."""
INT8_MAX_RELATIVE_MSE = 1e-2
"""... or, for outputs without classes, when its relative MSE against the fp32 outputs is above this."""


def _int8_lines(fp32: Path, int8: Path, quantization: dict, calib: Inputs | None) -> list[str]:
    """The INT8 file's format (``cpu`` resolved), and a warning when it can saturate on this CPU or its outputs
    depart from the fp32 file's on the given data (the calibration data: an optimistic check; ``run`` and ``tune``
    judge INT8 on held-out data). Records the agreement and relative MSE in ``quantization``."""
    lines = [f"INT8 format: {quantization.get('target')} ({int8_format_text(quantization) or 'unknown'})"]
    departs = False
    if calib is not None:
        agreement, rel_mse = output_agreement(fp32, int8, feeds_of(calib))
        quantization.update(fp32_agreement=agreement, fp32_relative_mse=rel_mse)
        departs = rel_mse > INT8_MAX_RELATIVE_MSE if agreement is None else agreement < INT8_MIN_AGREEMENT
        what = f"relative MSE {rel_mse:.3g}" if agreement is None else f"top-1 agreement {100 * agreement:.2f} %"
        lines.append(f"INT8 vs fp32 on --data: {what}")
    if departs or quantization.get("saturates_here"):
        lines.append(f"WARNING: the INT8 file may be inaccurate here (likely cause: {int8_cause(quantization)})")
    return lines
