"""Seeded training of the SSM classifier with the Hankel nuclear-norm regulariser (shared by demo/benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.data import Dataset
from ...core.train import ProgressFn, TrainConfig, TrainResult, train
from .classifier import SSMClassifier, hankel_regulariser

__all__ = ["SSMTrainSpec", "train_ssm_classifier"]


@dataclass(frozen=True)
class SSMTrainSpec:
    """Architecture and schedule; ``reg_weight`` = 0 trains without the regulariser."""

    features: int = 24
    state: int = 32
    depth: int = 2
    reg_weight: float = 3e-3
    epochs: int = 8
    batch_size: int = 64
    lr: float = 5e-3
    seed: int = 0


def train_ssm_classifier(train_data: Dataset, val: Dataset | None, spec: SSMTrainSpec,
                         progress: ProgressFn | None = None) -> tuple[SSMClassifier, TrainResult]:
    """Build (seeded) and train an :class:`SSMClassifier`; returns it in eval mode with its history."""
    torch.manual_seed(spec.seed)
    classes = int(train_data.y.max()) + 1
    model = SSMClassifier(train_data.x.shape[-1], spec.features, spec.state, spec.depth, classes)
    reg = (lambda m: hankel_regulariser(m, spec.reg_weight)) if spec.reg_weight > 0 else None
    cfg = TrainConfig(epochs=spec.epochs, batch_size=spec.batch_size, lr=spec.lr, patience=spec.epochs,
                      seed=spec.seed)
    result = train(model, train_data, val, cfg, extra_loss=reg, progress=progress)
    return model.eval(), result
