"""Trained models the benchmarks share, cached under ``benchmarks/cache/`` (a state dict and a JSON record).

:func:`resnet20_digits32` trains the built-in ``resnet20_cifar`` (He et al. 2016, §4.2, option-A shortcuts) on
the calibration split of the built-in ``digits32`` data (the held-out split is only measured, never trained or
selected on) and caches the weights; a later call with the same seed, epochs and recipe loads the cache. The
weights load with ``minreal ... resnet20_cifar --weights benchmarks/cache/resnet20_cifar_digits32.pt``.

Run: ``OMP_WAIT_POLICY=PASSIVE python benchmarks/trained_models.py [--seed 0] [--epochs 15] [--retrain]``
(CPU, 2 threads, about two minutes). Writes ``cache/resnet20_cifar_digits32.pt`` and ``.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from _common import write_json
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.evaluate import predict
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.datasets import digits32
from minreal.compress.models import resnet20_cifar
from minreal.runtime_bench import atomic_path

__all__ = ["CACHE_DIR", "TrainedModel", "TrainingRecord", "cache_paths", "resnet20_digits32"]

log = logging.getLogger(__name__)

CACHE_DIR = Path(__file__).resolve().parent / "cache"
STEM = "resnet20_cifar_digits32"
DEFAULT_SEED = 0
DEFAULT_EPOCHS = 15
#: How the model is trained; a cache made with another recipe is not reused.
RECIPE: dict[str, Any] = {"optimizer": "Adam", "lr": 3e-3, "weight_decay": 0.0, "schedule": "cosine",
                          "batch_size": 64, "augmentation": None, "kept_epoch": "lowest training loss"}


@dataclass(frozen=True)
class TrainingRecord:
    """What the cached weights are and how well they do (the JSON next to them)."""

    model: str
    data: str
    seed: int
    epochs: int
    heldout_top1: float
    heldout_samples: int
    calib_samples: int
    train_seconds: float
    threads: int
    torch_version: str
    created: str
    weights_sha256: str
    recipe: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainedModel:
    """The trained model (eval mode), its record, and whether it came from the cache."""

    model: nn.Module
    record: TrainingRecord
    cached: bool


def cache_paths(seed: int = DEFAULT_SEED, epochs: int = DEFAULT_EPOCHS, cache_dir: Path = CACHE_DIR
                ) -> tuple[Path, Path]:
    """(weights, record) paths; the default seed and epochs get the plain name, others carry theirs."""
    default = (seed, epochs) == (DEFAULT_SEED, DEFAULT_EPOCHS)
    stem = STEM if default else f"{STEM}_seed{seed}_epochs{epochs}"
    return cache_dir / f"{stem}.pt", cache_dir / f"{stem}.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _top1(model: nn.Module, data: Dataset) -> float:
    return float((predict(model, data).argmax(1) == data.y).float().mean())


def _load_cached(seed: int, epochs: int, cache_dir: Path) -> TrainedModel | None:
    """The cached model if both files exist, match the seed, epochs and recipe, and the weights are intact."""
    weights, record_path = cache_paths(seed, epochs, cache_dir)
    if not (weights.is_file() and record_path.is_file()):
        return None
    record = TrainingRecord(**json.loads(record_path.read_text()))
    if (record.seed, record.epochs, record.recipe) != (seed, epochs, RECIPE):
        log.warning("cache %s was made with another seed, epochs or recipe; retraining", weights)
        return None
    if _sha256(weights) != record.weights_sha256:
        log.warning("cache %s does not match the checksum in %s; retraining", weights, record_path.name)
        return None
    model = resnet20_cifar(num_classes=10)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return TrainedModel(model.eval(), record, cached=True)


def _train(calib: Dataset, seed: int, epochs: int, threads: int) -> tuple[nn.Module, float]:
    """Train on ``calib`` alone (no validation data); return the model and the training wall time in seconds."""
    torch.manual_seed(seed)
    model = resnet20_cifar(num_classes=10)
    cfg = TrainConfig(epochs=epochs, batch_size=RECIPE["batch_size"], lr=RECIPE["lr"],
                      weight_decay=RECIPE["weight_decay"], patience=epochs, seed=seed)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        train(model, calib, None, cfg)
        return model.eval(), time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)


def resnet20_digits32(seed: int = DEFAULT_SEED, epochs: int = DEFAULT_EPOCHS, cache_dir: Path = CACHE_DIR,
                      threads: int = 2, retrain: bool = False) -> TrainedModel:
    """``resnet20_cifar`` trained on ``digits32``'s calibration split, from the cache when it holds this run.

    Args:
        seed: seed of the data split (as ``--seed`` in minreal), the initialisation and the batch order.
        epochs: training epochs (Adam, cosine schedule; see ``RECIPE``).
        cache_dir: folder of the cached weights and record (created if missing).
        threads: CPU threads used for training.
        retrain: train even when a matching cache exists (and replace it).

    Returns:
        The model in eval mode, its :class:`TrainingRecord` (held-out top-1 on ``digits32``'s held-out split)
        and whether it was loaded from the cache.
    """
    cached = None if retrain else _load_cached(seed, epochs, cache_dir)
    if cached is not None:
        return cached
    calib, held_out = digits32(seed)
    model, seconds = _train(calib, seed, epochs, threads)
    weights, record_path = cache_paths(seed, epochs, cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(weights) as tmp:
        torch.save(model.state_dict(), tmp)
    record = TrainingRecord(
        model="resnet20_cifar", data="digits32", seed=seed, epochs=epochs, heldout_top1=_top1(model, held_out),
        heldout_samples=len(held_out), calib_samples=len(calib), train_seconds=round(seconds, 1), threads=threads,
        torch_version=torch.__version__, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        weights_sha256=_sha256(weights), recipe=dict(RECIPE))
    write_json(record_path, asdict(record))
    return TrainedModel(model, record, cached=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--retrain", action="store_true", help="train even when the cache holds this run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = resnet20_digits32(args.seed, args.epochs, threads=args.threads, retrain=args.retrain)
    r = result.record
    print(f"{'loaded' if result.cached else 'trained'} {r.model} on {r.data} (seed {r.seed}, {r.epochs} epochs, "
          f"{r.train_seconds:.0f} s): held-out top-1 {r.heldout_top1:.2%} on {r.heldout_samples} samples; "
          f"{cache_paths(r.seed, r.epochs)[0]}")


if __name__ == "__main__":
    main()
