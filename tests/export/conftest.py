"""Tiny seeded models and exported files for the export-stage tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from minreal.export.onnx_export import ExportResult, to_onnx


class ConvNet(nn.Module):
    """Conv→ReLU→Conv→ReLU→pool→Linear classifier on 3×12×12 images, 5 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU()
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class TwoHeads(nn.Module):
    """MLP trunk with two outputs: class logits and an embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.logits = nn.Linear(32, 4)
        self.embed = nn.Linear(32, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.logits(h), self.embed(h)


class SeqMixer(nn.Module):
    """Causal-ish depthwise conv over time then a channel mix: input (batch, seq, 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=1, groups=4)
        self.mix = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(torch.tanh(self.conv(x.transpose(1, 2))).transpose(1, 2))


def images(n: int, seed: int) -> torch.Tensor:
    """``n`` seeded 3×12×12 standard-normal images."""
    return torch.randn(n, 3, 12, 12, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="session")
def make_images() -> Callable[[int, int], torch.Tensor]:
    """Factory: ``make_images(n, seed)`` gives ``n`` seeded ConvNet inputs."""
    return images


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="session")
def convnet() -> ConvNet:
    """A seeded ConvNet in eval mode (shared: copy before changing it)."""
    torch.manual_seed(10)
    return ConvNet().eval()


@pytest.fixture(scope="session")
def convnet_onnx(convnet: ConvNet, export_dir: Path) -> ExportResult:
    """The ConvNet exported once (dynamo, opset 18, dynamic batch)."""
    return to_onnx(convnet, images(2, seed=0), export_dir / "convnet.onnx")


@pytest.fixture(scope="session")
def two_heads() -> TwoHeads:
    """A seeded two-output MLP in eval mode (shared: copy before changing it)."""
    torch.manual_seed(11)
    return TwoHeads().eval()


@pytest.fixture
def seq_mixer() -> SeqMixer:
    torch.manual_seed(5)
    return SeqMixer().eval()


@pytest.fixture(scope="session")
def two_heads_onnx(two_heads: TwoHeads, export_dir: Path) -> ExportResult:
    return to_onnx(two_heads, torch.randn(3, 10), export_dir / "two_heads.onnx")


@pytest.fixture(scope="session")
def calib_images() -> np.ndarray:
    """64 calibration images (float32)."""
    return images(64, seed=1).numpy()
