"""Shared fixtures of the application tests: a factory file with model and data callables (the working directory
with ``net.py`` and the in-process CLI runner, ``run_cli``, are in ``tests/conftest.py``)."""

from __future__ import annotations

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
