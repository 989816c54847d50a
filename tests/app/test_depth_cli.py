"""`minreal compress -m depth` from the command line: a model without residual blocks is refused in one line with
exit status 2 and no output file; a ResNet is cut to the MAC budget and written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minreal.app.cli import run

PLAIN = """
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).eval()
"""

RESNET = """
import torch
from minreal.compress.models import CifarResNet


def make():
    torch.manual_seed(0)
    return CifarResNet(blocks_per_stage=2, in_channels=1).eval()
"""


def test_a_model_without_residual_blocks_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "net.py").write_text(PLAIN)
    monkeypatch.chdir(tmp_path)
    code = run(["compress", "net.py:make", "-m", "depth", "--mac-ratio", "0.8", "--data", "digits", "--out",
                "cut.pt2", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "no removable residual block" in err and "Traceback" not in err
    errors = [ln for ln in err.strip().splitlines() if not ln.startswith("WARNING")]  # untrained: a data warning
    assert len(errors) == 1 and errors[0].startswith("minreal") and not (tmp_path / "cut.pt2").exists()


def test_a_resnet_is_cut_to_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "net.py").write_text(RESNET)
    monkeypatch.chdir(tmp_path)
    code = run(["compress", "net.py:make", "-m", "depth", "--mac-ratio", "0.8", "--data", "digits", "--out",
                "cut.pt2", "--report", "r.json", "-q"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "r.json").read_text())
    assert (tmp_path / "cut.pt2").is_file() and report["macs_after"] <= 0.8 * report["macs_before"]


def test_a_missing_latency_table_is_named_by_its_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    """The library names the field (`latency_table`); the command line prints the flag instead."""
    (tmp_path / "net.py").write_text(RESNET)
    monkeypatch.chdir(tmp_path)
    code = run(["compress", "net.py:make", "-m", "depth", "--latency-ratio", "0.8", "--latency-table", "none.json",
                "--data", "digits", "--out", "cut.pt2", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "minreal: error: --latency-table none.json: cannot read it (FileNotFoundError)" in err, err
    assert "latency_table" not in err and not (tmp_path / "cut.pt2").exists()
