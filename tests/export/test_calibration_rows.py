"""INT8 calibration takes a seeded random subset of rows where the data holds more than the cap, not the first rows:
data stored class by class (an image folder) would otherwise calibrate on its first classes only."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
from onnx import numpy_helper
from torch import nn

from minreal.export.settings import CALIB_SAMPLES, VariantConfig
from minreal.export.variant import calibration_rows, export_variant, quantize_variant


def test_rows_past_the_cap_are_a_seeded_subset_in_order() -> None:
    x = torch.arange(3 * CALIB_SAMPLES).float()[:, None]
    rows = calibration_rows(x, CALIB_SAMPLES)[:, 0].long()
    assert len(rows) == CALIB_SAMPLES == len(set(rows.tolist())) and bool((rows[1:] > rows[:-1]).all())
    assert torch.equal(rows, calibration_rows(x, CALIB_SAMPLES)[:, 0].long())  # seeded
    thirds = torch.bincount(rows // CALIB_SAMPLES, minlength=3)
    assert bool((thirds > CALIB_SAMPLES // 6).all())  # every third of the data, not the first one alone
    assert torch.equal(calibration_rows(x[:10], CALIB_SAMPLES), x[:10])  # fewer rows than the cap: all of them


def test_int8_ranges_cover_rows_stored_after_the_cap(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).eval()
    small = torch.rand(CALIB_SAMPLES + 4, 4) * 0.1  # the first "class": small inputs, more rows than the cap
    large = torch.rand(40, 4) * 10.0  # the last one: large inputs
    x = torch.cat([small, large])
    cfg = VariantConfig(quant_target="cpu-avx2")
    record = export_variant(model, x[:2], tmp_path / "m.onnx", cfg)
    quantize_variant(record, tmp_path, x, cfg)
    graph = onnx.load(str(tmp_path / "m.int8.onnx")).graph
    init = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    q = next(n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == graph.input[0].name)
    scale = float(init[q.input[1]])
    # uint8 activations over [0, max]: a range fitted to the first rows alone would be about 0.1 / 255
    assert scale * 255 >= 0.5 * float(large.max()), scale
