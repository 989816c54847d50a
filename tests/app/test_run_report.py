"""A run's report.json read back (:class:`~minreal.app.run_report.RunReport`): the views of a report and of its JSON
are the same text, and each compressed variant's record is a typed compression report."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from minreal.app.report import recovery_rows, render_markdown, spectra_layers
from minreal.app.run_report import CaseResult, RunReport, variant_compression
from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.methods.svd import SVDConfig
from minreal.export.json_safe import to_jsonable, write_json
from minreal.export.variant import VariantRecord


def _run_report(tiny_mlp: torch.nn.Module, mlp_data: Dataset) -> RunReport:
    _, comp = compress(tiny_mlp, mlp_data, "svd", SVDConfig(mac_ratio=0.5))
    comp.measured.held_out = {"top1_agreement": 0.95}
    lat = [{"model": m, "provider": "cpu", "batch_size": 1,
            "stats": {"p50_ms": ms, "p90_ms": ms, "p99_ms": ms, "throughput_sps": 1 / ms}}
           for m, ms in (("original", 2.0), ("svd", 1.0))]
    bench = {"metrics": [{"model": "original", "accuracy": 0.9}, {"model": "svd", "accuracy": 0.895}],
             "latency": lat, "ratios": []}
    variants = [VariantRecord("original", "none", 100, 200, "original.onnx", 4096),
                VariantRecord("svd", "svd", 60, 100, "svd.onnx", 2048, compression=to_jsonable(comp))]
    case = CaseResult("mlp", variants, bench, {"benchmark": 1.0}, ["a note"], ["odd: one warning"])
    return RunReport(1, "now", {"providers": ["cpu"]}, [case])


def test_a_report_and_its_json_read_back_render_the_same(tiny_mlp: torch.nn.Module, mlp_data: Dataset,
                                                         tmp_path: Path) -> None:
    report = _run_report(tiny_mlp, mlp_data)
    write_json(report, tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["schema_version"] == 1 and data["cases"][0]["variants"][1]["compression"]["schema_version"] == 1
    loaded = RunReport.load(tmp_path / "report.json")
    assert render_markdown(loaded) == render_markdown(report) == render_markdown(data)
    assert "top1_agreement=0.95" in render_markdown(loaded)  # the held-out measurement, through the typed field
    assert recovery_rows(loaded) == [] and spectra_layers(loaded) == []
    comp = variant_compression(loaded.cases[0].variants[1])
    assert comp is not None and comp.predicted.budget["kind"] == "mac_ratio" and comp.measured.held_out is not None
    assert variant_compression(loaded.cases[0].variants[0]) is None
