"""In-memory datasets handed to compression methods (inputs and optional labels)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["Dataset", "seeded_rows"]


def seeded_rows(n: int, count: int, seed: int = 0) -> torch.Tensor:
    """``count`` of the row indices ``0..n-1`` drawn without replacement (seeded, so that a smaller draw is part of a
    larger one), in increasing order; all of them when ``count >= n``."""
    if count >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:count].sort().values


@dataclass(frozen=True)
class Dataset:
    """Inputs ``x`` (first dim = samples) and optional targets ``y``.

    Methods receive one of these as calibration (and, where they train, training) data.
    """

    x: torch.Tensor
    y: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.y is not None and len(self.y) != len(self.x):
            raise ValueError(f"dataset has {len(self.x)} inputs but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.x)

    def batches(self, batch_size: int, shuffle: bool = False,
                generator: torch.Generator | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """Yield ``(x, y)`` batches (``y`` is None for unlabelled data)."""
        n = len(self.x)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            yield self.x[idx], (None if self.y is None else self.y[idx])

    def inputs(self, batch_size: int) -> Iterator[torch.Tensor]:
        """Yield input batches only."""
        for xb, _ in self.batches(batch_size):
            yield xb

    def sample(self, count: int, seed: int = 0) -> "Dataset":
        """``count`` samples drawn by :func:`seeded_rows`, in their original order; ``self`` when it has no more."""
        if count >= len(self):
            return self
        rows = seeded_rows(len(self), count, seed)
        return Dataset(self.x[rows], None if self.y is None else self.y[rows])

    def take(self, n: int) -> "Dataset":
        """The first ``n`` samples."""
        return Dataset(self.x[:n], None if self.y is None else self.y[:n])

    def split(self, fraction: float, seed: int = 0) -> tuple["Dataset", "Dataset"]:
        """Seeded random split into (rest, held-out ``fraction``)."""
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"split fraction must lie in (0, 1), got {fraction}")
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(self.x), generator=g)
        k = max(1, int(round(fraction * len(self.x))))
        held, rest = order[:k], order[k:]
        pick = lambda idx: Dataset(self.x[idx], None if self.y is None else self.y[idx])  # noqa: E731
        return pick(rest), pick(held)
