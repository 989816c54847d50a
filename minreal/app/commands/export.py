"""``minreal export``: one model to ONNX (dynamic batch), simplified and checked for parity, with optional
INT8 and FP16 copies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from minreal.app.cli_help import EXPORT, GroupedCommand, GroupedOption
from minreal.app.cli_options import (
    common,
    data_option,
    dynamic_axes_option,
    fp16_option,
    input_shape_option,
    int8_option,
    out_option,
    quant_mode_option,
    trust_pickle_option,
    weights_option,
)
from minreal.app.commands._shared import prepare_outputs
from minreal.app.console import Console
from minreal.app.field_flags import flag_spelled
from minreal.app.options import (
    fixed_shapes_option,
    fixed_shapes_spec,
    image_options,
    image_preprocess,
    ort_config,
    ort_options,
    quant_target_for,
    quant_target_option,
    shape_options,
)
from minreal.export.settings import VariantConfig
from minreal.facts import FieldError

__all__ = ["export_cmd"]


def _export_option(*decls: str, **kwargs: Any) -> Any:
    """An option of export alone, in the Export section of ``--help``."""
    return click.option(*decls, cls=GroupedOption, group=EXPORT, **kwargs)


@click.command("export", cls=GroupedCommand)
@click.argument("model")
@out_option("the .onnx file.", required=True)
@data_option("Data for the example input, parity check and INT8 calibration.")
@input_shape_option("For several inputs, each named with batch and dtype, repeatable: input_ids:1x128:int64.")
@dynamic_axes_option("The batch is always dynamic.")
@weights_option
@trust_pickle_option
@_export_option("--opset", type=int, default=VariantConfig.opset, show_default=True, help="ONNX opset (>= 17).")
@_export_option("--rtol", type=float, default=VariantConfig.rtol, show_default=True,
                help="Parity relative tolerance.")
@_export_option("--atol", type=float, default=VariantConfig.atol, show_default=True,
                help="Parity absolute tolerance.")
@_export_option("--atol-scale", type=float, default=VariantConfig.atol_scale, show_default=True,
                help="Part of each output's largest magnitude added to --atol in the parity check with torch "
                     "(float32 roundoff grows with a graph's magnitudes; 0: numpy.allclose's rule alone).")
@int8_option("OUT with suffix .int8.onnx (static QDQ by default).")
@quant_target_option
@quant_mode_option(VariantConfig.quant_mode)
@_export_option("--allow-random-calibration", is_flag=True, help="Calibrate INT8 on random data (not advised).")
@_export_option("--int8-keep-roundtrips", is_flag=True,
                help="Keep ONNX Runtime's Q/DQ placement around ops the CPU runs in float (by default such nodes are "
                     "left in float when that removes Q/DQ pairs; one more quantisation pass).")
@fp16_option("OUT with suffix .fp16.onnx (fp32 inputs/outputs), checked against OUT at float16 tolerances.")
@_export_option("--fp16-io", is_flag=True, help="With --fp16: float16 inputs and outputs instead.")
@fixed_shapes_option
@ort_options
@image_options
@common
def export_cmd(model: str, out: str, data: str | None, input_shape: tuple[str, ...], dynamic_axes: tuple[str, ...],
               weights: str | None, trust_pickle: bool, opset: int,
               rtol: float, atol: float, atol_scale: float, int8: bool, quant_target: str | None, quant_mode: str,
               allow_random_calibration: bool, int8_keep_roundtrips: bool, fp16: bool, fp16_io: bool,
               fixed_shapes: str | None, quiet: bool, as_json: bool, **grouped: Any) -> None:
    """Export MODEL to ONNX (dynamic batch), simplify, verify parity, optionally quantise to INT8 and write FP16."""
    from minreal.app.single import ExportOptions, export_single
    from minreal.export.fp16 import Fp16Config, fp16_path
    from minreal.export.mobile import mobile_verdict
    from minreal.export.ort_format import ort_paths, ort_summary

    if fp16_io and not fp16:
        raise click.UsageError("--fp16-io applies to the FP16 copy: add --fp16")
    if fp16 and fixed_shapes:
        raise click.UsageError("--fp16 checks parity at two batch sizes, which a --fixed-shapes file cannot take; "
                               "drop one of them")
    ort = ort_config(grouped)
    con = Console(quiet, as_json)
    try:  # tolerances, opset and INT8 settings are checked by the config itself: a usage error, before any work
        variant = VariantConfig(opset=opset, rtol=rtol, atol=atol, atol_scale=atol_scale,
                                quant_target=quant_target_for(quant_target, ()),
                                quant_mode=quant_mode, allow_random_calibration=allow_random_calibration,
                                fixed_shapes=fixed_shapes_spec(fixed_shapes), drop_roundtrips=not int8_keep_roundtrips)
    except FieldError as exc:
        raise click.UsageError(flag_spelled(exc)) from None
    opts = ExportOptions(variant, int8=int8, fp16=Fp16Config(keep_io_types=not fp16_io) if fp16 else None,
                         preprocess=image_preprocess(grouped), ort=ort)
    shape, axes = shape_options(input_shape, dynamic_axes)
    int8_out = Path(out).with_name(Path(out).stem + ".int8.onnx") if int8 else None
    prepare_outputs([out, int8_out, fp16_path(out) if fp16 else None,
                     *(p for path in (out, int8_out) if path and ort for p in ort_paths(path, ort))], model, weights,
                    data)
    result = export_single(model, Path(out), data, weights, trust_pickle, opts, con.progress, shape, axes)
    con.table(f"wrote {out} ({result.onnx_bytes} bytes, exporter {result.export['exporter']}); parity ok")
    if int8_out is not None and result.quantization:
        con.table(f"wrote {int8_out} ({result.quantization['size_int8_bytes']} bytes, INT8 in the "
                  f"{result.quantization['target']} format)")
    for record in (result.ort, result.quantization.get("ort")):
        if record:
            con.table(ort_summary(record, Path(out).parent))
    if result.fp16:
        con.table(f"wrote {fp16_path(out)} ({result.fp16['size_fp16_bytes']} bytes); FP16 parity "
                  f"{result.fp16['parity']['status']}")
    con.table(mobile_verdict(result.mobile))
    con.result(result)
