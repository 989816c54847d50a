"""How busy the machine was while it was timed: load averages, CPU steal time and the current CPU frequency."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

__all__ = ["MachineLoad", "cpu_counters", "machine_load", "compare_load", "describe_load"]


@dataclass(frozen=True)
class MachineLoad:
    """The machine's load around a measurement.

    Attributes
    ----------
    load_avg
        1-, 5- and 15-minute load averages (runnable processes), when the run ended.
    logical_cores
        Logical cores, to read the load averages against.
    steal_pct
        Share of CPU time stolen by the hypervisor during the run (``/proc/stat``'s steal column,
        between the run's start and end), percent; None where the kernel does not report it.
    cpu_mhz
        Current CPU frequency when the run ended, MHz; None where unreadable.
    """

    load_avg: tuple[float, float, float]
    logical_cores: int
    steal_pct: float | None
    cpu_mhz: float | None


def cpu_counters() -> tuple[float, float | None]:
    """(total CPU seconds, steal seconds or None) since boot, summed over CPUs (``/proc/stat`` through psutil)."""
    times = psutil.cpu_times()
    return float(sum(times)), getattr(times, "steal", None)


def machine_load(since: tuple[float, float | None] | None = None) -> MachineLoad:
    """The load now; ``since`` (a :func:`cpu_counters` reading at the run's start) gives the steal share over the
    run, else over the time since boot."""
    total, steal = cpu_counters()
    start_total, start_steal = since if since is not None else (0.0, 0.0 if steal is not None else None)
    share = None
    if steal is not None and start_steal is not None and total > start_total:
        share = 100.0 * (steal - start_steal) / (total - start_total)
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError):  # no cpufreq on this platform
        freq = None
    mhz = float(freq.current) if freq is not None and freq.current else None
    return MachineLoad(tuple(float(v) for v in os.getloadavg()), psutil.cpu_count(logical=True) or 1, share, mhz)


def compare_load(baseline: dict | None, report: dict | None) -> str:
    """One line comparing two reports' recorded machine load (``environment.machine_load``), saying which ran on the
    busier machine; ``""`` when either lacks it."""
    if not baseline or not report:
        return ""
    parts = [f"{label} {describe_load(d)}" for label, d in (("baseline", baseline), ("report", report))]
    before, now = baseline["load_avg"][0], report["load_avg"][0]
    cores = max(report.get("logical_cores") or 1, 1)
    busier = ""
    if abs(now - before) >= 0.5 * cores:
        busier = (f"; the {'report' if now > before else 'baseline'} ran on the busier machine, so the latency "
                  "comparison carries that load")
    return "machine load: " + "; ".join(parts) + busier


def describe_load(d: dict) -> str:
    """``load 1/5/15 on N cores, steal S%, F MHz`` for a :class:`MachineLoad` as a dict."""
    steal = "steal n/a" if d.get("steal_pct") is None else f"steal {d['steal_pct']:.2g}%"
    mhz = "" if d.get("cpu_mhz") is None else f", {d['cpu_mhz']:.0f} MHz"
    one, five, fifteen = d["load_avg"]
    return f"load {one:.2f}/{five:.2f}/{fifteen:.2f} on {d.get('logical_cores')} cores, {steal}{mhz}"
