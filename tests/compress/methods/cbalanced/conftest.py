"""A CIFAR ResNet-20 written as user code (option-A shortcuts: ``F.pad`` in a lambda module) and small images."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.compress.core.data import Dataset

USER_RESNET = Path(__file__).resolve().parents[4] / "examples" / "resnet20_user.py"


def _user_module():
    spec = importlib.util.spec_from_file_location("resnet20_user_for_tests", USER_RESNET)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def randomise_batchnorms(model: nn.Module) -> nn.Module:
    """Non-trivial BatchNorm statistics and affine maps, so surgery must carry them correctly."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return model


@pytest.fixture
def resnet20_user() -> nn.Module:
    """Seeded user-code ResNet-20 (16/32/64 channels, 10 classes) in eval mode."""
    torch.manual_seed(20)
    return randomise_batchnorms(_user_module().resnet20()).eval()


@pytest.fixture
def small_images() -> Dataset:
    """64 seeded 3×16×16 images with 10 classes."""
    g = torch.Generator().manual_seed(21)
    return Dataset(torch.randn(64, 3, 16, 16, generator=g), torch.randint(0, 10, (64,), generator=g))
