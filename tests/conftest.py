"""Tiny seeded models and data shared by the test suite."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
