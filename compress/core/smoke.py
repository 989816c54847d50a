"""The smoke case a method package provides for the checks every registered method must pass (tests parametrise
over the registry and read :attr:`~minreal.compress.core.spec.MethodSpec.smoke_case`), and the tiny seeded pieces
several methods' cases share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .data import Dataset

__all__ = ["SmokeCase", "digits_subset", "digits_mlp"]


@dataclass(frozen=True)
class SmokeCase:
    """A tiny seeded model, data suited to the method, a small (fast) config, and extra dynamic ONNX input axes.

    Attributes
    ----------
    model : nn.Module
        Seeded model in eval mode that the method compresses to fewer parameters.
    data : Dataset
        Calibration (and, if the method trains, labelled) data; its inputs also feed the parity check.
    config : object
        An instance of the method's config class, small enough for a test.
    dynamic_dims : dict of int to str
        Input axes besides the batch that the ONNX export leaves dynamic (e.g. ``{1: "seq"}``).
    """

    model: nn.Module
    data: Dataset
    config: Any
    dynamic_dims: dict[int, str] = field(default_factory=dict)


def digits_subset(n: int = 240) -> Dataset:
    """The first ``n`` flattened training digits (64 features, 10 classes; offline)."""
    from ..datasets import digits

    train, _ = digits(seed=0, as_images=False)
    return train.take(n)


def digits_mlp(seed: int = 10) -> nn.Module:
    """Seeded untrained 64 → 48 → 32 → 10 ReLU MLP for the digits, in eval mode."""
    from ..models import mlp

    torch.manual_seed(seed)
    return mlp(64, [48, 32], 10).eval()
