"""Report writers (atomic JSON/Markdown), console table, loader with schema check."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from minreal.runtime_bench import SCHEMA_VERSION, format_table, load_report, write_json, write_markdown
from minreal.runtime_bench.errors import ReportSchemaError


def test_json_round_trip(tmp_path: Path, bench_report) -> None:
    report, _ = bench_report
    path = write_json(report, tmp_path / "out" / "report.json")
    loaded = load_report(path)
    assert loaded == json.loads(json.dumps(asdict(report)))
    assert loaded["schema_version"] == SCHEMA_VERSION
    assert loaded["latency"][0]["stats"]["p50_ms"] == report.latency[0].stats.p50_ms
    assert loaded["config"]["repeats"] == report.config.repeats


def test_writes_are_atomic_and_replace(tmp_path: Path, bench_report) -> None:
    report, _ = bench_report
    target = tmp_path / "report.md"
    target.write_text("old")
    write_markdown(report, target)
    write_json(report, tmp_path / "report.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]  # no temp files left
    text = target.read_text()
    assert text.startswith("# ONNX Runtime benchmark") and "old" not in text
    for heading in ("## Environment", "## Latency", "## Accuracy and agreement", "## Unavailable providers"):
        assert heading in text
    assert "| perturbed | cpu | 4 |" in text


def test_console_table_lists_every_cell(bench_report) -> None:
    report, _ = bench_report
    table = format_table(report)
    lines = table.splitlines()
    assert sum(line.startswith(("reference ", "perturbed ")) for line in lines) == len(report.latency) + 2
    assert "1 (reference)" in table
    ratio = report.ratios[0]
    assert f"{ratio.median:.3f} ({ratio.min:.3f}-{ratio.max:.3f})" in table
    assert all(f"unavailable: {u.provider}" in table for u in report.unavailable)


def test_schema_version_mismatch_is_clear(tmp_path: Path) -> None:
    path = tmp_path / "future.json"
    path.write_text(json.dumps({"schema_version": 99}))
    expected = f"future.json has schema_version 99; this minreal reads {SCHEMA_VERSION}"
    with pytest.raises(ReportSchemaError, match=expected):
        load_report(path)


@pytest.mark.parametrize(
    ("content", "match"),
    [("{not json", "is not valid JSON"), ("[1, 2]", "not a minreal benchmark report"), ("{}", "no schema_version")],
)
def test_bad_report_files(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ReportSchemaError, match=match):
        load_report(path)


def test_missing_report_names_file(tmp_path: Path) -> None:
    with pytest.raises(ReportSchemaError, match="report file not found: .*nothing.json"):
        load_report(tmp_path / "nothing.json")


def test_reports_get_umask_permissions_not_0600(tmp_path: Path, bench_report) -> None:
    report, _ = bench_report
    old = os.umask(0o022)
    try:
        json_path = write_json(report, tmp_path / "report.json")
        md_path = write_markdown(report, tmp_path / "report.md")
    finally:
        os.umask(old)
    assert json_path.stat().st_mode & 0o777 == 0o666 & ~0o022 == 0o644
    assert md_path.stat().st_mode & 0o777 == 0o644
