"""benchmarks/recovery_real.py without running it (it takes hours and needs ../shared/data): its plan lists every
cell, and its smoke mode refuses to overwrite the real document."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "recovery_real.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})


def test_plan_lists_each_method_and_the_recovered_original_at_every_budget(tmp_path: Path) -> None:
    done = _run("--plan", "--out", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stderr
    cells = [line.split() for line in done.stdout.splitlines() if line.startswith("  ")]
    # 2 models x (the original + 6 methods x 2 ratios) x 5 budgets
    assert len(cells) == 2 * (1 + 6 * 2) * 5 == 130
    assert {c[1] for c in cells} == {f"{m}@{r}" for m in ("svd", "factorize", "magnitude", "wanda", "fde",
                                                           "cbalanced") for r in ("0.7", "0.5")} | {"original@1"}
    assert {c[2] for c in cells} == {"0", "1", "3", "5", "10"}
    assert not (tmp_path / "r.json").exists()


def test_quick_needs_its_own_out() -> None:
    done = _run("--quick")
    assert done.returncode == 2 and "--quick needs its own --out" in done.stderr
