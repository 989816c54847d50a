"""Worker of tests/compress/core/test_ddp_recover.py, started by ``python -m torch.distributed.run``.

Every rank builds the same seeded case (:func:`case`), joins a gloo process group with a short collective timeout and
runs one :func:`~minreal.compress.core.recover.recover`; rank 0 alone writes the weights, the result and what the ranks
reported to ``OUT``. ``--mode fail`` makes rank 1 raise at its third step, ``--mode interrupt`` sends rank 1 a
SIGINT at its third step. The test imports :func:`case` and :data:`CONFIG` (``runpy.run_path``) for the single-
process reference.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch import nn

import minreal.compress.core.recover as recover_mod
from minreal.compress.core.data import Dataset
from minreal.compress.core.distributed import is_writer
from minreal.compress.core.recover import recover
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.datasets import digits
from minreal.compress.models import small_cnn

TIMEOUT_S = 20
"""Collective timeout of the process group: a rank left waiting for a dead peer fails after this long at most."""
CONFIG = RecoveryConfig(epochs=1, batch_size=63, lr=1e-2, alpha=0.5, seed=3)
"""One epoch of 410 training samples: 6 batches of 63 (shares of 32 and 31) and one of 32 (16 and 16)."""


def case() -> tuple[nn.Module, nn.Module, Dataset]:
    """(original, student, data): two seeded BatchNorm CNNs and 512 labelled 8×8 digits."""
    torch.manual_seed(0)
    teacher = small_cnn(1, (8, 16, 16), 10).eval()
    torch.manual_seed(1)
    student = small_cnn(1, (8, 16, 16), 10).eval()
    train, _ = digits(seed=0, as_images=True)
    return teacher, student, train.take(512)


def _inject(mode: str) -> None:
    """On rank 1, wrap the optimiser step so that its third call raises (``fail``) or receives SIGINT first."""
    if mode == "train" or dist.get_rank() != 1:
        return
    step, calls = recover_mod._step, []

    def injected(*args: object) -> None:
        calls.append(1)
        if len(calls) == 3 and mode == "fail":
            raise RuntimeError("injected failure on rank 1")
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        step(*args)

    recover_mod._step = injected


def _rank_gap(model: nn.Module) -> float:
    """Largest difference between this rank's weights and buffers and rank 0's, over all ranks."""
    flat = torch.cat([v.double().flatten() for v in model.state_dict().values()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    gap = (flat - ref).abs().max().reshape(1)
    dist.all_reduce(gap, dist.ReduceOp.MAX)
    return float(gap)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("train", "fail", "interrupt"), default="train")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    logging.basicConfig(level=logging.WARNING, format=f"rank {dist.get_rank()}: %(name)s: %(message)s")
    try:
        teacher, student, data = case()
        _inject(args.mode)
        result = recover(teacher, student, data, CONFIG)
        gap, steps = _rank_gap(student), [None] * dist.get_world_size()
        dist.all_gather_object(steps, (result.steps, result.interrupted))
        if is_writer():
            torch.save({"state": student.state_dict(), "result": asdict(result), "rank_gap": gap,
                        "ranks": steps, "world": dist.get_world_size()}, args.out)
        del student, teacher  # the DDP state goes before the group does
        dist.barrier()  # both ranks done before either destroys the group (gloo aborts a rank torn down early)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
