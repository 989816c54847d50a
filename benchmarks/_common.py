"""Shared output of the benchmark scripts: JSON documents, figures rendered off-screen (Agg backend), and the
machine's CPU shares over a run (how much of it a virtual machine's host took back)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from matplotlib.figure import Figure

from minreal.runtime_bench import atomic_write_text

_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

__all__ = ["cpu_share", "cpu_times", "pyplot", "save_figure", "write_json"]


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
