"""``--recover-int8``: a run writes the quantisation-aware INT8 copy next to a post-training one of the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minreal.app.cli import run

FACTORY = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))
"""
QUICK_BENCH = ["--min-seconds", "0.05", "--repeats", "1"]
SVD = ["net.py:make", "--method", "svd", "--mac-ratio", "0.5"]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "net.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_main(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code, out = run(args), capsys.readouterr()
    return code, out.out, out.err


def test_run_reports_post_training_and_quantisation_aware_int8_side_by_side(workdir: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    args = ["run", "--allow-data-mismatch", *SVD, "--data", "digits-flat", "--out", "runs/r", "--batch", "1",
            "--recover-epochs", "1", "--recover-int8", *QUICK_BENCH]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    case = json.loads(Path("runs/r/report.json").read_text())["cases"][0]
    variants = {v["label"]: v for v in case["variants"]}
    assert list(variants) == ["original", "svd", "original.int8", "svd.int8", "svd.ptq.int8"]
    ranges = variants["svd"]["compression"]["recovery"]["activation_ranges"]
    qat, ptq = variants["svd.int8"]["quantization"], variants["svd.ptq.int8"]["quantization"]
    assert (qat["range_source"], qat["trained_ranges"], qat["untrained_modules"]) == ("trained", len(ranges), [])
    assert (ptq["range_source"], ptq["trained_ranges"], ptq["fp32_path"]) == ("calibrated", 0, qat["fp32_path"])
    assert variants["original.int8"]["quantization"]["range_source"] == "calibrated"
    assert {m["model"] for m in case["bench"]["metrics"]} >= {"svd.int8", "svd.ptq.int8"}
    md = Path("runs/r/report.md").read_text()
    assert "## INT8 of the quantisation-aware weights: calibrated afresh vs trained" in md
    assert "| svd.ptq.int8 | svd.int8 |" in md
    assert "**svd.int8**: INT8 (quantisation-aware, trained ranges" in md
    assert "**svd.ptq.int8**: INT8 (post-training, calibrated)" in md
    assert "INT8 of the same quantisation-aware weights: ranges calibrated afresh vs trained" in out


@pytest.mark.parametrize(("extra", "message"), [
    ([], "--recover-int8 needs a recovery budget"),
    (["--recover-epochs", "1", "--no-int8"], "--recover-int8 trains ranges for static INT8"),
    (["--recover-epochs", "1", "--quant-mode", "dynamic"], "--recover-int8 trains ranges for static INT8"),
])
def test_run_refuses_recover_int8_without_what_it_needs(workdir: Path, capsys: pytest.CaptureFixture,
                                                        extra: list[str], message: str) -> None:
    code, _, err = run_main(["run", "--allow-data-mismatch", *SVD, "--data", "digits-flat", "--out", "runs/r",
                             "--recover-int8", *extra], capsys)
    assert code == 2 and message in err and not Path("runs/r").exists()


def test_compress_needs_a_provider_with_an_int8_format(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    code, _, err = run_main(["compress", *SVD, "--calib", "digits-flat", "--recover-epochs", "1", "--recover-int8",
                             "--target-provider", "cuda"], capsys)
    assert code != 0 and "--recover-int8 has no INT8 format for target 'cuda'" in err
    assert not Path("compressed.pt2").exists()
