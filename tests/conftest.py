"""Tiny seeded models and data shared by the test suite, and what the command-line tests share: a working
directory holding a factory file (``workdir``) and the CLI run in this process (``run_cli``)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.models import mlp, small_cnn


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def tiny_mlp() -> nn.Module:
    torch.manual_seed(1)
    return mlp(12, [32, 24], 5).eval()


@pytest.fixture
def mlp_data() -> Dataset:
    g = torch.Generator().manual_seed(2)
    return Dataset(torch.randn(96, 12, generator=g), torch.randint(0, 5, (96,), generator=g))


@pytest.fixture
def tiny_cnn() -> nn.Module:
    torch.manual_seed(3)
    model = small_cnn(3, (8, 16, 16), 4)
    model.eval()
    return model


@pytest.fixture
def grouped_cnn() -> nn.Module:
    torch.manual_seed(4)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=4), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4),
    ).eval()


@pytest.fixture
def image_data() -> Dataset:
    g = torch.Generator().manual_seed(5)
    return Dataset(torch.randn(48, 3, 12, 12, generator=g), torch.randint(0, 4, (48,), generator=g))


#: ``net.py`` of the command-line tests. ``make``: an MLP on the 64 features of the digits (digits-flat);
#: ``huge``: the same with one weight beyond float16's range; ``bn_net``: a conv net with BatchNorm on 3x8x8 inputs;
#: ``broken``: a model that no digits input fits; ``constant``: logits that ignore the input (accuracy at chance);
#: ``centroid``: an accurate digits classifier without training (nearest class mean).
CLI_FACTORY = """
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))


def huge():
    net = make()
    with torch.no_grad():
        net[1].weight[0, 28] = 1e5  # beyond float16's 65504 (a central pixel)
    return net


def bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))


def broken():
    return nn.Sequential(nn.Linear(3, 2))


def constant():
    # logits that do not depend on the input (every answer is class 9): accuracy at chance
    net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    with torch.no_grad():
        net[2].weight.mul_(1e-6)
        net[2].bias.copy_(torch.arange(10.0))
    return net


def centroid():
    # nearest class mean of the calibration digits: an accurate classifier without training
    from minreal.compress.datasets import digits

    train, _ = digits(seed=0, as_images=False)
    means = torch.stack([train.x[train.y == k].mean(0) for k in range(10)])
    net = nn.Sequential(nn.Linear(64, 10))
    with torch.no_grad():
        net[0].weight.copy_(means)
        net[0].bias.copy_(-0.5 * (means ** 2).sum(1))
    return net
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory (returned, and made the current one) holding only ``net.py``
    (:data:`CLI_FACTORY`), so that commands name the model ``net.py:make``."""
    (tmp_path / "net.py").write_text(CLI_FACTORY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run the CLI in this process: ``run_cli(args)`` gives its exit code, stdout and stderr (what it printed since
    the last call)."""
    from minreal.app.cli import run

    def invoke(args: list[str]) -> tuple[int, str, str]:
        code, out = run(args), capsys.readouterr()
        return code, out.out, out.err

    return invoke
