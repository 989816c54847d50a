"""The tool's own cost against the model's size (issue 44, item 3): from the model zoo's rows, per stage and method,
a power law fitted to the wall time and the peak memory against the parameter count; with ``--goals``, the issue's
two goals measured on their own.

**The fit.** For each stage of ``benchmarks/zoo.json`` that has its own time (``compress``, each of the method's phases
that a compress row keeps in ``phases_s`` as ``compress:<phase>``, ``export``, ``int8``, ``bench``, and the ``baseline``
build, export and INT8 of the original), for each method and each of ``wall_s`` and ``peak_rss_mib`` (the phases have no
memory of their own), the least-squares line log y = log a + b · log(params) over the rows whose stage passed (``ok``):
the exponent ``b`` with its standard error and 95 % interval (Student's t with n − 2 degrees of freedom), the residual
spread (the standard deviation of the log residuals, n − 2 in the denominator; a factor e^spread either way covers about
two thirds of the rows) and n. Rows from more than one machine (a run resumed on another CPU; each row names its
``machine``) share the exponent, each machine with its own prefactor (``prefactors``; n − G − 1 degrees of freedom for G
machines): a faster machine's rows would otherwise tilt the line. A fit whose interval lies wholly above
:data:`SUPERLINEAR` is flagged ``superlinear``: that stage's cost grows faster than the model. Fewer than
:data:`MIN_ROWS` rows, or rows whose parameter counts span less than a factor :data:`MIN_SPAN`, give no fit. The JSON
says which zoo.json it read (path, SHA-256, its commit, the commits of its rows, its load statement). A zoo run on a
shared machine gives outcomes, not costs: its times carry the load.

**The goals** (``--goals``): ``minreal compress <model> -m factorize --mac-ratio 0.7 --json`` on torchvision's
ResNet-50 (seeded random weights, the zoo's calibration set: :data:`zoo.CALIB` CIFAR-10 test images resized to
224 × 224) and on BERT-base (``hf:bert``, :mod:`minreal.app.hub`: ``transformers``' default BERT config with seeded
random weights, :data:`zoo.CALIB` sequences of :data:`zoo.SEQ` seeded random token ids), each :data:`RUNS` times in
fresh processes; each run's ``prepare`` (the report's ``timings_s["prepare"]``: the statistics and the
decompositions), whole process time, peak memory beside the size of the fp32 weights, the MAC ratio reached, the
median and min–max against the goal, and the load average and the machine's CPU shares over each run. ``--load``
states what else ran on the machine; ``--goal-models`` measures some of the models only (the others' earlier
figures stay, with the commit, start and load they were measured at).

**The memory goal** (issue 44: peak memory ≤ 3 × the fp32 model plus one batch of activations), stated per model
from one more fresh process (:func:`probe_memory`): its resident memory after the command line's imports
(:data:`PROBE_IMPORTS` and the model's library, before the model is loaded), 3 × the fp32 weights (4 bytes per
parameter), one batch of activations (the peak resident growth of one ``torch.no_grad()`` forward of the first
calibration batch, ``calib_batch_size`` samples, measured by resetting the process's high-water mark through
``/proc/self/clear_refs``: Linux only), their sum (the goal) against the runs' median peak, and whether it is within.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/zoo_cost.py --zoo benchmarks/zoo.json [--goals]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/zoo_cost.py --zoo benchmarks/zoo.json [--goals]"
STAGES = ("compress", "export", "int8", "bench")
METRICS = ("wall_s", "peak_rss_mib")
SUPERLINEAR = 1.1
"""An exponent whose 95 % interval lies wholly above this is flagged: the stage's cost grows faster than the model."""
MIN_ROWS = 3
"""Fewest rows a fit takes (two parameters, and one degree of freedom left for the spread)."""
MIN_SPAN = 4.0
"""Least ratio of the largest to the smallest parameter count a fit takes: over a narrower range (three DenseNets of
14 to 20 M parameters) a slope says more about the architectures than about size."""
RUNS = 3
GOALS_S = {"resnet50": 60.0, "bert_base": 120.0}
"""The issue's goals on 2 cores: factorize ``prepare`` seconds."""
PROBE_IMPORTS = ("minreal.app.cli", "minreal.app.commands.compress", "minreal.compress.methods.factorize.method")
"""What :func:`probe_memory` imports before it loads the model (with ``torchvision``, or ``transformers`` for an
``hf:`` model): the modules ``minreal compress -m factorize`` runs on (``python -X importtime`` of a compress run:
not ``minreal.app.pipeline``, which would add ``onnx``)."""
MEMORY_GOAL = "RSS after imports + 3 x the fp32 weights + one calibration batch's activations (no_grad forward)"

__all__ = ["PowerFit", "cost_points", "fit_all", "fit_power"]


@dataclass(frozen=True)
class PowerFit:
    """y ≈ ``prefactor`` · params^``exponent`` over ``n`` rows, with the exponent's standard error and 95 % interval,
    the residual spread of log y (natural log) and whether the interval lies above :data:`SUPERLINEAR`; a fit over
    groups (machines) has each one's prefactor in ``prefactors``."""

    exponent: float
    exponent_se: float
    exponent_ci95: tuple[float, float]
    prefactor: float
    residual_sd: float
    n: int
    superlinear: bool
    prefactors: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------- the fit
def fit_power(x: Sequence[float], y: Sequence[float], groups: Sequence[str] | None = None) -> PowerFit:
    """Least-squares fit of log y = log a + b log x (ordinary least squares on the logs; the exponent's standard
    error s / √Σ(log x − mean)², s² = Σ residual² / (n − 2), and its 95 % interval with Student's t).

    With ``groups`` (each row's machine), one exponent and one prefactor per group: log y = log a_g + b log x, the
    sums taken about each group's own means and n − G − 1 degrees of freedom for G groups. Rows of a slower machine
    then shift their own line instead of tilting the common one (a run resumed on another CPU holds both); one group
    is the plain fit. ``prefactor`` is the largest group's (the first named of equal ones), ``prefactors`` each's.

    Raises
    ------
    ValueError
        Fewer than :data:`MIN_ROWS` points (or than the groups plus two), a value that is not positive, or no group
        with two different x.
    """
    import numpy as np
    from scipy import stats

    lx, ly = np.log(np.asarray(x, dtype=np.float64)), np.log(np.asarray(y, dtype=np.float64))
    n = len(lx)
    labels = list(groups) if groups is not None else [""] * n
    if n < MIN_ROWS or n != len(ly) or n != len(labels):
        raise ValueError(f"a power fit needs at least {MIN_ROWS} (x, y) pairs, got {n}, {len(ly)} and "
                         f"{len(labels)} group labels")
    if not (np.isfinite(lx).all() and np.isfinite(ly).all()):
        raise ValueError("a power fit needs positive, finite x and y")
    names = list(dict.fromkeys(labels))
    if n < len(names) + 2:
        raise ValueError(f"a power fit over {len(names)} groups needs at least {len(names) + 2} pairs, got {n}")
    member = {g: np.array([lab == g for lab in labels]) for g in names}
    dx, dy = np.empty(n), np.empty(n)
    for m in member.values():  # a group of one size says nothing of the slope: exactly nothing, not rounding
        dx[m] = 0.0 if np.ptp(lx[m]) == 0 else lx[m] - lx[m].mean()
        dy[m] = ly[m] - ly[m].mean()
    sxx = float(dx @ dx)
    if sxx == 0.0:
        raise ValueError("a power fit needs at least two different x")
    b = float(dx @ dy) / sxx
    log_a = {g: float(ly[m].mean() - b * lx[m].mean()) for g, m in member.items()}
    resid = dy - b * dx
    dof = n - len(names) - 1
    s = math.sqrt(float(resid @ resid) / dof)
    se = s / math.sqrt(sxx)
    half = float(stats.t.ppf(0.975, dof)) * se
    largest = max(names, key=lambda g: (int(member[g].sum()), -names.index(g)))
    return PowerFit(b, se, (b - half, b + half), math.exp(log_a[largest]), s, n, b - half > SUPERLINEAR,
                    {g: math.exp(v) for g, v in log_a.items()} if groups is not None else {})


def _header_cpu(doc: dict[str, Any]) -> str:
    """The CPU the zoo JSON's header names (``"?"`` where none): the machine of rows that name none."""
    return str(((doc.get("header") or {}).get("machine") or {}).get("cpu") or "?")


def cost_points(doc: dict[str, Any]) -> dict[tuple[str, str, str], list[tuple[float, float, str]]]:
    """(stage, method, metric) → [(params, value, machine)] over the zoo rows whose stage passed (``ok``) and whose
    model's parameter count is known; the method's phases as ``compress:<phase>`` (wall time only) and the original's
    build, export and INT8 as stage ``baseline``, method ``original``. ``machine`` is the row's (or baseline's) CPU,
    or the header's where it names none (a JSON written before rows named theirs)."""
    params = {name: m.get("params") for name, m in doc.get("models", {}).items()}
    default = _header_cpu(doc)
    out: dict[tuple[str, str, str], list[tuple[float, float, str]]] = {}

    def add(stage: str, method: str, p: float | None, facts: dict[str, Any], machine: str) -> None:
        for metric in METRICS:
            value = facts.get(metric)
            if p and isinstance(value, (int, float)) and value > 0:
                out.setdefault((stage, method, metric), []).append((float(p), float(value), machine))

    for name, model in doc.get("models", {}).items():
        if model.get("outcome") == "ok":
            add("baseline", "original", params.get(name), model, model.get("machine") or default)
    for row in doc.get("rows", []):
        if row.get("method") is None:
            continue
        p, machine = params.get(row["model"]), row.get("machine") or default
        for stage in STAGES:
            facts = row["stages"].get(stage, {})
            if facts.get("outcome") == "ok":
                add(stage, row["method"], p, facts, machine)
        compress = row["stages"].get("compress", {})
        if compress.get("outcome") == "ok":
            for phase, seconds in (compress.get("phases_s") or {}).items():
                add(f"compress:{phase}", row["method"], p, {"wall_s": seconds}, machine)
    return out


def fit_all(points: dict[tuple[str, str, str], list[tuple[float, float, str]]]) -> list[dict[str, Any]]:
    """One record per (stage, method, metric) with at least :data:`MIN_ROWS` rows of machines whose own rows span a
    factor of :data:`MIN_SPAN` in parameters: the fit (one exponent, a prefactor per machine where the rows come from
    more than one: see :func:`fit_power`), the range of parameters it covers and the rows of the machines left out
    (``machines_left_out``). With a prefactor per machine the exponent rests on each machine's own spread: a machine
    whose rows span less (a run that moved machines near the end of its list) would only confound size with speed."""
    fits = []
    for (stage, method, metric), pts in sorted(points.items()):
        by: dict[str, list[tuple[float, float]]] = {}
        for p, v, m in pts:
            by.setdefault(m, []).append((p, v))
        wide = {m: g for m, g in by.items() if max(p for p, _ in g) >= MIN_SPAN * min(p for p, _ in g)}
        rows = [(p, v, m) for m, g in wide.items() for p, v in g]
        if len(rows) < MIN_ROWS or len(rows) < len(wide) + 2:
            continue
        xs, ys, machines = [p for p, _, _ in rows], [v for _, v, _ in rows], [m for _, _, m in rows]
        try:
            fit = fit_power(xs, ys, machines if len(wide) > 1 else None)
        except ValueError:  # no spread left to fit
            continue
        left = {m: len(g) for m, g in by.items() if m not in wide}
        fits.append({"stage": stage, "method": method, "metric": metric, **_rounded(asdict(fit)),
                     "params_range": [int(min(xs)), int(max(xs))], **({"machines_left_out": left} if left else {})})
    return fits


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    def r(v: Any) -> Any:
        if isinstance(v, float):
            return float(f"{v:.4g}")
        if isinstance(v, dict):
            return {k: r(u) for k, u in v.items()}
        return [r(u) for u in v] if isinstance(v, (list, tuple)) else v

    return {k: r(v) for k, v in d.items()}


def zoo_source(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Which zoo.json the fit read: its path, SHA-256, the run's commit and load, and the commits of its rows."""
    head = doc.get("header", {})
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    return {"path": str(shown), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "commit": head.get("commit"), "started": head.get("started"), "load": doc.get("load"),
            "load_at_start": head.get("load_at_start"), "machine": head.get("machine"),
            "row_commits": sorted({r.get("commit", "?") for r in doc.get("rows", []) if r.get("method")}),
            "row_machines": dict(Counter(r.get("machine") or _header_cpu(doc) for r in doc.get("rows", [])
                                         if r.get("method"))),
            "rows": sum(1 for r in doc.get("rows", []) if r.get("method")), "models": len(doc.get("models", {}))}


# -------------------------------------------------------------------------------------------------------- the plot
def plot(points: dict[tuple[str, str, str], list[tuple[float, float, str]]], fits: Iterable[dict[str, Any]],
         path: Path) -> None:
    """Log-log panels, time then memory: each stage and method's rows and fitted line (phases left out)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    keyed = {(f["stage"], f["method"], f["metric"]): f for f in fits}
    series = sorted({(s, m) for s, m, _ in points if ":" not in s})
    colours = {key: plt.cm.tab20(i % 20) for i, key in enumerate(series)}
    for ax, metric, label in zip(axes, METRICS, ("wall time (s)", "peak resident memory (MiB)")):
        for stage, method in series:
            pts = points.get((stage, method, metric))
            if not pts:
                continue
            fit = keyed.get((stage, method, metric))
            name = f"{stage}/{method}" + (f": b={fit['exponent']:.2f}±{fit['exponent_se']:.2f}" if fit else "")
            xs, ys, _ = zip(*pts)
            ax.scatter(xs, ys, s=12, color=colours[(stage, method)], label=name)
            if fit:
                lo, hi = fit["params_range"]
                ax.plot([lo, hi], [fit["prefactor"] * lo ** fit["exponent"], fit["prefactor"] * hi ** fit["exponent"]],
                        color=colours[(stage, method)], lw=1)
        ax.set(xscale="log", yscale="log", xlabel="parameters", ylabel=label, title=f"{label} against model size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    save_figure(fig, path)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------- the goals
def goal_specs(work: Path, models: Sequence[str] = tuple(GOALS_S)) -> dict[str, dict[str, Any]]:
    """The goal models of ``models`` as ``minreal compress`` takes them: spec, weights (or none), calibration
    file."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import zoo

    work.mkdir(parents=True, exist_ok=True)
    specs = {}
    if "resnet50" in models:
        weights = work / "resnet50.pt"
        if not weights.is_file():
            torch.save(zoo._seeded("resnet50").state_dict(), weights)
        images = zoo._calib_file(work, zoo.Model("resnet50", "classification", (3, 224, 224)))
        specs["resnet50"] = {"model": "resnet50", "weights": str(weights), "data": str(images), "calib": zoo.CALIB}
    if "bert_base" in models:
        tokens = zoo._calib_file(work, zoo._hf_model("bert"))
        specs["bert_base"] = {"model": "hf:bert", "weights": None, "data": str(tokens), "calib": zoo.CALIB,
                              "seq": zoo.SEQ}
    return specs


def goal_run(spec: dict[str, Any], out: Path, timeout: float) -> dict[str, Any]:
    """One fresh ``minreal compress -m factorize --mac-ratio 0.7 --json`` process: its ``prepare`` and ``realise``
    seconds from the report, its whole time, peak memory, load average and the machine's CPU shares."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import cpu_share, cpu_times, run_measured

    argv = [sys.executable, "-m", "minreal", "compress", spec["model"], "--data", spec["data"], "-m", "factorize",
            "--mac-ratio", "0.7", "--out", str(out), "--json", "--quiet"]
    if spec["weights"]:
        argv += ["--weights", spec["weights"]]
    before, t0 = cpu_times(), time.perf_counter()
    done = run_measured(argv, timeout, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}, cwd=ROOT)
    wall = time.perf_counter() - t0
    facts = {"process_s": round(wall, 2), "peak_rss_mib": done.peak_mib,
             "loadavg": [round(v, 2) for v in os.getloadavg()], "cpu_share": cpu_share(before, cpu_times())}
    if done.returncode != 0:
        tail = [ln for ln in done.stderr.splitlines() if ln.strip()][-1:]
        return {**facts, "error": f"exit status {done.returncode}" + "".join(f": {t}" for t in tail)}
    report = json.loads(done.stdout)
    timings = report.get("timings_s", {})
    params = report.get("params_before") or 0
    return {**facts, "prepare_s": round(timings["prepare"], 2), "realise_s": round(timings.get("realise", 0.0), 2),
            "phases_s": {k: round(v, 3) for k, v in timings.items()},
            "mac_ratio_reached": round(report["macs_after"] / report["macs_before"], 4) if report.get("macs_before")
            else None, "params": params, "fp32_weights_mib": round(params * 4 / 2**20, 1)}


def _status_mib(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field} (the memory probe needs Linux)")


def probe_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """In this (fresh) process: resident memory after :data:`PROBE_IMPORTS`, the fp32 weights, and the peak resident
    growth of one ``torch.no_grad()`` forward of the first calibration batch (the high-water mark reset through
    ``/proc/self/clear_refs`` just before it)."""
    import importlib

    import torch

    for module in (*PROBE_IMPORTS, "transformers" if spec["model"].startswith("hf:") else "torchvision"):
        importlib.import_module(module)
    from minreal.app.data import load_data
    from minreal.app.models import load_model
    from minreal.compress.core.inputs import call
    from minreal.compress.methods.factorize.config import FactorizeConfig

    imports = _status_mib("VmRSS")
    model = load_model(spec["model"], spec["weights"])
    batch_size = FactorizeConfig().calib_batch_size
    batch = next(iter(load_data(spec["data"]).calib.inputs(batch_size)))
    params = sum(p.numel() for p in model.parameters())
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts at the current resident size
    before = _status_mib("VmRSS")
    with torch.no_grad():
        call(model, batch)
    return {"rss_after_imports_mib": round(imports, 1), "fp32_weights_mib": round(params * 4 / 2**20, 1),
            "one_batch_activations_mib": round(_status_mib("VmHWM") - before, 1), "batch": batch_size}


def memory_run(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """:func:`probe_memory` in a fresh process (this script with ``--probe-memory``); its own peak beside."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import run_measured

    argv = [sys.executable, str(Path(__file__).resolve()), "--probe-memory", json.dumps(spec)]
    done = run_measured(argv, timeout, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}, cwd=ROOT)
    if done.returncode != 0:
        tail = [ln for ln in done.stderr.splitlines() if ln.strip()][-1:]
        return {"error": f"exit status {done.returncode}" + "".join(f": {t}" for t in tail)}
    return {**json.loads(done.stdout), "probe_peak_rss_mib": done.peak_mib}


def memory_goal(probe: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The memory goal (:data:`MEMORY_GOAL`) from the probe against the runs' median peak resident memory."""
    peaks = [r["peak_rss_mib"] for r in runs if "prepare_s" in r and r.get("peak_rss_mib")]
    if "error" in probe or not peaks:
        return {"goal": MEMORY_GOAL, **probe, "within": None}
    three = 3 * probe["fp32_weights_mib"]
    goal = probe["rss_after_imports_mib"] + three + probe["one_batch_activations_mib"]
    med = statistics.median(peaks)
    return {"goal": MEMORY_GOAL, **probe, "three_fp32_weights_mib": round(three, 1), "goal_mib": round(goal, 1),
            "peak_median_mib": med, "peak_min_max_mib": [min(peaks), max(peaks)], "within": med <= goal}


def summarise(runs: list[dict[str, Any]], goal: float) -> dict[str, Any]:
    """Median and min–max of the runs' ``prepare`` seconds against ``goal``."""
    s = [r["prepare_s"] for r in runs if "prepare_s" in r]
    if not s:
        return {"goal_s": goal, "met": None, "runs_ok": 0}
    med = statistics.median(s)
    return {"goal_s": goal, "prepare_median_s": med, "prepare_min_max_s": [min(s), max(s)], "runs_ok": len(s),
            "met": med <= goal}


def measure_goals(work: Path, timeout: float, load: str | None, models: Sequence[str] = tuple(GOALS_S),
                  kept: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each goal model of ``models`` :data:`RUNS` times, alternated (ResNet-50, BERT, ResNet-50, …) so that both
    see the same machine, after one memory probe each (:func:`memory_run`); the load stated and measured. The other
    models of ``kept`` (an earlier ``goals``) stay, each with the commit, start and load it was measured at."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    specs = goal_specs(work, models)
    probes = {name: memory_run(spec, timeout) for name, spec in specs.items()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in specs}
    for i in range(RUNS):
        for name, spec in specs.items():
            runs[name].append(goal_run(spec, work / f"{name}.pt2", timeout))
            print(f"zoo_cost: {name} run {i + 1}: {runs[name][-1]}", file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    measured = {"commit": commit, "started": started, "load": load or "not stated"}
    out = {name: {**{k: v for k, v in specs[name].items() if k not in ("weights", "data")},
                  **summarise(runs[name], GOALS_S[name]), "memory": memory_goal(probes[name], runs[name]),
                  "measured": measured, "each": runs[name]} for name in specs}
    earlier = {k: (kept or {}).get(k) for k in ("commit", "started", "load")}
    for name, entry in ((kept or {}).get("models") or {}).items():
        if name not in out:
            out[name] = {**entry, "measured": entry.get("measured") or earlier}
    return {**measured, "cpus": os.cpu_count(), "runs": RUNS,
            "command": "minreal compress MODEL -m factorize --mac-ratio 0.7 --json (fresh process each run)",
            "memory_goal": MEMORY_GOAL, "models": {name: out[name] for name in GOALS_S if name in out}}


# -------------------------------------------------------------------------------------------------------- main
def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", type=Path, default=ROOT / "benchmarks" / "zoo.json", help="the zoo run to fit")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "zoo_cost.json")
    ap.add_argument("--png", type=Path, default=ROOT / "benchmarks" / "zoo_cost.png")
    ap.add_argument("--goals", action="store_true", help="also measure the issue's two prepare goals (minutes)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-zoo-cost")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one goal run may take")
    ap.add_argument("--load", default=None, help="what else ran on the machine during --goals (recorded)")
    ap.add_argument("--goal-models", nargs="+", choices=tuple(GOALS_S), default=list(GOALS_S),
                    help="the goal models --goals measures (the others' earlier figures stay); default both")
    ap.add_argument("--probe-memory", metavar="SPEC_JSON", default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.probe_memory is not None:  # the fresh process of memory_run
        print(json.dumps(probe_memory(json.loads(args.probe_memory))))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import write_json

    doc = json.loads(args.zoo.read_text())
    points = cost_points(doc)
    fits = fit_all(points)
    out: dict[str, Any] = {"usage": USAGE, "issue": 44, "zoo": zoo_source(args.zoo, doc),
                           "superlinear_above": SUPERLINEAR, "fits": fits,
                           "superlinear": [f"{f['stage']}/{f['method']}/{f['metric']}" for f in fits
                                           if f["superlinear"]]}
    kept = json.loads(args.out.read_text()).get("goals") if args.out.is_file() else None
    if kept:  # goals measured earlier stay unless measured again
        out["goals"] = kept
    if args.goals:
        out["goals"] = measure_goals(args.work, args.timeout, args.load, args.goal_models, kept)
    write_json(args.out, out)
    plot(points, fits, args.png)
    print(f"zoo_cost: {len(fits)} fit(s), {len(out['superlinear'])} superlinear; {args.out}, {args.png}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
