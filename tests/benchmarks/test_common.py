"""benchmarks/_common.py's CPU shares: the busy, idle and steal shares between two readings of /proc/stat, checked
by hand on written files (the shares of a real machine are whatever it did); and a command's own peak resident
memory, read through a small launcher (run_measured); and a child's environment (child_env)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _common import child_env, cpu_share, cpu_times, run_measured


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


def _python(code: str) -> list[str]:
    """A bare interpreter (no site, no environment) running ``code``: a few MiB before ``code`` allocates."""
    return [sys.executable, "-I", "-S", "-c", code]


def test_peak_is_the_commands_own_not_its_callers() -> None:
    """A command that writes 128 MiB, started while this process holds 512 MiB more: its peak is its 128 MiB plus a
    bare interpreter, far below this process's, which Linux hands down to a child started straight from here."""
    held = b"\x01" * (512 << 20)  # written, so resident, while the command runs
    done = run_measured(_python("b = b'\\x01' * (128 << 20)"), timeout=120)
    assert len(held) == 512 << 20
    assert done.returncode == 0 and not done.timed_out, done.stderr
    assert done.peak_mib is not None and 128 <= done.peak_mib <= 128 + 32, done.peak_mib


def test_exit_code_output_and_a_signal_come_back() -> None:
    done = run_measured(_python("import sys; print('out'); sys.stderr.write('err'); sys.exit(3)"), timeout=120)
    assert (done.returncode, done.stdout, done.stderr, done.timed_out) == (3, "out\n", "err", False)
    assert done.peak_mib is not None and done.peak_mib < 64
    killed = run_measured(_python("import os, signal; os.kill(os.getpid(), signal.SIGTERM)"), timeout=120)
    assert killed.returncode == -signal.SIGTERM


def test_timeout_kills_the_command_and_its_children(tmp_path: Path, process_gone: Callable[[int], bool]) -> None:
    """The command starts a child that would outlive it; both are killed with the launcher's process group."""
    pid_file = tmp_path / "pid"
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "time.sleep(300)\n")
    done = run_measured(_python(code), timeout=10)
    assert done.timed_out and done.returncode == -signal.SIGKILL and done.peak_mib is None
    assert process_gone(int(pid_file.read_text()))


def test_a_childs_path_puts_the_tree_first_and_keeps_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """The zoo once replaced PYTHONPATH with the tree alone: a timm or transformers the user had put on PYTHONPATH
    was importable in the driver (which listed the rows) but not in the stages (which refused them)."""
    monkeypatch.setenv("PYTHONPATH", f"/site/a{os.pathsep}{os.pathsep}/site/b")
    env = child_env(Path("/tree"), OMP_WAIT_POLICY="PASSIVE")
    assert env["PYTHONPATH"].split(os.pathsep) == ["/tree", "/site/a", "/site/b"]
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["HOME"] == os.environ["HOME"]
    monkeypatch.delenv("PYTHONPATH")
    assert child_env("/tree")["PYTHONPATH"] == "/tree"


def test_a_child_imports_a_package_only_the_users_path_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "only_here.py").write_text("VALUE = 7\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    done = subprocess.run([sys.executable, "-c", "import only_here; print(only_here.VALUE)"],
                          env=child_env(tmp_path / "tree"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "7"
