"""Benchmark 2 (issue 3): factorize on torchvision resnet18 at 224×224 with 256 calibration images.

Wall time of statistics and decompositions separately, and peak RSS, for a first run (cold cache) and a
second run at another budget (cache hit). Each run is a fresh subprocess so its peak RSS is its own.
Random weights and seeded random images (no network). Writes benchmarks/factorize_resnet18.json.
Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/factorize_resnet18.py [--images 256] [--stats-dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write_json

OUT = Path(__file__).with_suffix(".json")


def calibration(images: int):
    import torch

    from minreal.compress.core.data import Dataset

    return Dataset(torch.randn(images, 3, 224, 224, generator=torch.Generator().manual_seed(0)))


def one_run(images: int, flops: float, cache: str, stats_dtype: str) -> dict:
    import torch
    import torchvision

    from minreal.compress import compress
    from minreal.compress.methods.factorize import FactorizeConfig

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    data = calibration(images)
    t0 = time.perf_counter()
    _, rep = compress(model, data, "factorize", FactorizeConfig(layer_mac_ratio=flops, cache_dir=cache,
                                                               stats_dtype=stats_dtype, batch_size=32))
    return {"flops": flops, "images": images, "stats_dtype": stats_dtype, "threads": torch.get_num_threads(),
            "wall_s": time.perf_counter() - t0,
            "wall_without_measure_s": time.perf_counter() - t0 - rep.timings_s["measure"], "timings_s": rep.timings_s,
            "cache_hits": rep.predicted["cache_hits"],
            "factorizable_mac_ratio": rep.predicted["factorizable_mac_ratio"],
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--stats-dtype", default="float32")
    ap.add_argument("--child", nargs=2, metavar=("FLOPS", "CACHE"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_run(args.images, float(args.child[0]), args.child[1], args.stats_dtype)))
        return
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        for flops in (0.5, 0.7):
            cmd = [sys.executable, __file__, "--images", str(args.images), "--stats-dtype", args.stats_dtype,
                   "--child", str(flops), cache]
            res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=dict(os.environ))
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(runs[-1], flush=True)
    write_json(OUT, {"model": "torchvision resnet18 (random weights)", "input": [3, 224, 224],
                     "cpu_count": os.cpu_count(), "load_avg_1min": os.getloadavg()[0], "runs": runs})


if __name__ == "__main__":
    main()
