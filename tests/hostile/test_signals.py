"""SIGTERM and SIGINT at each pipeline stage (sent by the process to itself through the MINREAL_FAULT_INJECT
test hook, so no sleeps): one line on stderr, no traceback, and nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minreal.app.pipeline import FAULT_ENV

RUN = ["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--mac-ratio", "0.6", "--data", "digits-flat",
       "--out", "runs/a", "--batch", "1", "-q", "--min-seconds", "0", "--repeats", "1"]
STAGES = ["export_original", "compress", "int8", "benchmark", "commit"]
OLD_RUN = {"schema_version": 1, "cases": []}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background shell may have ignored it; Python then maps it


def minreal(cwd: Path, args: list[str], fault: str) -> subprocess.CompletedProcess[str]:
    """``python -m minreal.app.cli ARGS`` in ``cwd`` with the fault hook set to ``fault`` (STAGE:SIGNAL)."""
    env = {**os.environ, FAULT_ENV: fault, "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("MINREAL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "minreal.app.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, preexec_fn=_default_sigint, check=False)


def leftovers(root: Path) -> list[str]:
    """Everything under ``root`` except the factory file."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != "net.py")


@pytest.mark.parametrize("stage", STAGES)
def test_sigterm_at_each_stage_exits_143_and_leaves_nothing(workdir: Path, stage: str) -> None:
    done = minreal(workdir, RUN, f"{stage}:SIGTERM")
    assert done.returncode == 143, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        "minreal: terminated (SIGTERM); partial output removed"]
    assert leftovers(workdir) == []  # no staging folder, no lock file, no runs/ folder the run created


@pytest.mark.parametrize("stage", ["compress", "benchmark"])
def test_sigint_at_a_stage_exits_1_and_leaves_nothing(workdir: Path, stage: str) -> None:
    done = minreal(workdir, RUN, f"{stage}:SIGINT")
    assert done.returncode == 1, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == ["minreal: aborted"]
    assert leftovers(workdir) == []


def test_sigterm_before_commit_keeps_the_old_run(workdir: Path) -> None:
    (workdir / "runs" / "a").mkdir(parents=True)
    (workdir / "runs" / "a" / "report.json").write_text(json.dumps(OLD_RUN))
    done = minreal(workdir, [*RUN, "--overwrite", "--no-int8"], "commit:SIGTERM")
    assert done.returncode == 143 and "Traceback" not in done.stderr
    assert leftovers(workdir) == ["runs", "runs/a", "runs/a/report.json"]
    assert json.loads((workdir / "runs" / "a" / "report.json").read_text()) == OLD_RUN


def test_fault_hook_is_inert_elsewhere(workdir: Path) -> None:
    done = minreal(workdir, [*RUN, "--no-int8"], "no_such_stage:SIGTERM")
    assert done.returncode == 0, done.stderr
    assert leftovers(workdir)[:2] == ["runs", "runs/a"] and (workdir / "runs" / "a" / "report.json").is_file()
    assert not [p for p in (workdir / "runs").iterdir() if p.name.startswith(".")]
