"""Issue 12's "done": a CIFAR ResNet-20 written as user code (factory + an old checkpoint without
``num_batches_tracked``) runs through ``minreal run -m cbalanced -m fde -m magnitude -m wanda`` with no
hand-written surgery, and a width method chained before factorisation keeps ONNX parity."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from minreal.app.cli import run
from minreal.app.models import load_model
from minreal.compress.core.data import Dataset
from minreal.compress.datasets import digits32
from minreal.compress.methods.factorize.config import FactorizeConfig
from minreal.compress.methods.magnitude import MagnitudeConfig
from minreal.compress.registry import compress_chain

ROOT = Path(__file__).resolve().parents[2]
QUICK_BENCH = ["--min-seconds", "0.05", "--repeats", "1"]


@pytest.fixture
def user_resnet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(ROOT / "examples" / "resnet20_user.py", tmp_path / "resnet20_user.py")
    monkeypatch.chdir(tmp_path)
    model = load_model("resnet20_user.py:resnet20")
    torch.manual_seed(0)
    for m in model.modules():  # BatchNorm statistics as after training, so no layer is the identity
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 2.0)
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "old.pt")
    calib, _ = digits32(0, 0.25)
    np.savez(tmp_path / "data.npz", x=calib.x[:96].numpy(), y=calib.y[:96].numpy())
    return tmp_path


def test_user_resnet20_runs_through_every_width_method(user_resnet: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["run", "--allow-data-mismatch", "resnet20_user.py:resnet20", "--weights", "old.pt", "--data", "data.npz",
            "-m", "cbalanced", "-m", "fde", "-m", "magnitude", "-m", "wanda",
            "--out", "runs/w", "--batch", "1", "--no-int8", "-q", *QUICK_BENCH]
    code, err = run(args), capsys.readouterr().err
    assert code == 0, err
    report = json.loads(Path("runs/w/report.json").read_text())
    variants = {v["label"]: v for v in report["cases"][0]["variants"]}
    assert set(variants) == {"original", "cbalanced", "fde", "magnitude", "wanda"}
    for name in ("cbalanced", "magnitude", "wanda"):
        assert variants[name]["macs"] < variants["original"]["macs"], name  # channels really went
    for v in variants.values():
        assert v["parity"]["passed"], v["label"]  # ONNX Runtime agrees with torch after every cut


def test_width_then_factorize_chain_keeps_onnx_parity(user_resnet: Path) -> None:
    from minreal.export.onnx_export import to_onnx
    from minreal.export.verify import verify_parity

    model = load_model("resnet20_user.py:resnet20", weights="old.pt").eval()
    torch.manual_seed(1)
    data = Dataset(torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,)))
    small, report = compress_chain(model, data, [("magnitude", MagnitudeConfig(mac_ratio=0.6, width_multiple=8)),
                                                 ("factorize", FactorizeConfig(mac_ratio=0.8))])
    assert report.mac_ratio <= 0.6 + 1e-9
    path = to_onnx(small, data.x[:2], user_resnet / "chain.onnx").path
    result = verify_parity(small, path, [data.x[:1], data.x[:3]])
    assert result.passed, result
