"""The tool's own cost at the command line (issue 27): `minreal --help`, `minreal methods`, an option error, and
`minreal compress -m factorize` on the digits ResNet-20 with 1,024 images, each in fresh processes, for the code
before issue 27 (``--before``, a commit checked out into a temporary worktree) and the working tree, alternated run
by run so both see the same machine.

Every run is a new Python process timed from its start to its exit (imports included, as a user waits). The
compress runs use the cached trained ResNet-20 (``benchmarks/cache/resnet20_cifar_digits32.pt``, see
``trained_models.py``) and the first 1,024 ``digits32`` calibration images written once to an ``.npz`` in the work
folder; both trees read the same files. The JSON gives, per command and tree, every run's seconds, the median and the
spread, the ratio of the medians (after / before), and for compress each run's phases from its report (``timings_s``:
prepare, i.e. the statistics, and realise; the rest of a run is imports, loading, the held-out measurement and
saving).

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/tool_cost.py --out benchmarks/tool_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/tool_cost.py --out benchmarks/tool_cost.json"
BEFORE = "1f9aafe"
"""The last commit before issue 27's work began."""
CALIB_IMAGES = 1024
GOALS_S = {"help": 1.0, "compress_factorize": 15.0}


def _say(line: str) -> None:
    print(f"[tool_cost] {line}", file=sys.stderr, flush=True)


def _calib(work: Path) -> Path:
    """The first 1,024 digits32 calibration images with labels, as an .npz (written once)."""
    import numpy as np

    from minreal.compress.datasets import digits32

    path = work / "digits32_1024.npz"
    if not path.is_file():
        train, _ = digits32()
        work.mkdir(parents=True, exist_ok=True)
        np.savez(path, x=train.x[:CALIB_IMAGES].numpy(), y=train.y[:CALIB_IMAGES].numpy())
    return path


def commands(work: Path) -> dict[str, list[str]]:
    """The command lines timed (arguments after ``minreal``)."""
    from trained_models import cache_paths

    weights = cache_paths()[0]
    if not weights.is_file():
        raise SystemExit(f"tool_cost: {weights} is missing: run benchmarks/trained_models.py first")
    return {"help": ["--help"], "methods": ["methods"], "option_error": ["tune", "x", "--data", "y", "--grid", "a"],
            "compress_factorize": ["compress", "resnet20_cifar", "--weights", str(weights), "-m", "factorize",
                                   "--data", str(_calib(work)), "--mac-ratio", "0.5", "--out", "{out}",
                                   "--report", "{out}.json", "-q"]}


def _spelled_for(tree_name: str, args: list[str]) -> list[str]:
    """``args`` as that tree's command line spells them: the code before the change (the default ``--before``)
    took compress's data as ``--calib``, since renamed ``--data`` as in every other command."""
    if tree_name != "before" or args[:1] != ["compress"]:
        return args
    return ["--calib" if a == "--data" else a for a in args]


def _run(tree: Path, args: list[str], out: Path) -> tuple[float, int, dict[str, float]]:
    """Seconds from process start to exit of ``minreal ARGS`` with ``tree`` first on the path, the exit code, and
    the phases' seconds of a compress report (``timings_s``; empty for other commands)."""
    from _common import child_env

    env = child_env(tree, OMP_WAIT_POLICY="PASSIVE")
    entry = "import sys; import minreal.app.cli as c; sys.argv[0] = 'minreal'; getattr(c, 'console', c.main)()"
    argv = [sys.executable, "-c", entry,  # the console script: console() where the tree has it (after), else main()
            *[a.replace("{out}", str(out)) for a in args]]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    report = Path(f"{out}.json")
    phases = json.loads(report.read_text()).get("timings_s", {}) if report.is_file() else {}
    for path in (out, report):
        path.unlink(missing_ok=True)
    return seconds, done.returncode, {k: round(v, 3) for k, v in phases.items()}


def main() -> None:
    from _common import cpu_share, cpu_times, write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/tool_cost.json"))
    ap.add_argument("--before", default=BEFORE, help="commit of the code before the change")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-tool-cost")
    args = ap.parse_args()
    cmds = commands(args.work)
    old = Path(tempfile.mkdtemp(prefix="minreal-before-"))
    subprocess.run(["git", "worktree", "add", "--detach", "-f", str(old), args.before], cwd=ROOT, check=True,
                   capture_output=True)
    trees = {"before": old, "after": ROOT}
    runs: dict[str, dict[str, list[float]]] = {name: {t: [] for t in trees} for name in cmds}
    codes: dict[str, dict[str, int]] = {name: {} for name in cmds}
    timings: dict[str, dict[str, list[dict[str, float]]]] = {name: {t: [] for t in trees} for name in cmds}
    shares: dict[str, dict[str, list[dict[str, float] | None]]] = {name: {t: [] for t in trees} for name in cmds}
    try:
        for name, argv in cmds.items():
            repeats = max(3, args.repeats // 2) if name == "compress_factorize" else args.repeats
            for i in range(repeats):
                for tree_name, tree in (trees.items() if i % 2 == 0 else reversed(trees.items())):
                    before_run = cpu_times()
                    seconds, code, phases = _run(tree, _spelled_for(tree_name, argv),
                                                 args.work / f"out-{tree_name}.pt2")
                    shares[name][tree_name].append(cpu_share(before_run, cpu_times()))
                    runs[name][tree_name].append(round(seconds, 3))
                    if phases:
                        timings[name][tree_name].append(phases)
                    codes[name][tree_name] = code
                    _say(f"{name} {tree_name} run {i + 1}/{repeats}: {seconds:.2f} s (exit {code})")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
        shutil.rmtree(old, ignore_errors=True)
    results: dict[str, Any] = {}
    for name, per in runs.items():
        med = {t: statistics.median(v) for t, v in per.items()}
        results[name] = {"argv": cmds[name], "seconds": per, "median_s": med,
                         "spread_s": {t: [min(v), max(v)] for t, v in per.items()},
                         "exit_codes": codes[name], "after_over_before": round(med["after"] / med["before"], 3),
                         "goal_s": GOALS_S.get(name),
                         "within_goal": None if name not in GOALS_S else med["after"] <= GOALS_S[name],
                         "cpu_share": shares[name],
                         **({"report_timings_s": timings[name]} if any(timings[name].values()) else {})}
    write_json(args.out, {"usage": USAGE, "issue": 27, "before": args.before,
                          "head": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                                 text=True).stdout.strip(),
                          "cpus": os.cpu_count(), "loadavg_end": list(os.getloadavg()),
                          "method": "fresh process per run, alternated before/after, seconds from start to exit; "
                                    "cpu_share per run: the machine's busy/idle/steal shares while it ran (steal: "
                                    "a virtual machine's host took the CPU back)",
                          "results": results})
    _say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
