"""A run's report.json read back (:class:`~minreal.app.run_report.RunReport`): the views of a report and of its JSON
are the same text, and each compressed variant's record is a typed compression report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import minreal.runtime_bench as rb
from minreal.app.digest import verdict_models, winner_lines
from minreal.app.gate import check_reports
from minreal.app.plots import report_points
from minreal.app.report import recovery_rows, render_markdown, spectra_layers
from minreal.app.run_report import CaseResult, RunReport, variant_compression
from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.report import CompressionReport, ReportVersionError
from minreal.compress.methods.svd import SVDConfig
from minreal.export.json_safe import write_json
from minreal.export.record import VariantRecord


def _run_report(tiny_mlp: torch.nn.Module, mlp_data: Dataset) -> RunReport:
    _, comp = compress(tiny_mlp, mlp_data, "svd", SVDConfig(mac_ratio=0.5))
    comp.measured.held_out = {"top1_agreement": 0.95}
    lat = [{"model": m, "provider": "cpu", "batch_size": 1,
            "stats": {"p50_ms": ms, "p90_ms": ms, "p99_ms": ms, "throughput_sps": 1 / ms}}
           for m, ms in (("original", 2.0), ("svd", 1.0))]
    bench = {"metrics": [{"model": "original", "accuracy": 0.9}, {"model": "svd", "accuracy": 0.895}],
             "latency": lat, "ratios": []}
    variants = [VariantRecord("original", "none", 100, 200, "original.onnx", 4096),
                VariantRecord("svd", "svd", 60, 100, "svd.onnx", 2048, compression=comp)]
    case = CaseResult("mlp", variants, bench, {"benchmark": 1.0}, ["a note"], ["odd: one warning"])
    return RunReport(1, "now", {"providers": ["cpu"]}, [case])


def test_a_report_and_its_json_read_back_render_the_same(tiny_mlp: torch.nn.Module, mlp_data: Dataset,
                                                         tmp_path: Path) -> None:
    report = _run_report(tiny_mlp, mlp_data)
    write_json(report, tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["schema_version"] == 1 and data["cases"][0]["variants"][1]["compression"]["schema_version"] == 2
    loaded = RunReport.load(tmp_path / "report.json")
    assert render_markdown(loaded) == render_markdown(report) == render_markdown(data)
    assert "top1_agreement=0.95" in render_markdown(loaded)  # the held-out measurement, through the typed field
    assert recovery_rows(loaded) == [] and spectra_layers(loaded) == []
    comp = variant_compression(loaded.cases[0].variants[1])
    assert comp is not None and comp.predicted.budget["kind"] == "mac_ratio" and comp.measured.held_out is not None
    assert variant_compression(loaded.cases[0].variants[0]) is None


def _bench(p50: dict[str, tuple[float, float]], accuracy: dict[str, float]) -> dict[str, Any]:
    """A case's benchmark on cpu: each model's p50 latency at batch 1 and 32 (three processes alike) and held-out
    accuracy; the first model is the reference of the ratios."""
    ref = next(iter(p50))
    cells = [(m, b, ms, ms / p50[ref][i]) for m, pair in p50.items() for i, (b, ms) in enumerate(zip((1, 32), pair))]
    return {"schema_version": rb.SCHEMA_VERSION, "environment": {"cpu_model": "test cpu"},
            "config": {"providers": ["cpu"], "batch_sizes": [1, 32]},
            "models": [{"name": m, "path": f"{m}.onnx"} for m in p50],
            "latency": [{"model": m, "provider": "cpu", "batch_size": b, "process_p50_ms": [ms] * 3,
                         "stats": {"p50_ms": ms, "p90_ms": ms, "p99_ms": ms, "throughput_sps": b / ms * 1e3}}
                        for m, b, ms, _ in cells],
            "ratios": [{"model": m, "reference": ref, "provider": "cpu", "batch_size": b, "statistic": "p50_ms",
                        "median": r, "min": r, "max": r, "per_process": [r] * 3} for m, b, _, r in cells if m != ref],
            "metrics": [{"model": m, "accuracy": a} for m, a in accuracy.items()], "unavailable": []}


def _typed_report() -> RunReport:
    """A two-case run report in memory, as the pipeline returns it: a typed compression report on each compressed
    variant."""
    def case(name: str, svd_ms: tuple[float, float], svd_accuracy: float) -> CaseResult:
        comp = CompressionReport("svd", {"mac_ratio": 0.5}, params_before=100, params_after=60, macs_before=200,
                                 macs_after=100, spectra={"0": {"energy": [4.0, 2.0, 1.0]}})
        variants = [VariantRecord("original", "none", 100, 200, "original.onnx", 4096),
                    VariantRecord("original.int8", "none+int8", 100, 200, "original.int8.onnx", 1024),
                    VariantRecord("svd", "svd", 60, 100, "svd.onnx", 2048, compression=comp)]
        bench = _bench({"original": (4.0, 80.0), "original.int8": (2.0, 40.0), "svd": svd_ms},
                       {"original": 0.90, "original.int8": 0.90, "svd": svd_accuracy})
        return CaseResult(name, variants, bench, {"benchmark": 1.0}, [], [f"odd: a warning of {name}"])

    return RunReport(1, "now", {"providers": ["cpu"]}, [case("mlp", (1.0, 40.0), 0.895), case("cnn", (1.0, 20.0),
                                                                                                  0.85)])


def test_a_run_report_read_from_json_is_typed_throughout_and_torch_free(tmp_path: Path) -> None:
    write_json(_typed_report(), tmp_path / "report.json")
    code = ("import sys; from minreal.app.run_report import RunReport; "
            f"r = RunReport.load({str(tmp_path / 'report.json')!r}); "
            "c = r.cases[0].variants[2].compression; "
            "print(type(c).__name__, c.macs_after, r.cases[0].variants[0].compression, "
            "[m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["CompressionReport", "100", "None", "[]"]


def test_gate_plots_and_digest_give_the_same_results_for_a_report_and_its_json(tmp_path: Path) -> None:
    report = _typed_report()
    write_json(report, tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    loaded = RunReport.load(tmp_path / "report.json")
    assert loaded.cases[1].variants[2].compression == report.cases[1].variants[2].compression
    lines = winner_lines(report)
    assert lines == winner_lines(data) == winner_lines(loaded) and len(lines) == 2
    assert lines[0].startswith("mlp: svd won (accuracy -0.50 pp)") and lines[1].startswith("cnn: original.int8 won")
    assert verdict_models(report) == verdict_models(data) == verdict_models(loaded)
    points = report_points(report)
    assert points == report_points(data) == report_points(loaded) and len(points) == 2 * 2 * 3
    assert spectra_layers(report) == spectra_layers(data) == [("mlp", "svd: 0", {"energy": [4.0, 2.0, 1.0]}),
                                                               ("cnn", "svd: 0", {"energy": [4.0, 2.0, 1.0]})]
    in_memory = [(c.name, rb.check_report(c.bench, 2.0, 1.0)) for c in report.cases]
    assert check_reports(tmp_path / "report.json", None, 2.0, 1.0, None, None) == in_memory
    assert [r.passed for _, r in in_memory] == [True, False]  # cnn's svd is 5 points down


def _with_compression(tmp_path: Path, **changes: Any) -> Path:
    """The typed report written to ``tmp_path/report.json`` with mlp's svd variant's compression report changed."""
    write_json(_typed_report(), tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    data["cases"][0]["variants"][2]["compression"].update(changes)
    (tmp_path / "report.json").write_text(json.dumps(data))
    return tmp_path / "report.json"


def test_the_gate_does_not_read_compression_reports(tmp_path: Path, run_cli: Any) -> None:
    expected = [(c.name, rb.check_report(c.bench, 2.0, 1.0)) for c in _typed_report().cases]
    bad_layer = [{"name": "0", "kind": "Linear", "action": "factorized", "colour": "red"}]
    for changes in ({"schema_version": 99}, {"a_later_key": 1}, {"layers": bad_layer}):
        path = _with_compression(tmp_path, **changes)
        assert check_reports(path, None, 2.0, 1.0, None, None) == expected, changes
        code, _, err = run_cli(["check", str(path), "--max-accuracy-drop", "50"])
        assert code == 0, (changes, err)


def test_a_refused_compression_report_names_the_file_case_and_variant(tmp_path: Path) -> None:
    path = _with_compression(tmp_path, schema_version=99)
    with pytest.raises(ReportVersionError) as err:
        RunReport.load(path)
    assert f"{path}: case mlp, variant svd: compression report schema_version 99" in str(err.value)
    assert "upgrade minreal" in str(err.value)
    path = _with_compression(tmp_path, layers=[{"name": "0", "kind": "Linear", "action": "kept", "colour": "red"}])
    with pytest.raises(ValueError) as err:
        RunReport.load(path)
    assert err.type is ValueError
    assert str(err.value) == (f"{path}: case mlp, variant svd: unknown layer key(s) colour (layer '0') in the "
                              "compression report")


@pytest.mark.parametrize("bench", ["missing", None, {}])
def test_the_gate_refuses_a_case_without_a_benchmark_naming_the_file_and_case(tmp_path: Path, bench: Any) -> None:
    write_json(_typed_report(), tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    if bench == "missing":
        del data["cases"][1]["bench"]
    else:
        data["cases"][1]["bench"] = bench
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(rb.ReportSchemaError) as err:
        check_reports(tmp_path / "report.json", None, 2.0, 1.0, None, None)
    assert str(err.value) == (f"report {tmp_path / 'report.json'}: case(s) cnn have no benchmark (bench); "
                              "regenerate the report with minreal run")


def test_a_variant_without_compression_is_written_as_an_empty_object_and_null_reads_as_none(tmp_path: Path) -> None:
    write_json(_typed_report(), tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    variants = data["cases"][0]["variants"]
    assert [v["compression"] == {} for v in variants] == [True, True, False]  # original and its INT8 copy: none
    assert variants[2]["compression"]["method"] == "svd" and variants[2]["compression"]["macs_after"] == 100
    variants[1]["compression"] = None  # as the merged branch wrote it
    (tmp_path / "report.json").write_text(json.dumps(data))
    assert [v.compression is None for v in RunReport.load(tmp_path / "report.json").cases[0].variants] == [True,
                                                                                                           True, False]
