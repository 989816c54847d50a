"""Cost of Gramians + HSVs per training step vs state size n: O(n²) rotation-block route vs general route.

O(n²) route: closed-form 2×2 block Stein solves in torch (forward+backward of the regulariser Σσ, as in a
training step; also forward only). General route: scipy solve_discrete_lyapunov on the dense A (forward
only; not differentiable). HSVs by the symmetric eigvalsh route in both. Timed with runtime_bench's loop.
Writes benchmarks/ssm_gramian_cost.json and benchmarks/ssm_gramian_cost.png.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/ssm_gramian_cost.py
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
from _common import pyplot, save_figure, write_json

from minreal.compress.methods.ssm import (
    RotationSSM,
    dense_gramians,
    hankel_nuclear_norm,
    hankel_singular_values,
    rotation_gramians,
)
from minreal.runtime_bench.timing import time_interleaved

SIZES = (64, 128, 256, 512)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/ssm_gramian_cost.json")
    ap.add_argument("--plot", default="benchmarks/ssm_gramian_cost.png")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {}
    for n in SIZES:
        torch.manual_seed(0)
        layer = RotationSSM(args.features, n).double()
        sys = layer.state_space()

        def fast_step() -> None:
            layer.zero_grad()
            hankel_nuclear_norm(*rotation_gramians(layer.rho, layer.alpha, layer.b, layer.c)).backward()

        def fast_forward() -> None:
            with torch.no_grad():
                hankel_singular_values(*rotation_gramians(layer.rho, layer.alpha, layer.b, layer.c))

        def general_forward() -> None:
            hankel_singular_values(*dense_gramians(sys))

        def fast_gramians_only() -> None:
            with torch.no_grad():
                rotation_gramians(layer.rho, layer.alpha, layer.b, layer.c)

        def general_gramians_only() -> None:
            dense_gramians(sys)

        fns = {"o_n2_regulariser_fwd_bwd": fast_step, "o_n2_gramians_hsv": fast_forward,
               "general_gramians_hsv": general_forward, "o_n2_gramians_only": fast_gramians_only,
               "general_gramians_only": general_gramians_only}
        lat = time_interleaved(list(fns.values()), warmup=2, min_runs=5, min_seconds=args.min_seconds)
        results[str(n)] = {k: float(np.median(v)) for k, v in zip(fns, lat)}
        print(n, {k: round(v, 2) for k, v in results[str(n)].items()}, flush=True)
    meta = {"features": args.features, "threads": 1, "unit": "median ms per call", "dtype": "float64",
            "hsv_route": "eigvalsh(Lᵀ Q L), P = L Lᵀ by eigh (O(n³) in both routes)"}
    write_json(args.out, {"meta": meta, "results": results})
    fig, ax = pyplot().subplots(figsize=(5, 3.6))
    for key in next(iter(results.values())):
        ax.loglog(SIZES, [results[str(n)][key] for n in SIZES], "o-", label=key)
    ax.set(xlabel="state size n", ylabel="median ms", title="Gramian + HSV cost")
    ax.legend(fontsize=7)
    save_figure(fig, args.plot)


if __name__ == "__main__":
    main()
