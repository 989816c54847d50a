"""Data that ships offline: scikit-learn's digits, as tensors with a seeded train/test split."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .core.data import Dataset

__all__ = ["digits", "digits32", "sequential_digits", "synthetic_sequences"]


def digits(seed: int = 0, test_fraction: float = 0.25, as_images: bool = True) -> tuple[Dataset, Dataset]:
    """scikit-learn's 8×8 digits scaled to [0, 1]: (train, test); images are (N, 1, 8, 8) float32."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    if as_images:
        x = x.reshape(-1, 1, 8, 8)
    full = Dataset(torch.from_numpy(x), torch.from_numpy(d.target.astype(np.int64)))
    return full.split(test_fraction, seed)


def _upsampled(data: Dataset, size: int, channels: int) -> Dataset:
    """Images (N, 1, h, w) resized bilinearly to (N, ``channels``, ``size``, ``size``), the channel replicated."""
    x = F.interpolate(data.x, size=(size, size), mode="bilinear", align_corners=False)
    return Dataset(x.expand(-1, channels, -1, -1).contiguous(), data.y)


def digits32(seed: int = 0, test_fraction: float = 0.25) -> tuple[Dataset, Dataset]:
    """The 8×8 digits as CIFAR-sized RGB images: (train, test) of (N, 3, 32, 32) float32 in [0, 1].

    Each image is upsampled bilinearly to 32×32 and replicated to three channels; the samples of each
    split are those of :func:`digits` with the same ``seed`` and ``test_fraction``, in the same order.
    """
    train, test = digits(seed, test_fraction, as_images=True)
    return _upsampled(train, 32, 3), _upsampled(test, 32, 3)


def sequential_digits(seed: int = 0, test_fraction: float = 0.25) -> tuple[Dataset, Dataset]:
    """The 8×8 digits read pixel by pixel (row-major): (train, test) sequences (N, 64, 1) float32."""
    train, test = digits(seed, test_fraction, as_images=False)
    seq = lambda d: Dataset(d.x.reshape(len(d), 64, 1), d.y)  # noqa: E731
    return seq(train), seq(test)


def synthetic_sequences(n: int = 2000, length: int = 512, classes: int = 4, noise: float = 1.0,
                        seed: int = 0, test_fraction: float = 0.25) -> tuple[Dataset, Dataset]:
    """A longer sequence task generated in code: (train, test) of (n, length, 1) float32.

    Each sequence is Gaussian noise plus one short windowed sine burst (32 steps) at a random position;
    the class is the burst's frequency (one of ``classes`` on a grid in (0, π/2)). The burst's position is
    uniform, so the model must carry the evidence to its time-average read-out.
    """
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    freq = 0.25 + (1.3 * y.double() / max(classes - 1, 1))
    start = torch.randint(0, length - 32, (n,), generator=g)
    t = torch.arange(length, dtype=torch.float64)[None]
    phase = 2 * torch.pi * torch.rand(n, 1, generator=g, dtype=torch.float64)
    local = t - start[:, None]
    window = ((local >= 0) & (local < 32)).double() * torch.sin(torch.pi * local.clamp(0, 31) / 31) ** 2
    x = 2.0 * window * torch.sin(freq[:, None] * local + phase) + noise * torch.randn(n, length, generator=g,
                                                                                       dtype=torch.float64)
    full = Dataset(x.float()[..., None], y)
    return full.split(test_fraction, seed)
