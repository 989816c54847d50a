"""``minreal export``: one model → ONNX → simplified → verified → optional INT8, written atomically."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from export.app import data as app_data
from export.app.callables import SpecError
from export.app.models import check_input_shape, load_model
from export.variant import PARITY_BATCH_SIZES, VariantConfig, VariantRecord, export_variant, quantize_variant

__all__ = ["ExportOptions", "export_single"]


@dataclass(frozen=True)
class ExportOptions:
    """Settings of the ``export`` subcommand: the variant settings, and whether to write INT8 too."""

    variant: VariantConfig = field(default_factory=VariantConfig)
    int8: bool = False


def _example(module: torch.nn.Module, model_spec: str, data_spec: str | None, opts: ExportOptions,
             input_shape: tuple[int, ...] | None, progress: Callable[[str], None]) -> torch.Tensor:
    """All of ``--data`` (nothing is measured on held-out data here), or a seeded random example."""
    cfg = opts.variant
    if data_spec:
        x = app_data.load_dataset(data_spec).x
        check_input_shape(module, x, model_spec, data_spec)
        progress(f"using all {len(x)} samples of --data for the example input, parity and INT8 calibration")
        return x
    if opts.int8 and cfg.quant_mode == "static" and not cfg.allow_random_calibration:
        raise SpecError("--int8 needs calibration data: pass --data SPEC (or --allow-random-calibration)")
    if input_shape:
        x = torch.randn(2, *input_shape, generator=torch.Generator().manual_seed(0))
        check_input_shape(module, x, model_spec)
        return x
    raise SpecError("export needs an example input: pass --data SPEC or --input-shape C,H,W")


def export_single(model_spec: str, out: Path, data_spec: str | None, weights: str | None, trust_pickle: bool,
                  opts: ExportOptions, progress: Callable[[str], None],
                  input_shape: tuple[int, ...] | None = None) -> VariantRecord:
    """Load, export, simplify, verify and optionally quantise one model (see :func:`export.variant.export_variant`).

    The record's paths are relative to ``out``'s folder; with INT8 its ``quantization`` describes ``NAME.int8.onnx``.
    """
    module = load_model(model_spec, weights=weights, trust_pickle=trust_pickle)
    x = _example(module, model_spec, data_spec, opts, input_shape, progress)
    batches = " and ".join(map(str, PARITY_BATCH_SIZES))
    progress(f"exporting {model_spec}; verifying parity with ONNX Runtime at batch sizes {batches}")
    record = export_variant(module, x, out, opts.variant)
    if opts.int8:
        progress(f"quantising to INT8 ({opts.variant.quant_mode}, {opts.variant.quant_target})")
        calib = x if data_spec else None
        record.quantization = quantize_variant(record, out.parent, calib, opts.variant).quantization
    return record
