"""A run prints each warning once, with its results (and keeps them all in report.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minreal.app.cli import run

UNTRAINED = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))
"""


def test_each_warning_is_printed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "net.py").write_text(UNTRAINED)
    monkeypatch.chdir(tmp_path)
    code = run(["run", "net.py:make", "-m", "svd", "--data", "digits-flat", "--out", "runs/w", "--batch", "1",
                "--min-seconds", "0.05", "--repeats", "1", "--allow-data-mismatch"])
    err = capsys.readouterr().err
    assert code == 0, err
    warnings = json.loads(Path("runs/w/report.json").read_text())["cases"][0]["warnings"]
    assert any(w.startswith("--allow-data-mismatch") for w in warnings)  # an untrained net: at chance
    for w in warnings:
        assert err.count(w) == 1, (w, err)
