"""Recovery under DistributedDataParallel (minreal.compress.core.recover with a torch.distributed process group).

Two gloo ranks on the CPU run the worker ``ddp_recover_entry.py``; the single-process reference runs here, in a
process without a group.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import runpy
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minreal.compress.core.recover import recover

ENTRY = Path(__file__).with_name("ddp_recover_entry.py")
WORKER = runpy.run_path(str(ENTRY))  # its case() and CONFIG, without running main()
CONFIG = WORKER["CONFIG"]
STEPS = 7  # 410 training samples in batches of 63
LAUNCH_TIMEOUT_S = 120  # a hung rank fails the test instead of the suite
TOL = 1e-4 * STEPS * CONFIG.lr
"""Largest allowed weight difference from the single process. Each AdamW update moves a weight by about lr at most
(|m̂/√v̂| ≲ 1); with the same global batches and losses weighted to the batch mean, the ranks' averaged gradient
differs from the single process's only by float32 summation order (a relative ~1e-6), so each update by ~1e-6·lr.
1e-4·lr per step leaves a factor of 100 for growth through the steps and for the teacher outputs and BatchNorm
statistics being computed in other batches (measured: 2.5e-7 against TOL = 7e-6)."""

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", **extra}


def _torchrun(mode: str, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(ENTRY), "--mode", mode,
           "--out", str(out)]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)


def _max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], buffers: bool = True) -> float:
    keys = [k for k, v in a.items() if v.is_floating_point() and (buffers or "running_" not in k)]
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in keys)


def test_ddp_recovery_matches_one_process_with_frozen_batchnorm(tmp_path: Path) -> None:
    run = _torchrun("train", tmp_path / "ddp.pt")
    assert run.returncode == 0, run.stderr[-3000:]
    ddp = torch.load(tmp_path / "ddp.pt")
    assert ddp["world"] == 2 and ddp["rank_gap"] == 0.0  # DDP keeps the ranks' weights bit-identical
    assert ddp["ranks"] == [(STEPS, False)] * 2

    teacher, student, data = WORKER["case"]()
    start = copy.deepcopy(student.state_dict())
    ref = recover(teacher, student, data, dataclasses.replace(CONFIG, freeze_batchnorm=True))
    got = ddp["result"]
    assert (got["steps"], got["epochs"], got["samples_seen"], got["best_epoch"]) == (STEPS, 1, 410, 1)
    assert (ref.steps, ref.samples_seen, ref.best_epoch) == (STEPS, 410, 1)
    assert _max_gap(ddp["state"], student.state_dict()) < TOL  # weights and BatchNorm statistics
    assert _max_gap(ddp["state"], start, buffers=False) > 1000 * TOL  # it trained: measured 0.045
    assert got["before"] == pytest.approx(ref.before, rel=1e-6)  # sums and counts of the two halves
    one_sample = 1 / got["held_out_samples"]
    for name, value in ref.after.items():
        assert got["after"][name] == pytest.approx(value, rel=1e-4, abs=one_sample if name != "kl" else 0)

    # the comparison tells the BatchNorm treatments apart: batch statistics give other weights
    _, batch_stats, _ = WORKER["case"]()
    recover(teacher, batch_stats, data, CONFIG)
    assert _max_gap(ddp["state"], batch_stats.state_dict(), buffers=False) > 100 * TOL  # measured 0.08


def test_first_sigint_on_one_rank_stops_every_rank_after_the_same_step(tmp_path: Path) -> None:
    run = _torchrun("interrupt", tmp_path / "ddp.pt")
    assert run.returncode == 0, run.stderr[-3000:]
    ddp = torch.load(tmp_path / "ddp.pt")
    assert ddp["ranks"] == [(3, True), (3, True)]  # rank 1 was signalled at its third step; rank 0 stopped too
    assert ddp["result"]["best_epoch"] == 0 and ddp["rank_gap"] == 0.0
    assert "recovery interrupted after 3 steps" in run.stderr


def test_an_exception_on_one_rank_makes_every_rank_exit_non_zero(tmp_path: Path) -> None:
    """The two ranks are started directly (env:// initialisation), not by torchrun, whose agent would kill rank 0
    as soon as rank 1 failed and so hide a hang: rank 0 must fail by itself, at the latest the worker's collective
    timeout after rank 1 is gone (in practice at once: rank 1's connection closes)."""
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    with contextlib.ExitStack() as stack:
        procs = [subprocess.Popen([sys.executable, str(ENTRY), "--mode", "fail", "--out", str(tmp_path / "ddp.pt")],
                                  env=_env(**env, RANK=str(r), LOCAL_RANK=str(r)),
                                  stderr=stack.enter_context(log.open("w"))) for r, log in enumerate(logs)]
        for p in procs:
            stack.callback(lambda p=p: (p.kill(), p.wait()))  # no-op once exited
        procs[1].wait(timeout=LAUNCH_TIMEOUT_S)
        failed_at = time.monotonic()
        procs[0].wait(timeout=WORKER["TIMEOUT_S"] + 10)
        lag = time.monotonic() - failed_at
    errors = [log.read_text() for log in logs]
    assert procs[0].returncode != 0 and procs[1].returncode != 0, errors
    assert lag < WORKER["TIMEOUT_S"] + 10, lag  # measured 0.8 s (exit included)
    assert "recovery failed on rank 1 of 2: RuntimeError: injected failure on rank 1" in errors[1]
    assert "recovery failed on rank 0 of 2" in errors[0]  # it stopped at a collective, with an error
    assert not (tmp_path / "ddp.pt").exists()
