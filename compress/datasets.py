"""Data that ships offline: scikit-learn's digits, as tensors with a seeded train/test split."""

from __future__ import annotations

import numpy as np
import torch

from .data import Dataset

__all__ = ["digits"]


def digits(seed: int = 0, test_fraction: float = 0.25, as_images: bool = True) -> tuple[Dataset, Dataset]:
    """scikit-learn's 8×8 digits scaled to [0, 1]: (train, test); images are (N, 1, 8, 8) float32."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    if as_images:
        x = x.reshape(-1, 1, 8, 8)
    full = Dataset(torch.from_numpy(x), torch.from_numpy(d.target.astype(np.int64)))
    return full.split(test_fraction, seed)
