"""Pipeline benchmark: wall time of each stage and compressed/original latency ratios on the demo models.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/pipeline.py --out benchmarks/pipeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _common import write_json

from minreal.app.demo import digits_cases
from minreal.app.pipeline import run_pipeline
from minreal.app.settings import PipelineConfig
from minreal.runtime_bench import BenchConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/pipeline.json")
    ap.add_argument("--min-seconds", type=float, default=2.0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    cases = digits_cases(quick=True)
    train_s = time.perf_counter() - t0
    cfg = PipelineConfig(bench=BenchConfig(batch_sizes=(1, 32), min_seconds=args.min_seconds, repeats=3))
    with tempfile.TemporaryDirectory() as tmp:
        report = run_pipeline(cases, Path(tmp) / "run", cfg, progress=lambda m: print(m, flush=True))
    out = {"train_seconds": train_s, "config": {"min_seconds": cfg.bench.min_seconds, "repeats": cfg.bench.repeats},
           "cases": {}}
    for case in report.cases:
        ratios = {f"{r['model']}@{r['provider']}/b{r['batch_size']}": {k: r[k] for k in ("median", "min", "max")}
                  for r in case.bench["ratios"]}
        out["cases"][case.name] = {"stage_seconds": case.stage_seconds, "latency_ratio_vs_original": ratios,
                                   "mac_ratio": {v.label: v.macs / case.variants[0].macs for v in case.variants}}
    write_json(args.out, out, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
