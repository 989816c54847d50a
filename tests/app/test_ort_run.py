"""``minreal run --format onnx,ort``: an ORT-format copy of every fp32 and INT8 file, checked, with one operator
configuration for the case; none of the FP16 files, and the report says why; ``check --max-size`` judges the
``.ort`` files too."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from minreal.app.report import ORT_FP16_NOTE
from minreal.export.ort_format import read_operator_config, union_operators


def test_run_writes_an_ort_file_per_model_and_one_merged_config(workdir: Path, run_cli: Callable) -> None:
    code, out, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "--layer-mac-ratio", "0.5",
                              "--data", "digits-flat", "--out", "r", "--batch", "1", "--min-seconds", "0.02",
                              "--repeats", "1", "--format", "onnx,ort", "--ort-optimization", "basic", "--fp16"])
    assert code == 0, err
    case = json.loads(Path("r/report.json").read_text())["cases"][0]
    records = {v["label"]: v["ort"] for v in case["variants"] if v["ort"]}
    assert sorted(records) == ["original", "original.int8", "svd", "svd.int8"]  # no FP16 file: its note says why
    assert {v["label"] for v in case["variants"]} - set(records) == {"original.fp16", "svd.fp16"}
    assert out.count(ORT_FP16_NOTE) == 1 and Path("r/report.md").read_text().count(ORT_FP16_NOTE) == 1
    assert {r["parity"]["against"] for r in records.values()} == {"torch", "original.int8.onnx", "svd.int8.onnx"}
    assert all(r["optimization"] == "basic" and (Path("r/make") / r["path"]).stat().st_size == r["bytes"]
               for r in records.values())
    merged = read_operator_config(Path("r/make") / case["ort_config"])
    assert merged == union_operators(*(read_operator_config(Path("r/make") / r["config_path"])
                                       for r in records.values()))
    assert "[make] ORT format: original.ort, svd.ort, original.int8.ort, svd.int8.ort (parity ok)" in out
    assert "## ORT format" in Path("r/report.md").read_text()
    models = {m["name"]: m for m in case["bench"]["models"]}
    assert all(models[label]["ort_size_bytes"] == r["bytes"] for label, r in records.items())
    assert "ort_size_bytes" not in models["svd.fp16"]
    gated = [(f"{name}{ext}", m[key]) for name, m in models.items() if name != "original"  # the reference
             for ext, key in (("", "file_size_bytes"), (".ort", "ort_size_bytes")) if key in m]
    (largest, size), (_, below) = sorted(gated, key=lambda f: -f[1])[:2]
    assert largest.endswith(".ort") and below < size  # the largest file that ships is an .ort file
    code, _, err = run_cli(["check", "r/report.json", "--max-size", f"{(below + size) / 2048:.6f}", "-q"])
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("FAILED make: size_kb ") and f"size_kb {largest}:" in err and err.count("size_kb") == 1
