"""C-balanced realisation on MNIST or CIFAR-10 files you already have (not run in CI; no downloads).

MNIST: a folder with ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
``t10k-labels-idx1-ubyte`` (optionally ``.gz``). CIFAR-10: the ``cifar-10-batches-bin`` folder
(``data_batch_1.bin`` … ``data_batch_5.bin``, ``test_batch.bin``).

    OMP_WAIT_POLICY=PASSIVE python examples/cbalanced_mnist_cifar.py mnist  /data/mnist
    OMP_WAIT_POLICY=PASSIVE python examples/cbalanced_mnist_cifar.py cifar10 /data/cifar-10-batches-bin

Trains the paper's MLP (MNIST 4×256 SiLU; CIFAR-10 [2048, 1024, 1024, 512] SiLU), ranks its states by the
A/B/C Gramian tests, realises the C widths (warm start + distillation) and prints the comparison with the
uniform-width control. The paper reports MNIST 1024 → 277 states, 400,906 → 106,323 params, 95.45% vs 96.60%;
CIFAR-10 9.97M → 1.69M params, 54.44% vs 54.45%.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np
import torch

from minreal.compress.core.data import Dataset
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.methods.cbalanced import CBalancedConfig
from minreal.compress.models import mlp
from minreal.compress.registry import compress


def _open(path: Path) -> bytes:
    gz = path.with_name(path.name + ".gz")
    if path.is_file():
        return path.read_bytes()
    if gz.is_file():
        return gzip.decompress(gz.read_bytes())
    raise FileNotFoundError(f"missing {path} (or {gz.name})")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST): big-endian header of dims after a magic number whose low byte is the rank."""
    raw = _open(path)
    ndim = raw[3]
    dims = np.frombuffer(raw, ">u4", ndim, 4)
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_mnist(folder: Path) -> tuple[Dataset, Dataset]:
    def part(prefix: str) -> Dataset:
        x = read_idx(folder / f"{prefix}-images-idx3-ubyte").reshape(-1, 784).astype(np.float32) / 255.0
        y = read_idx(folder / f"{prefix}-labels-idx1-ubyte").astype(np.int64)
        return Dataset(torch.from_numpy(x), torch.from_numpy(y))
    return part("train"), part("t10k")


def load_cifar10(folder: Path) -> tuple[Dataset, Dataset]:
    """CIFAR-10 binary batches: rows of 1 label byte + 3072 pixel bytes (CHW)."""
    def part(names: list[str]) -> Dataset:
        rows = np.concatenate([np.frombuffer(_open(folder / n), np.uint8).reshape(-1, 3073) for n in names])
        x = rows[:, 1:].astype(np.float32) / 255.0
        return Dataset(torch.from_numpy((x - x.mean(0)) / (x.std(0) + 1e-6)),
                       torch.from_numpy(rows[:, 0].astype(np.int64)))
    return part([f"data_batch_{i}.bin" for i in range(1, 6)]), part(["test_batch.bin"])


SETTINGS = {"mnist": (load_mnist, 784, [256] * 4), "cifar10": (load_cifar10, 3072, [2048, 1024, 1024, 512])}


def accuracy(model: torch.nn.Module, data: Dataset) -> float:
    with torch.no_grad():
        return float(torch.cat([model(x).argmax(1) for x in data.inputs(1024)]).eq(data.y).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description="C-balanced realisation on local MNIST / CIFAR-10 files")
    parser.add_argument("dataset", choices=sorted(SETTINGS))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--eps", type=float, default=1e-4)
    args = parser.parse_args()
    loader, d_in, widths = SETTINGS[args.dataset]
    train_set, test = loader(args.folder)
    rest, val = train_set.split(0.1, seed=0)
    torch.manual_seed(0)
    model = mlp(d_in, widths, 10, "silu")
    train(model, rest, val, TrainConfig(epochs=args.epochs, batch_size=128, lr=1e-3, seed=0))
    cfg = CBalancedConfig(energy_eps=args.eps, gramian_samples=4000, go_samples=2000, controls=True)
    recovery = RecoveryConfig(epochs=args.epochs, batch_size=128, lr=1e-3, seed=0)  # trains the realised network
    realised, report = compress(model.eval(), train_set, "cbalanced", cfg, recovery)
    summary = {"ranks_c": report.predicted["ranks_c"], "state_order": report.predicted["state_order"],
               "params": [report.params_before, report.params_after],
               "test_accuracy": [accuracy(model, test), accuracy(realised, test)],
               "variants (validation)": report.measured["variants"], "recovery": report.recovery,
               "timings_s": report.timings_s}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
