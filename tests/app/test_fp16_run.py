"""FP16 copies in ``minreal export`` and ``minreal run``: files beside fp32 and INT8, benchmarked, reported."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto

from minreal.app.pipeline import slowdown_warnings
from minreal.app.report import FP16_HEADERS, fp16_rows
from minreal.app.run_report import CaseResult
from minreal.app.settings import PipelineConfig
from minreal.runtime_bench import BenchConfig

QUICK = ["--min-seconds", "0.02", "--repeats", "1", "--batch", "2", "-q"]


def _case(out: str) -> tuple[dict, Path]:
    report = json.loads(Path(out, "report.json").read_text())
    case = report["cases"][0]
    return case, Path(out, case["name"])


def test_export_fp16_writes_checked_copy_beside_out(workdir: Path, run_cli: Callable) -> None:
    code, out, err = run_cli(["export", "net.py:make", "--out", "m.onnx", "--data", "digits-flat", "--fp16", "-q",
                              "--json"])
    assert code == 0, err
    record = json.loads(out)
    assert record["fp16"]["parity"]["status"] == "passed" and record["fp16"]["out_path"] == "m.fp16.onnx"
    assert record["fp16"]["keep_io_types"] and record["fp16"]["size_fp16_bytes"] < record["onnx_bytes"]
    graph = onnx.load("m.fp16.onnx").graph
    assert graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert not list(workdir.glob(".*tmp*"))
    code, out, err = run_cli(["export", "net.py:make", "--out", "h.onnx", "--data", "digits-flat", "--fp16",
                              "--fp16-io", "-q", "--json"])
    assert code == 0, err
    assert onnx.load("h.fp16.onnx").graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert json.loads(out)["fp16"]["parity"]["passed"] is True


def test_export_fp16_option_errors(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["export", "net.py:make", "--out", "m.onnx", "--data", "digits-flat", "--fp16-io"])
    assert code == 2 and "--fp16-io" in err and "--fp16" in err
    code, _, err = run_cli(["export", "net.py:make", "--out", "m.onnx", "--data", "digits-flat", "--fp16",
                            "--fixed-shapes", "batch=1"])
    assert code == 2 and "--fixed-shapes" in err
    assert not Path("m.onnx").exists() and not Path("m.fp16.onnx").exists()


def test_run_fp16_on_cpu_benchmarks_and_reports_fp16_rows(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "--layer-mac-ratio", "0.5",
                            "--data", "digits-flat", "--out", "runs/f", "--fp16", *QUICK])
    assert code == 0, err
    case, folder = _case("runs/f")
    labels = [v["label"] for v in case["variants"]]
    assert labels == ["original", "svd", "original.int8", "svd.int8", "original.fp16", "svd.fp16"]
    assert (folder / "original.fp16.onnx").exists() and (folder / "svd.fp16.onnx").exists()
    assert {lat["model"] for lat in case["bench"]["latency"]} >= {"original.fp16", "svd.fp16"}
    fp16 = {v["label"]: v["fp16"] for v in case["variants"]}
    assert fp16["svd.fp16"]["parity"]["status"] == "passed" and fp16["svd.fp16"]["fp32_path"] == "svd.onnx"
    assert fp16["svd"] == {} and fp16["svd.int8"] == {}  # only FP16 copies carry an fp16 result
    metrics = {m["model"]: m for m in case["bench"]["metrics"]}
    assert metrics["original.fp16"]["top1_agreement"] > 0.95  # measured by the benchmark against the original
    md = Path("runs/f/report.md").read_text()
    assert "## FP16 copies" in md and "| " + " | ".join(FP16_HEADERS) + " |" in md
    assert "original.fp16" in md and "passed (cpu)" in md


def test_gpu_provider_asks_for_fp16_rows(workdir: Path, run_cli: Callable) -> None:
    assert not PipelineConfig().wants_fp16() and PipelineConfig(fp16=True).wants_fp16()
    assert PipelineConfig(bench=BenchConfig(providers=("cpu", "cuda"))).wants_fp16()
    assert PipelineConfig(bench=BenchConfig(providers=("tensorrt",))).wants_fp16()
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "--layer-mac-ratio", "0.5",
                            "--data", "digits-flat", "--out", "runs/g", "--no-int8", "--providers", "cpu,cuda",
                            "--skip-unavailable-providers", *QUICK])
    assert code == 0, err
    case, folder = _case("runs/g")
    assert [v["label"] for v in case["variants"]] == ["original", "svd", "original.fp16", "svd.fp16"]
    assert "fp16" in case["stage_seconds"]


def test_run_without_gpu_or_fp16_makes_no_fp16(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "--layer-mac-ratio", "0.5",
                            "--data", "digits-flat", "--out", "runs/n", "--no-int8", *QUICK])
    assert code == 0, err
    case, folder = _case("runs/n")
    assert [v["label"] for v in case["variants"]] == ["original", "svd"]
    assert not list(folder.glob("*.fp16.onnx")) and "fp16" not in case["stage_seconds"]
    assert "FP16" not in Path("runs/n/report.md").read_text()


def test_fp16_that_fails_parity_is_skipped_with_a_warning(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:huge", "-m", "svd", "--layer-mac-ratio", "0.5",
                            "--data", "digits-flat", "--out", "runs/h", "--no-int8", "--fp16", *QUICK])
    assert code == 0, err
    case, folder = _case("runs/h")
    original = case["variants"][0]
    assert "differs from the fp32 file" in original["fp16"]["skipped"]
    assert "original.fp16" not in [v["label"] for v in case["variants"]]
    assert not (folder / "original.fp16.onnx").exists()
    assert any(w.startswith("no FP16 copy of original") for w in case["warnings"])
    assert "FP16 skipped" in Path("runs/h/report.md").read_text()


def test_slowdown_warnings_compare_fp16_with_its_fp32_source() -> None:
    lat = lambda m, ms: {"model": m, "provider": "cpu", "batch_size": 1, "stats": {"p50_ms": ms}}  # noqa: E731
    bench = {"latency": [lat("original", 1.0), lat("original.fp16", 1.3), lat("svd", 0.5), lat("svd.fp16", 0.4)]}
    warnings = slowdown_warnings(CaseResult("c", [], bench, {}))
    assert warnings == ["FP16 model slower than its fp32 source: original.fp16 1.3 ms vs original 1 ms (cpu, batch 1)"]


def test_fp16_rows_read_a_report_dict() -> None:
    parity = {"status": "not checked on CPU: no kernel", "provider": "cpu", "rtol": 0.0098, "max_scaled_err": None}
    fp16 = {"fp32_path": "m.onnx", "keep_io_types": False, "size_fp16_bytes": 1024, "size_fp32_bytes": 2048,
            "fp32_nodes": {"TopK": 1}, "provider_precisions": {}, "parity": parity}
    report = {"cases": [{"name": "c", "variants": [{"label": "m", "fp16": {}}, {"label": "m.fp16", "fp16": fp16},
                                                   {"label": "old"}]}]}
    (row,) = fp16_rows(report)
    assert row == ("c", "m.fp16", "m.onnx", "fp16", "not checked on CPU: no kernel (cpu)", "-", "0.0098", "1.0",
                   "2.0", "TopK 1", "-")
    assert len(row) == len(FP16_HEADERS)
