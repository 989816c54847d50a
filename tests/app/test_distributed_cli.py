"""`minreal compress` under torchrun: the ranks share the statistics and the recovery, rank 0 alone writes, and the
result is the single-process one (float64 reductions of the same global batches)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from minreal.app.cli import run

NET = """
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.BatchNorm1d(48), nn.ReLU(), nn.Linear(48, 10))
"""
ARGS = ["net.py:make", "-m", "factorize", "--mac-ratio", "0.5", "--data", "digits-flat", "--recover-epochs", "1",
        "-q"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_write_once_what_one_process_computes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "net.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(_free_port()), "-m", "minreal.app.cli", "compress", *ARGS, "--out", "two.pt2", "--report",
               "two.json"]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # BatchNorm: the ranks keep its statistics frozen (re-estimated exactly each epoch); one process does so when asked
    assert run(["compress", *ARGS, "--recover-freeze-bn", "--out", "one.pt2", "--report", "one.json"]) == 0
    assert done.stdout.count("saved two.pt2") == 1  # rank 0 alone saves and reports; rank 1 only computes
    two, one = (json.loads(Path(f).read_text()) for f in ("two.json", "one.json"))
    assert [layer["rank"] for layer in two["layers"]] == [layer["rank"] for layer in one["layers"]]
    # same global batches and float64 statistics: equal up to float32 summation order in the recovery steps
    recovery = two["measured"]["recovery"] if "recovery" in two["measured"] else two["recovery"]
    assert recovery["world_size"] == 2 and recovery["batchnorm_frozen"] is True
    for key, value in one["measured"]["held_out_recovered"].items():
        assert two["measured"]["held_out_recovered"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_distributed_flag_outside_torchrun_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "net.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert run(["compress", *ARGS, "--out", "x.pt2", "--distributed"]) == 2
    assert "start with torchrun" in capsys.readouterr().err and not Path("x.pt2").exists()


@pytest.mark.parametrize("command", ["run", "tune"])
def test_run_and_tune_refuse_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                      command: str) -> None:
    (tmp_path / "net.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    extra = ["-m", "svd"] if command == "run" else ["--min-agreement", "0.9"]
    assert run([command, "net.py:make", "--data", "digits-flat", *extra, "--out", "o"]) == 2
    assert "does not run under torchrun" in capsys.readouterr().err and not Path("o").exists()
