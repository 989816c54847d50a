"""No calibration or evaluation data in what minreal writes: a canary value in every row must not leak."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from minreal.app.cli import main
from minreal.export.serialize import save_program

CANARY = 7919.3125  # exactly representable in float32 and float64; no weight of an untrained net comes near
FACTORY = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 4))
"""


def _canary_patterns() -> dict[str, bytes]:
    return {"float32": struct.pack("<f", CANARY), "float64": struct.pack("<d", CANARY),
            "text": repr(CANARY).encode()}


def _without_input_box(obj: object) -> object:
    """A report without fde's ``input_box`` (per-feature min/max of the calibration data, which its error
    bound is stated over): the one data statistic a report is meant to hold; reports are not shipped."""
    if isinstance(obj, dict):
        return {k: _without_input_box(v) for k, v in obj.items() if k != "input_box"}
    if isinstance(obj, list):
        return [_without_input_box(v) for v in obj]
    return obj


def _leaks(root: Path, skip: set[Path]) -> list[str]:
    """Every (file, encoding) under ``root`` holding the canary, ignoring the ``skip`` inputs."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p not in skip):
        data = path.read_bytes()
        if path.suffix == ".json":
            data = json.dumps(_without_input_box(json.loads(data))).encode()
        found += [f"{path.relative_to(root)} ({kind})" for kind, pat in _canary_patterns().items() if pat in data]
    return found


def _canary_data(path: Path, n: int, seed: int) -> Path:
    """Standard normal inputs with the canary in one column of every row (a different column per row, so no
    column statistic such as a mean equals it), and labels."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    x[np.arange(n), np.arange(n) % 12] = CANARY
    np.savez(path, x=x, y=rng.integers(0, 4, size=n))
    return path


def test_saved_program_holds_no_example_rows_and_is_weights_plus_a_constant(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4)).eval()
    params = sum(p.numel() for p in model.parameters())
    calib = torch.randn(4096, 12)
    calib[:, 3] = CANARY
    small = save_program(model, calib[:2], tmp_path / "small.pt2")  # a view into 4096 rows
    large = save_program(model, calib, tmp_path / "large.pt2")
    assert _leaks(tmp_path, set()) == []
    assert small.stat().st_size == large.stat().st_size  # the example's size does not reach the file
    overhead = small.stat().st_size - 4 * params
    assert 0 < overhead < 48 * 1024, overhead  # 4096 rows x 12 floats would add 192 KiB


def test_canary_in_every_row_reaches_no_file_a_run_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(FACTORY)
    calib, held = _canary_data(tmp_path / "calib.npz", 96, 0), _canary_data(tmp_path / "held.npz", 40, 1)
    quick = ["--min-seconds", "0.05", "--repeats", "1", "--batch", "1,4"]
    for args in (
        ["run", "--allow-data-mismatch", "net.py:make", "-m", "svd", "-m", "fde", "--data", str(calib), "--eval-data",
         str(held), "--out", "run", *quick],
        ["compress", "net.py:make", "-m", "svd", "--data", str(calib), "--out", "c.pt2", "--report", "c.json"],
        ["export", "net.py:make", "--data", str(calib), "--out", "e.onnx", "--int8"],
    ):
        with pytest.raises(SystemExit) as info:
            main(args)
            raise SystemExit(0)
        assert info.value.code == 0, capsys.readouterr().err
    written = {p.name for p in (tmp_path / "run").rglob("*")}
    assert {"report.json", "report.md"} <= written and any(n.endswith(".int8.onnx") for n in written)
    assert any(n.endswith(".pt2") for n in written)
    assert _leaks(tmp_path, {calib, held}) == []


def test_saved_program_names_its_archive_after_the_file_not_a_temp_file(tmp_path: Path) -> None:
    import zipfile

    path = save_program(nn.Linear(3, 2).eval(), torch.randn(4, 3), tmp_path / "small.pt2")
    with zipfile.ZipFile(path) as zf:
        roots = {name.split("/", 1)[0] for name in zf.namelist()}
    assert roots == {"small"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.pt2"]
