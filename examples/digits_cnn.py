"""The demo's digits CNN as a model file, and a command that trains it, so `minreal tune` and `minreal run` can be
tried on a trained model in two commands:

    .venv/bin/python examples/digits_cnn.py --out digits_cnn.pt          # seeded, about 20 s on 2 cores
    minreal tune examples/digits_cnn.py:make --weights digits_cnn.pt --data digits --max-accuracy-drop 0.5

The architecture and training are those of ``minreal demo``'s digits-cnn case (scikit-learn's digits, 8×8, the
demo's held-out split is never trained on).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from minreal.compress.models import small_cnn


def make() -> nn.Module:
    """The untrained digits CNN (load trained weights with ``--weights``)."""
    torch.manual_seed(0)
    return small_cnn(1, (32, 64, 64), 10)


def main() -> None:
    from minreal.compress.core.train import TrainConfig, train
    from minreal.compress.datasets import digits
    from minreal.runtime_bench.atomic import atomic_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="digits_cnn.pt", help="Where the trained state dict goes.")
    ap.add_argument("--epochs", type=int, default=12)
    args = ap.parse_args()
    model = make()
    tr, te = digits(seed=0)
    fit, val = tr.split(0.15, seed=1)
    train(model, fit, val, TrainConfig(epochs=args.epochs, seed=0))
    with torch.no_grad():
        acc = float((model.eval()(te.x).argmax(1) == te.y).float().mean())
    with atomic_path(args.out) as tmp:
        torch.save(model.state_dict(), tmp)
    print(f"wrote {args.out}: held-out accuracy {100 * acc:.2f} % on {len(te)} digits")


if __name__ == "__main__":
    main()
