"""How the width allocator compares channel importance across groups (the default of ``--importance-weighting``).

The width methods (magnitude, wanda) score every channel of each channel group, divide the scores by their group's
mean, and let a greedy allocator narrow, step by step, the segment that loses the least importance per cost saved.
With ``--importance-weighting none`` a channel's relative importance is compared with the cost it saves, so the
channels that feed the most layers (an option-A ResNet's residual stream) are the cheapest to cut whatever they
carry; ``cost`` (each segment's relative scores times its cost per channel at full width) makes a move's rate the
mean relative importance of the channels it drops, wherever they are.

This benchmark measures both on the pretrained CIFAR-10 ResNet-32 (and ResNet-44 with ``--only``) of
``../shared/data``, loaded as ``benchmarks/recovery_real.py`` loads them (the first 7,000 real CIFAR-10 images
calibrate and recover, the last 2,000 are held out): magnitude and wanda each prepared once, realised at MAC ratios
0.9/0.7/0.5 with each weighting, held-out top-1 zero-shot and after the same short recovery
(``--epochs``, default 1: ``minreal.compress.core.recover.recover`` with its defaults and seed 0, a fresh copy per
cell), the MAC ratio reached and the residual-stream widths (the option-A group's segments: 16, 16 and 32 channels).
Without ``../shared/data`` it prints one line and exits with status 2. The JSON is rewritten atomically after every
cell; ``--resume`` skips cells it holds. Progress: one line per cell on stderr with the seconds elapsed. Run it alone.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/width_allocation.py --out benchmarks/width_allocation.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import recovery_real as rr
from _common import cpu_share, cpu_times, write_json

from minreal.compress.core.errors import CompressionError
from minreal.compress.core.width.allocate import WEIGHTINGS

USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/width_allocation.py --out benchmarks/width_allocation.json"
METHODS = ("magnitude", "wanda")
RATIOS = (0.9, 0.7, 0.5)


def _streams(report: Any) -> dict[str, Any]:
    """The segment widths ([full, kept] per segment) of every group of several segments (the option-A streams)."""
    return report.predicted.get("segment_widths", {})


def cell(case: rr.Case, prepared: Any, method: str, ratio: float, weighting: str, epochs: tuple[int, ...],
         seed: int) -> dict[str, Any]:
    from minreal.compress.registry import get_method, realise

    cfg = get_method(method).config_cls(mac_ratio=ratio, importance_weighting=weighting)
    row: dict[str, Any] = {"model": case.name, "method": method, "mac_ratio": ratio, "weighting": weighting}
    t0 = time.perf_counter()
    try:
        new, report = realise(prepared, cfg, measure=False)
    except CompressionError as exc:
        return {**row, "refused": str(exc).splitlines()[0]}
    row.update(realise_s=round(time.perf_counter() - t0, 2), mac_ratio_reached=report.mac_ratio,
               streams=_streams(report), group_widths=report.predicted.get("group_widths"))
    row["budgets"] = {str(e): rr.recovered(case, new.eval(), e, seed) for e in epochs}
    return row


def summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model, method and ratio: held-out top-1 (%) of each weighting after each recovery budget."""
    out: dict[str, Any] = {}
    for c in cells:
        if "refused" in c:
            continue
        at = out.setdefault(c["model"], {}).setdefault(c["method"], {}).setdefault(str(c["mac_ratio"]), {})
        at[c["weighting"]] = {e: round(100 * b["test"]["accuracy"], 2) for e, b in c["budgets"].items()}
        at[c["weighting"]]["mac_ratio_reached"] = round(c["mac_ratio_reached"], 4)
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="resnet32", help="comma-separated, from resnet32, resnet44 (default resnet32)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--ratios", default=",".join(map(str, RATIOS)))
    ap.add_argument("--epochs", default="0,1", help="recovery budgets per cell, 0 = zero-shot (default 0,1)")
    ap.add_argument("--work", type=Path, default=Path("runs/bench-recovery-real"),
                    help="weights and data splits (shared with recovery_real.py; ignored by git)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    args.only = tuple(args.only.split(","))
    args.methods = tuple(args.methods.split(","))
    args.ratios = tuple(float(r) for r in args.ratios.split(","))
    args.epochs = tuple(int(e) for e in args.epochs.split(","))
    return args


def main() -> None:
    from minreal.compress.registry import get_method, prepare

    args = parse()
    missing = rr.missing_data(args.only)
    if missing is not None:
        print(f"width_allocation: {missing} is missing (../shared/data is absent or incomplete, as in a user's "
              "clone); nothing measured", file=sys.stderr)
        sys.exit(2)
    t0, cpu0 = time.perf_counter(), cpu_times()

    def say(line: str) -> None:
        print(f"[width_allocation {time.perf_counter() - t0:6.0f}s] {line}", file=sys.stderr, flush=True)

    doc = json.loads(args.out.read_text()) if args.resume and args.out.is_file() else {
        "usage": USAGE, "header": rr.header(), "seed": args.seed, "cells": [], "models": {}, "runs": [],
        "setting": {"weightings": list(WEIGHTINGS), "recovery": "minreal.compress.core.recover.recover, "
                    "RecoveryConfig(epochs=E, seed) defaults, a fresh copy of the realised model per budget",
                    "metric": "top-1 on the last 2,000 images (never seen by a method or a recovery)"}}
    done = {(c["model"], c["method"], c["mac_ratio"], c["weighting"]) for c in doc["cells"]}
    for name in args.only:
        case = rr.load_case(name, args.work, quick=False)
        doc["models"][name] = rr.original_record(case)
        say(f"{name}: original top-1 {100 * doc['models'][name]['accuracy']:.2f} %")
        for method in args.methods:
            todo = [(r, w) for r in args.ratios for w in WEIGHTINGS if (name, method, r, w) not in done]
            if not todo:
                continue
            t1 = time.perf_counter()
            prepared = prepare(case.model, case.calib, method, get_method(method).config_cls(mac_ratio=0.5))
            say(f"{name} {method}: prepared in {time.perf_counter() - t1:.1f} s")
            for ratio, weighting in todo:
                row = cell(case, prepared, method, ratio, weighting, args.epochs, args.seed)
                doc["cells"].append(row)
                doc["summary"] = summary(doc["cells"])
                write_json(args.out, doc)
                accs = ", ".join(f"{e} ep {100 * b['test']['accuracy']:.2f} %"
                                 for e, b in row.get("budgets", {}).items())
                say(f"{name} {method}@{ratio} {weighting}: " + (row.get("refused") or
                    f"MACs {row['mac_ratio_reached']:.3f}, {accs}, streams {row['streams']}"))
    doc["runs"].append({"argv": sys.argv[1:], "wall_s": round(time.perf_counter() - t0, 1),
                        "cpu": cpu_share(cpu0, cpu_times()), "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    write_json(args.out, doc)
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
