"""Models whose forward returns a dict of tensors (issue 44: torchvision's segmentation models, Hugging Face
``ModelOutput``s): compressed by a rank and a width method, exported with the dict's keys as the graph's output
names, and checked for parity, through the command line as a user runs it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from minreal.export.onnx_export import to_onnx

#: ``seg.py`` of the command-line tests: deeplabv3's output structure (``OrderedDict(out=..., aux=...)``) in
#: miniature; before issue 44 `minreal compress` stopped on it with torch's "expected Tensor as element 0 in
#: argument 0, but got collections.OrderedDict".
SEG_FACTORY = """
from collections import OrderedDict

import torch
from torch import nn


class Seg(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                  nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.head, self.aux = nn.Conv2d(32, 5, 1), nn.Conv2d(32, 2, 1)

    def forward(self, x):
        f = self.body(x)
        return OrderedDict(out=self.head(f), aux=self.aux(f))


def build():
    torch.manual_seed(0)
    return Seg()
"""


class Keyed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.a(x), "pooled": self.b(x)}


def _outputs(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {session.get_inputs()[0].name: x})))


def test_dict_keys_name_the_graph_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Keyed().eval()
    result = to_onnx(model, torch.randn(2, 6), tmp_path / "keyed.onnx")
    assert result.output_names == ["logits", "pooled"]
    x = torch.randn(5, 6)
    got = _outputs(tmp_path / "keyed.onnx", x.numpy())
    with torch.no_grad():
        want = model(x)
    for key in ("logits", "pooled"):
        np.testing.assert_allclose(got[key], want[key].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["factorize", "magnitude"])
def test_a_dict_output_model_goes_through_compress_and_export(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: Callable[[list[str]], tuple[int, str, str]],
        method: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "seg.py").write_text(SEG_FACTORY)
    x = np.random.default_rng(0).standard_normal((16, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    code, _, err = run_cli(["compress", "seg.py:build", "--data", "d.npz", "-m", method, "--mac-ratio", "0.7",
                            "--out", "c.pt2", "-q"])
    assert code == 0, err
    code, _, err = run_cli(["export", "c.pt2", "--data", "d.npz", "--out", "c.onnx", "-q"])
    assert code == 0, err  # export verifies parity against torch itself
    assert [o.name for o in onnx.load(str(tmp_path / "c.onnx")).graph.output] == ["out", "aux"]
    got = _outputs(tmp_path / "c.onnx", x[:3])
    assert got["out"].shape == (3, 5, 8, 8) and got["aux"].shape == (3, 2, 8, 8)
