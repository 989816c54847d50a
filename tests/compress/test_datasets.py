"""Built-in offline data: digits32 is the digits split, upsampled to CIFAR-sized RGB."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minreal.compress.datasets import digits, digits32


def test_digits32_shapes_dtype_and_range() -> None:
    calib, held_out = digits32(seed=0)
    assert calib.x.shape[1:] == held_out.x.shape[1:] == (3, 32, 32)
    assert calib.x.dtype == torch.float32 and calib.y.dtype == torch.int64
    assert float(calib.x.min()) >= 0.0 and float(calib.x.max()) <= 1.0


def test_digits32_has_the_digits_split_for_every_seed() -> None:
    for seed, fraction in ((0, 0.25), (3, 0.4)):
        small = digits(seed, fraction, as_images=True)
        large = digits32(seed, fraction)
        for s, l in zip(small, large):
            assert torch.equal(s.y, l.y)
            assert torch.equal(l.x[:, 0], l.x[:, 1]) and torch.equal(l.x[:, 0], l.x[:, 2])
            expected = F.interpolate(s.x, size=(32, 32), mode="bilinear", align_corners=False)[:, 0]
            assert torch.equal(l.x[:, 0], expected)


def test_digits32_upsampling_keeps_the_image_mean() -> None:
    # bilinear upsampling by an integer factor (half-pixel centres) keeps interior averages; borders are
    # replicated, so the means agree to within the border weight
    small, _ = digits(0, as_images=True)
    large, _ = digits32(0)
    assert torch.allclose(large.x.mean(dim=(1, 2, 3)), small.x.mean(dim=(1, 2, 3)), atol=0.05)
