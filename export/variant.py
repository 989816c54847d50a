"""One model variant from torch to checked ONNX files: export → simplify → verify parity → optional INT8 / FP16.

``minreal export``, ``minreal run`` and the demo all go through :func:`export_variant`, :func:`quantize_variant`
and :func:`fp16_variant`, so the parity protocol (:data:`PARITY_BATCH_SIZES`) and the calibration sample
count (:data:`CALIB_SAMPLES`) are the same everywhere. Only a graph that passed the parity check reaches
its output path; paths in the returned record are relative to the folder of that path.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from minreal.compress import count_costs
from minreal.compress.core.costs import count_macs_torch, whole_model_macs
from minreal.compress.core.data import seeded_rows
from minreal.compress.core.inputs import Inputs, halve_axes, repeat_to, shapes_of_sample
from minreal.export.errors import ExportError
from minreal.export.fp16 import Fp16Config, convert_fp16, fp16_path
from minreal.export.int8 import quantize_int8
from minreal.export.json_safe import to_jsonable
from minreal.export.mobile import fix_verified, mobile_usability
from minreal.export.onnx_export import Axes, to_onnx
from minreal.export.onnx_files import data_files, move_onnx, onnx_size
from minreal.export.readiness import tensorrt_readiness
from minreal.export.record import Laps, VariantRecord
from minreal.export.settings import VariantConfig
from minreal.export.simplify import SimplifyResult, simplify
from minreal.export.tensorrt_check import tensorrt_check
from minreal.export.verify import feeds_of, ort_errors, verify_parity
from minreal.facts import PTQ_SUFFIX
from minreal.runtime_bench.model_info import gzip_bytes, model_files

__all__ = ["PARITY_BATCH_SIZES", "export_variant", "quantize_variant", "fp16_variant",
           "fp16_skip_reason", "FP16_LABEL_SUFFIX", "trained_ranges", "layer_weights", "parity_inputs", "record_axes",
           "relative_to", "file_stem"]

PARITY_BATCH_SIZES: tuple[int, ...] = (1, 16)
"""Batch sizes ONNX Runtime is compared with torch at (data smaller than a batch is repeated to fill it)."""


FP16_LABEL_SUFFIX = ".fp16"
"""Appended to a variant's label for its FP16 copy (``original.fp16``); its file is ``NAME.fp16.onnx``."""


def relative_to(obj: Any, root: Path) -> Any:
    """``obj`` (JSON-safe) with every path string under ``root`` made relative to it: reports name files in
    the output folder, not in the temporary folder they were built in."""
    prefix = str(root) + os.sep
    if isinstance(obj, dict):
        return {k: relative_to(v, root) for k, v in obj.items()}
    if isinstance(obj, list):
        return [relative_to(v, root) for v in obj]
    if isinstance(obj, str) and obj.startswith(prefix):
        return obj[len(prefix):]
    return obj


def file_stem(label: str) -> str:
    """A file-name-safe stem for a variant label (letters, digits, '.', '_', '-')."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_.")
    return stem or "model"


def parity_inputs(x: Inputs, axes: Axes | None = None) -> list[Inputs]:
    """Inputs at :data:`PARITY_BATCH_SIZES` (the first rows of ``x``, repeated when ``x`` has fewer), and, when
    ``axes`` has dynamic axes besides the batch, the largest batch again with every such axis at half its
    length (2 for a length of 1: :func:`~minreal.compress.core.inputs.halve_axes`): so parity is checked at two
    values of every dynamic axis."""
    checks = [repeat_to(x, batch) for batch in PARITY_BATCH_SIZES]
    shorter = halve_axes(x, axes or {})
    if shorter is not None:
        checks.append(repeat_to(shorter, PARITY_BATCH_SIZES[-1]))
    return checks


def _readiness(path: Path, cfg: VariantConfig) -> dict[str, Any]:
    """The static TensorRT check of ``path``, with ``checker`` saying what decided ``ready``: TensorRT itself
    (``cfg.tensorrt_validation``, when importable; its parse, builds and parity under ``tensorrt``), else the
    static check and why."""
    static = to_jsonable(tensorrt_readiness(path, cfg.opset))
    if not cfg.tensorrt_validation:
        return relative_to({**static, "checker": "static check (TensorRT validation runs with --providers "
                                                 "tensorrt when tensorrt is importable)"}, path.parent)
    try:
        check = tensorrt_check(path, opset=cfg.opset, batch=cfg.tensorrt_batch)
    except ValueError as exc:  # e.g. an input dynamic beyond the batch with no shapes to profile it
        return relative_to({**static, "checker": f"static check: TensorRT validation not run: {exc}"}, path.parent)
    found = {k: v for k, v in to_jsonable(check).items() if k not in ("static", "path")}
    return relative_to({**static, "ready": check.ready, "checker": check.checker,
                        **({"tensorrt": found} if check.used_tensorrt else {})}, path.parent)


def export_variant(module: nn.Module, x: Inputs, out: Path, cfg: VariantConfig, label: str | None = None,
                   method: str = "none", dynamic_dims: dict[int, str] | None = None,
                   dynamic_axes: Mapping[str, Mapping[int, str]] | None = None) -> VariantRecord:
    """Export ``module`` to ``out``: ONNX (dynamic batch), simplified, verified against torch.

    Parameters
    ----------
    module : nn.Module
        the torch module (put in eval mode).
    x : Inputs
        example data, batch first (a tensor, or named inputs for a several-input model): two rows are
        exported, three check the simplification, and parity is verified at :data:`PARITY_BATCH_SIZES` and at
        half the length of every other dynamic axis (2 for a length of 1; :func:`parity_inputs`).
    out : Path
        destination ``.onnx``; written only once parity passed.
    cfg : VariantConfig
        opset and tolerances.
    label : str | None
        the record's label (default ``out``'s stem).
    method : str
        the compression method that made ``module`` (``"none"`` for an original).
    dynamic_dims : dict[int, str] | None
        extra dynamic axes (axis → name) of a one-tensor input besides the batch.
    dynamic_axes : Mapping[str, Mapping[int, str]] | None
        extra dynamic axes by input name (``{"input_ids": {1: "seq"}}``).

    Returns
    -------
    VariantRecord
        A :class:`VariantRecord` with costs and the export, simplification, parity and TensorRT-readiness
        results, the dimensions fixed by ``cfg.fixed_shapes`` (the fixed file checked against the dynamic one at
        its shape, :func:`minreal.export.mobile.fix_verified`) and ONNX Runtime's NNAPI/CoreML verdict; paths relative
        to ``out``'s folder.

    Raises
    ------
    ExportError
        no exporter produced a graph.
    ParityError
        ONNX Runtime's outputs differ from torch's beyond ``cfg.rtol``/``cfg.atol``.
    """
    out = Path(out)
    module = module.eval()
    laps = Laps()
    with tempfile.TemporaryDirectory(prefix=".minreal-export-", dir=out.parent) as tmp:
        raw, checked = Path(tmp) / f"{out.stem}.raw.onnx", Path(tmp) / out.name
        exp = to_onnx(module, x[:2], raw, opset=cfg.opset, dynamic_dims=dynamic_dims or None,
                      dynamic_axes=dynamic_axes or None)
        laps.lap("export")
        simp = _simplified(module, raw, checked, x, cfg)
        laps.lap("simplify")
        parity = verify_parity(module, checked, parity_inputs(x, exp.dynamic_axes), rtol=cfg.rtol, atol=cfg.atol,
                               atol_scale=cfg.atol_scale)
        laps.lap("parity")
        fixed = fix_verified(checked, cfg.fixed_shapes, feeds_of(x), cfg.rtol, cfg.atol)
        move_onnx(checked, out)  # only a verified graph (with its external data, if any) reaches the output path
        results = relative_to(to_jsonable([exp, simp, parity]), Path(tmp))
        laps.lap("fixed_shapes")
    # the exporter's and the simplifier's records name their temporary files: the graph lives on as ``out``, its data
    # beside it
    results[0]["path"] = results[1]["path_in"] = out.name
    results[0]["data_files"] = [str(f.relative_to(out.parent)) for f in data_files(out)]
    costs = count_costs(module, x[:1])  # per sample: two could be taken for a sequence-first layer's batch
    # the compression report's count (torch's, SSM layers by their rule): the rules alone miss attention's score and
    # value products, which a torch.export program of the same model, having no layers, counted
    macs = whole_model_macs(count_macs_torch(module, x[:1]), costs)
    laps.lap("costs")
    record = VariantRecord(label or out.stem, method, costs.total_params, macs, out.name, onnx_size(out),
                           *results, tensorrt_readiness=_readiness(out, cfg), fixed_shapes=to_jsonable(fixed),
                           mobile=to_jsonable(mobile_usability(out)), gzip_bytes=gzip_bytes(model_files(out)),
                           macs_at=shapes_of_sample(x))
    laps.lap("checks")
    record.timings_s = laps.timings
    return record


def _simplified(module: nn.Module, raw: Path, checked: Path, x: Inputs, cfg: VariantConfig) -> SimplifyResult:
    """:func:`simplify` of the graph exported from two rows of ``x``, checked on three; ExportError in one line when
    ONNX Runtime cannot run the exported graph there (a forward that fixes the batch size)."""
    try:
        return simplify(raw, checked, check_inputs=[feeds_of(x[:3])], rtol=cfg.rtol, atol=cfg.atol)
    except ort_errors() as exc:
        said = " ".join(str(exc).split())[:240]
        name, exported, checked_rows = type(module).__name__, len(x[:2]), len(x[:3])
        if exported == checked_rows:
            raise ExportError(f"ONNX Runtime cannot run the graph exported from {name}: {said}") from None
        raise ExportError(
            f"{name} exported at batch {exported} does not run at batch {checked_rows} in ONNX Runtime: its forward "
            "fixes the batch size (e.g. a Python loop over the images, as in torchvision's detection models) and "
            f"minreal exports a dynamic batch; give a forward that takes the batch as one tensor (ONNX Runtime: {said})"
        ) from None


def trained_ranges(record: VariantRecord) -> dict[str, dict[str, Any]]:
    """The activation ranges quantisation-aware recovery trained for a variant (``{}`` when none)."""
    recovery = (record.compression.recovery if record.compression is not None else None) or {}
    return dict(recovery.get("activation_ranges") or {})


def layer_weights(module: nn.Module, names: Iterable[str]) -> dict[str, np.ndarray]:
    """Weights of the named submodules as arrays: lets INT8 find a layer whose initializer the exporter renamed."""
    modules = dict(module.named_modules())
    return {n: modules[n].weight.detach().cpu().numpy().copy()  # a copy: the module may be freed after export
            for n in names if n in modules}


def quantize_variant(record: VariantRecord, folder: Path, calib: Inputs | None, cfg: VariantConfig,
                     weights: Mapping[str, np.ndarray] | None = None, post_training: bool = False) -> VariantRecord:
    """INT8 copy ``NAME.int8.onnx`` of an exported variant, calibrated on ``cfg.calib_samples`` rows of ``calib``
    (:func:`calibration_rows`: a seeded random subset where it holds more).

    A variant recovered with quantisation-aware training keeps its trained activation ranges (:func:`trained_ranges`)
    for its layers' inputs; its record's ``quantization.range_source`` says ``"trained"`` (else ``"calibrated"``).

    Parameters
    ----------
    record : VariantRecord
        the fp32 variant (from :func:`export_variant`); its file lies in ``folder``.
    folder : Path
        where the variant's file lies and the INT8 file is written.
    calib : Inputs | None
        calibration inputs, batch first, a tensor or named inputs (``None``: only with
        ``cfg.allow_random_calibration`` or dynamic mode).
    cfg : VariantConfig
        INT8 target, mode and sample count.
    weights : Mapping[str, np.ndarray] | None
        the variant's layer weights by module name (:func:`layer_weights`), to place trained ranges
        whose initializers the exporter renamed.
    post_training : bool
        calibrate every tensor afresh, ignoring trained ranges: the post-training copy
        ``NAME.ptq.int8.onnx`` (label ``LABEL.ptq.int8``) to compare with the quantisation-aware one.

    Returns
    -------
    VariantRecord
        The INT8 variant's record (label ``LABEL.int8``, method ``METHOD+int8``), paths relative to ``folder``.
    """
    folder, infix = Path(folder), PTQ_SUFFIX if post_training else ""
    out = folder / f"{Path(record.onnx).stem}{infix}.int8.onnx"
    data = None if calib is None else feeds_of(calibration_rows(calib, cfg.calib_samples))
    ranges = {} if post_training else trained_ranges(record)
    q = quantize_int8(folder / record.onnx, out, data, cfg.quant_config(), ranges, weights)
    return VariantRecord(f"{record.label}{infix}.int8", f"{record.method}+int8", record.params, record.macs,
                         out.name, out.stat().st_size, quantization=relative_to(to_jsonable(q), folder),
                         tensorrt_readiness=_readiness(out, cfg), fixed_shapes=record.fixed_shapes,
                         mobile=to_jsonable(mobile_usability(out)), gzip_bytes=gzip_bytes(model_files(out)),
                         macs_at=record.macs_at)


def calibration_rows(x: Inputs, cap: int, seed: int = 0) -> Inputs:
    """At most ``cap`` rows of ``x`` for INT8 calibration: all of them, else a seeded random subset in their order
    (the first rows of data stored class by class, an image folder, would calibrate on the first classes only)."""
    return x if len(x) <= cap else x[seeded_rows(len(x), cap, seed)]


def fp16_skip_reason(record: VariantRecord) -> str | None:
    """Why no FP16 copy is made of ``record`` (``None`` when one can be): a fixed-shape file (``--fixed-shapes``)
    takes one batch size, and FP16 parity is checked at :data:`PARITY_BATCH_SIZES`."""
    if not record.fixed_shapes:
        return None
    return ("the file has fixed shapes (--fixed-shapes, for NNAPI/CoreML) and FP16 parity needs two batch sizes; "
            "export without --fixed-shapes for GPU providers")


def record_axes(record: VariantRecord) -> Axes:
    """The dynamic axes the export recorded (JSON keys back to ints)."""
    axes = (record.export or {}).get("dynamic_axes") or {}
    return {name: {int(axis): dim for axis, dim in per.items()} for name, per in axes.items()}


def fp16_variant(record: VariantRecord, folder: Path, x: Inputs, cfg: VariantConfig,
                 fp16: Fp16Config | None = None) -> VariantRecord:
    """FP16 copy ``NAME.fp16.onnx`` of an exported variant, checked against its fp32 file on ``x`` at
    :data:`PARITY_BATCH_SIZES` (and half of every other dynamic axis, 2 for a length of 1: :func:`parity_inputs`).

    Parameters
    ----------
    record : VariantRecord
        the fp32 variant (from :func:`export_variant`); its file lies in ``folder``.
    folder : Path
        where the variant's file lies and the FP16 file is written.
    x : Inputs
        example inputs, batch first (a tensor or named inputs).
    cfg : VariantConfig
        the variant settings (opset for the TensorRT-readiness check).
    fp16 : Fp16Config | None
        conversion and tolerance options (default :class:`minreal.export.fp16.Fp16Config`: fp32 I/O, CPU).

    Returns
    -------
    VariantRecord
        The FP16 variant's record (label ``LABEL.fp16``, method ``METHOD+fp16``), paths relative to ``folder``.

    Raises
    ------
    ParityError
        the FP16 file differs from the fp32 one beyond the float16 tolerance (nothing is written).
    """
    folder = Path(folder)
    source = folder / record.onnx
    feeds = [feeds_of(batch) for batch in parity_inputs(x, record_axes(record))]
    result = convert_fp16(source, feeds, fp16_path(source), fp16)
    out = Path(result.out_path)
    return VariantRecord(f"{record.label}{FP16_LABEL_SUFFIX}", f"{record.method}+fp16", record.params, record.macs,
                         out.name, result.size_fp16_bytes, fp16=relative_to(to_jsonable(result), folder),
                         tensorrt_readiness=_readiness(out, cfg), mobile=to_jsonable(mobile_usability(out)),
                         gzip_bytes=gzip_bytes(model_files(out)), macs_at=record.macs_at)
