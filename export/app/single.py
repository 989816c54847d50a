"""``minreal export``: one model → ONNX → simplified → verified → optional INT8, written atomically."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from compress import count_costs
from export.pipeline import VariantRecord, relative_to, to_jsonable
from export.readiness import tensorrt_readiness
from export.onnx_export import to_onnx
from export.quantize import QuantConfig, quantize_int8
from export.simplify import simplify
from export.verify import verify_parity

__all__ = ["ExportOptions", "export_single"]


@dataclass(frozen=True)
class ExportOptions:
    """Export settings of the ``export`` subcommand."""

    opset: int = 18
    rtol: float = 1e-3
    atol: float = 1e-4
    int8: bool = False
    quant_target: str = "cpu"
    quant_mode: str = "static"
    allow_random_calibration: bool = False


def export_single(model_spec: str, out: Path, data_spec: str | None, weights: str | None, trust_pickle: bool,
                  opts: ExportOptions, progress: Callable[[str], None],
                  input_shape: tuple[int, ...] | None = None) -> VariantRecord:
    """Load, export, simplify, verify (two batch sizes) and optionally quantise one model."""
    from export import specs

    module = specs.load_model(model_spec, weights=weights, trust_pickle=trust_pickle)
    calib = None
    if data_spec:
        # Nothing is measured on held-out data here, so all of --data serves (nothing is held out).
        calib = specs.load_dataset(data_spec)
        x = calib.x
        specs.check_input_shape(module, x, model_spec)
        progress(f"using all {len(calib)} samples of --data for the example input, parity and INT8 calibration")
    elif opts.int8 and opts.quant_mode == "static" and not opts.allow_random_calibration:
        raise specs.SpecError("--int8 needs calibration data: pass --data SPEC (or --allow-random-calibration)")
    elif input_shape:
        x = torch.randn(2, *input_shape, generator=torch.Generator().manual_seed(0))
        specs.check_input_shape(module, x, model_spec)
    else:
        raise specs.SpecError("export needs an example input: pass --data SPEC or --input-shape C,H,W")
    progress(f"exporting {model_spec}")
    with tempfile.TemporaryDirectory(prefix=".minreal-export-", dir=out.parent) as tmp:
        raw, checked = Path(tmp) / "raw.onnx", Path(tmp) / out.name
        exp = to_onnx(module, x[:2], raw, opset=opts.opset)
        simp = simplify(raw, checked, check_inputs=[x[:3].numpy()], rtol=opts.rtol, atol=opts.atol)
        progress("verifying parity with ONNX Runtime at batch sizes 1 and 8")
        xs = [x[:1], torch.cat([x] * (8 // len(x) + 1))[:8]]
        parity = verify_parity(module, checked, xs, rtol=opts.rtol, atol=opts.atol)
        os.replace(checked, out)  # only a verified graph reaches the output path
        records = relative_to(to_jsonable([exp, simp, parity]), Path(tmp))
    costs = count_costs(module, x[:2])
    record = VariantRecord(out.stem, "none", costs.total_params, costs.macs, str(out), out.stat().st_size,
                           *records, tensorrt_readiness=to_jsonable(tensorrt_readiness(out, opts.opset)))
    if opts.int8:
        progress(f"quantising to INT8 ({opts.quant_mode}, {opts.quant_target})")
        q_out = out.with_name(out.stem + ".int8.onnx")
        cal = None if calib is None else calib.x[:256].numpy().astype(np.float32)
        q = quantize_int8(out, q_out, cal, QuantConfig(target=opts.quant_target, mode=opts.quant_mode,
                                                       allow_random_calibration=opts.allow_random_calibration))
        record.quantization = to_jsonable(q)
    return record
