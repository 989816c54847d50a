"""Shared fixtures of the application tests: a factory file with model and data callables."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

FACTORY_SOURCE = '''
from torch import nn


def make(num_classes: int = 3) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, num_classes))


def not_a_model():
    return "hello"


def data():
    import numpy as np
    rng = np.random.default_rng(0)
    return rng.normal(size=(10, 4)).astype("float32"), np.arange(10) % 3


def batches():
    import torch
    for i in range(3):
        yield torch.full((4, 2), float(i)), torch.full((4,), i)


def ragged():
    import torch
    return [torch.zeros(2, 3), torch.zeros(2, 4)]


def text():
    return "not data"
'''


@pytest.fixture
def factory_file(tmp_path: Path) -> Path:
    path = tmp_path / "factory.py"
    path.write_text(FACTORY_SOURCE)
    return path


@pytest.fixture
def cli(capsys: pytest.CaptureFixture) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run the CLI in this process: ``cli(args)`` gives its exit code, stdout and stderr."""
    from minreal.app.cli import run

    def invoke(args: list[str]) -> tuple[int, str, str]:
        code, out = run(args), capsys.readouterr()
        return code, out.out, out.err

    return invoke


@pytest.fixture
def in_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """``in_folder(source)``: ``net.py`` holding ``source`` in a fresh working directory (returned)."""

    def make(source: str) -> Path:
        (tmp_path / "net.py").write_text(source)
        monkeypatch.chdir(tmp_path)
        return tmp_path

    return make
