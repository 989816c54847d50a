"""The tiny case the checks shared by every method run ssm on."""

from __future__ import annotations

import torch

from ...core.data import Dataset
from ...core.smoke import SmokeCase


def smoke_case() -> SmokeCase:
    """Seeded one-block SSM classifier (2 inputs, 6 features, 8 states, 3 classes) on 24 random sequences of
    length 16; half the states truncated; the sequence axis stays dynamic in the export."""
    from .classifier import SSMClassifier
    from .config import SSMConfig

    torch.manual_seed(13)
    model = SSMClassifier(2, 6, 8, 1, 3).eval()
    g = torch.Generator().manual_seed(14)
    data = Dataset(torch.randn(24, 16, 2, generator=g), torch.randint(0, 3, (24,), generator=g))
    return SmokeCase(model, data, SSMConfig(trunc=0.5, error_samples=16), {1: "seq"})
