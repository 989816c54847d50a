"""Small reference architectures used by the demo, the tests and the benchmarks (plain torch modules)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["mlp", "small_cnn", "resnet20_cifar", "CifarResNet", "ACTIVATIONS"]

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU, "leaky_relu": nn.LeakyReLU, "silu": nn.SiLU, "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid, "gelu": nn.GELU, "identity": nn.Identity,
}


def mlp(in_features: int, widths: list[int], out_features: int, activation: str = "relu") -> nn.Sequential:
    """Linear+activation stack: ``in → widths[0] → … → widths[-1] → out`` (flattens its input)."""
    act = ACTIVATIONS[activation]
    layers: list[nn.Module] = [nn.Flatten()]
    prev = in_features
    for w in widths:
        layers += [nn.Linear(prev, w), act()]
        prev = w
    layers.append(nn.Linear(prev, out_features))
    return nn.Sequential(*layers)


def small_cnn(in_channels: int = 1, widths: tuple[int, ...] = (32, 64, 64), num_classes: int = 10) -> nn.Sequential:
    """Conv-BN-ReLU stages (the second and third stride 2), global average pool, linear head."""
    layers: list[nn.Module] = []
    prev = in_channels
    for i, w in enumerate(widths):
        layers += [nn.Conv2d(prev, w, 3, stride=1 if i == 0 else 2, padding=1, bias=False),
                   nn.BatchNorm2d(w), nn.ReLU()]
        prev = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(prev, num_classes)]
    return nn.Sequential(*layers)


def _subsample_and_pad(x: torch.Tensor, pad: int) -> torch.Tensor:
    """He et al. (2016) §4.2 option A: stride-2 identity whose extra channels are zeros (``pad`` each side)."""
    return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, pad, pad))


class LambdaLayer(nn.Module):
    """A module that applies a function without parameters (how option-A shortcuts are commonly written)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers with a ReLU between them and after the residual sum."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = LambdaLayer(partial(_subsample_and_pad, pad=planes // 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """He et al. (2016) §4.2 CIFAR ResNet: 3×3 conv(16), three stages of basic blocks (16/32/64 channels,
    stride 2 at stages 2 and 3) with option-A shortcuts, global average pool, linear head."""

    def __init__(self, blocks_per_stage: int = 3, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._stage(16, 16, blocks_per_stage, stride=1)
        self.layer2 = self._stage(16, 32, blocks_per_stage, stride=2)
        self.layer3 = self._stage(32, 64, blocks_per_stage, stride=2)
        self.linear = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    @staticmethod
    def _stage(in_planes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
        return nn.Sequential(BasicBlock(in_planes, planes, stride),
                             *(BasicBlock(planes, planes) for _ in range(blocks - 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


def resnet20_cifar(num_classes: int = 10) -> CifarResNet:
    """ResNet-20 for 3×32×32 inputs (He et al. 2016, §4.2, n = 3; ≈0.27M parameters at 10 classes)."""
    return CifarResNet(blocks_per_stage=3, num_classes=num_classes)
