"""Shared output of the benchmark scripts: JSON documents, figures rendered off-screen (Agg backend), the machine's
CPU shares over a run (how much of it a virtual machine's host took back), and a command's own peak resident memory
(:func:`run_measured`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from matplotlib.figure import Figure

from minreal.runtime_bench import atomic_write_text

_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

__all__ = ["Measured", "child_env", "cpu_share", "cpu_times", "process_ratios", "pyplot", "run_measured",
           "save_figure", "stop_without_shared_data", "write_json"]

_LAUNCHER = """\
import os, sys
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""
"""Starts the command (``argv[2:]``) and writes its exit code and peak resident memory (``wait4``'s ``ru_maxrss``: the
command's, and that of the processes it waited for) to ``argv[1]``; run as ``python -I -S``, it imports nothing
beyond the interpreter's built-in modules."""


def child_env(first: str | Path, **extra: str) -> dict[str, str]:
    """This process's environment for a child that must import minreal from the tree ``first``: ``first`` goes
    before the ``PYTHONPATH`` already set (packages a user put there, such as timm or transformers, stay
    importable), and ``extra`` variables are set on top."""
    path = [str(first), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def process_ratios(model: Sequence[float], reference: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """Per-process latency ratios of ``model`` to ``reference`` (their p50s, process by process): median, min, max
    and each, rounded to ``digits``."""
    from minreal.runtime_bench.timing import ratio_summary

    s = ratio_summary(list(model), list(reference))
    return {"median": round(s.median, digits), "min": round(s.min, digits), "max": round(s.max, digits),
            "per_process": [round(r, digits) for r in s.per_process]}


def write_json(path: str | Path, document: Any, indent: int = 1) -> None:
    """Write ``document`` to ``path`` as indented JSON, atomically."""
    atomic_write_text(Path(path), json.dumps(document, indent=indent))


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the off-screen Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> None:
    """Lay ``fig`` out tightly and save it to ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)


def cpu_times(stat: str | Path = "/proc/stat") -> dict[str, int] | None:
    """The machine's cumulative CPU time per state (clock ticks, all CPUs) from the first line of ``stat``; None
    where there is no such file (not Linux)."""
    try:
        first = Path(stat).read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[:1] != ["cpu"]:
        return None
    values = [int(v) for v in first[1:1 + len(_STAT_FIELDS)]]
    return dict(zip(_STAT_FIELDS, values + [0] * (len(_STAT_FIELDS) - len(values))))


def cpu_share(start: dict[str, int] | None, end: dict[str, int] | None) -> dict[str, float] | None:
    """Shares of the CPU time between two :func:`cpu_times`: ``busy`` (user, nice, system, irq, softirq), ``idle``
    (idle, iowait) and ``steal`` (time the hypervisor gave another guest while this one wanted to run: a run with
    steal saw a slower machine than its CPU model says). None when either is missing or no time passed."""
    if start is None or end is None:
        return None
    d = {k: end[k] - start[k] for k in _STAT_FIELDS}
    total = sum(d.values())
    if total <= 0:
        return None
    busy = d["user"] + d["nice"] + d["system"] + d["irq"] + d["softirq"]
    return {"busy": round(busy / total, 3), "idle": round((d["idle"] + d["iowait"]) / total, 3),
            "steal": round(d["steal"] / total, 3)}


def stop_without_shared_data(script: str, models: Mapping[str, Any], only: Sequence[str], shared: Path) -> None:
    """One line and exit status 2 when a selected model needs a file of ``shared`` (``../shared/data``) that is
    absent (a user's clone); each of ``models`` lists the files it needs in ``.needs``."""
    missing = sorted({p for name in only for p in models[name].needs if not p.is_file()})
    if missing:
        print(f"{script}: {missing[0]} is missing ({shared} is absent or incomplete, as in a user's clone); nothing "
              f"measured; --only {','.join(n for n, m in models.items() if not m.needs)} needs none of it",
              file=sys.stderr)
        sys.exit(2)


@dataclass(frozen=True)
class Measured:
    """A command run by :func:`run_measured`: its exit code (``-N`` for signal N), output, peak resident memory in MiB
    (None where it was killed before it ended) and whether it ran past its time limit."""

    returncode: int
    stdout: str
    stderr: str
    peak_mib: float | None
    timed_out: bool = False


def run_measured(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None) -> Measured:
    """Run ``argv`` and measure its own peak resident memory: the largest resident set of the command and of the
    processes it waited for (``wait4``).

    Linux keeps a process's peak resident memory across fork and exec, so a command started straight from a large
    process (a driver holding models, a test process) would report at least that process's size. The command is
    started instead by a small launcher (:data:`_LAUNCHER`, a Python that imports nothing) whose own size is all it
    inherits. On timeout, or when the caller is interrupted, the launcher's whole process group (the command and its
    children) is killed."""
    with tempfile.TemporaryDirectory(prefix="run-measured-") as tmp:
        report = Path(tmp) / "peak"
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _LAUNCHER, str(report), *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env=None if env is None else dict(env), cwd=cwd)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return Measured(-signal.SIGKILL, out, err, None, timed_out=True)
        except BaseException:  # an interrupted caller (Ctrl-C) leaves nothing running behind it
            _kill_group(proc)
            raise
        if not report.is_file():
            return Measured(proc.returncode, out, err, None)
        code, peak = (int(v) for v in report.read_text().split())
    kib = peak / 1024 if sys.platform == "darwin" else peak  # macOS reports bytes, Linux KiB
    return Measured(code, out, err, round(kib / 1024, 1))


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the process group that ``proc`` leads (:func:`run_measured` starts it in a session of its own)."""
    with contextlib.suppress(ProcessLookupError):  # the group ended meanwhile
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
