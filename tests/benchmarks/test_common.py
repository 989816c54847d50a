"""benchmarks/_common.py's CPU shares: the busy, idle and steal shares between two readings of /proc/stat, checked
by hand on written files (the shares of a real machine are whatever it did)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _common import cpu_share, cpu_times


def _stat(tmp_path: Path, name: str, line: str) -> Path:
    path = tmp_path / name
    path.write_text(f"{line}\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2 3\n")
    return path


def test_shares_between_two_readings_add_up_and_name_the_steal(tmp_path: Path) -> None:
    # fields: user nice system idle iowait irq softirq steal guest guest_nice (guest time is inside user)
    start = cpu_times(_stat(tmp_path, "a", "cpu  100 0 20 300 10 0 5 40 7 0"))
    end = cpu_times(_stat(tmp_path, "b", "cpu  160 0 30 330 10 0 5 100 9 0"))
    assert start == {"user": 100, "nice": 0, "system": 20, "idle": 300, "iowait": 10, "irq": 0, "softirq": 5,
                     "steal": 40}
    share = cpu_share(start, end)  # deltas: busy 60 + 10, idle 30, steal 60: of 160
    assert share == {"busy": round(70 / 160, 3), "idle": round(30 / 160, 3), "steal": round(60 / 160, 3)}
    assert sum(share.values()) == pytest.approx(1, abs=2e-3)


def test_missing_or_foreign_files_and_no_elapsed_time_give_none(tmp_path: Path) -> None:
    assert cpu_times(tmp_path / "absent") is None
    assert cpu_times(_stat(tmp_path, "c", "intr 1 2 3")) is None
    short = cpu_times(_stat(tmp_path, "d", "cpu  1 2 3 4"))  # an old kernel: no iowait, irq, softirq, steal
    assert short == {"user": 1, "nice": 2, "system": 3, "idle": 4, "iowait": 0, "irq": 0, "softirq": 0, "steal": 0}
    assert cpu_share(short, short) is None and cpu_share(None, short) is None and cpu_share(short, None) is None
