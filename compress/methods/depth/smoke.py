"""The tiny case the checks shared by every method run depth on."""

from __future__ import annotations

import torch

from ...core.smoke import SmokeCase


def smoke_case() -> SmokeCase:
    """A seeded CIFAR-style ResNet (two blocks per stage, one input channel) on 240 8×8 digits, 0.8 of the MACs."""
    from ...datasets import digits
    from ...models import CifarResNet
    from . import DepthConfig

    torch.manual_seed(0)
    model = CifarResNet(blocks_per_stage=2, in_channels=1).eval()
    train, _ = digits(seed=0)
    return SmokeCase(model, train.take(240), DepthConfig(mac_ratio=0.8, score_samples=64))
