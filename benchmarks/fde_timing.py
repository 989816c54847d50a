"""Time to compute the ε-FDE partition of a 4×1024 MLP (goal: under 5 s on 2 cores).

Run: ``OMP_WAIT_POLICY=PASSIVE python benchmarks/fde_timing.py --out benchmarks/fde_timing.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from fde_common import grow_by_duplication

from minreal.compress.methods.fde import extract_chain, refine
from minreal.compress.models import mlp

EPS = (0.0, 0.05, 0.2, 0.5)


def _models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {"random 64→4×1024→10": mlp(64, [1024] * 4, 10).eval(),
            "256-wide grown ×4 (+1e-3 noise)": grow_by_duplication(mlp(64, [256] * 4, 10).eval(), 4, 1e-3, 0)}


def time_partition(model: torch.nn.Module, eps: float, repeats: int, with_bound: bool) -> dict:
    chain = extract_chain(model)
    box = (-torch.ones(64, dtype=torch.float64), torch.ones(64, dtype=torch.float64)) if with_bound else None
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = refine(chain, eps, box=box)
        times.append(time.perf_counter() - t0)
    return {"eps": eps, "bound": with_bound, "median_s": statistics.median(times), "times_s": times,
            "widths": result.chain.widths, "sweeps": result.sweeps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/fde_timing.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = {name: [time_partition(m, e, args.repeats, b) for e in EPS for b in (False, True)]
            for name, m in _models().items()}
    out = {"threads": args.threads, "machine": platform.processor() or platform.machine(), "goal_s": 5.0,
           "results": rows}
    args.out.write_text(json.dumps(out, indent=1))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, rs in rows.items():
        xs = [r["eps"] for r in rs if not r["bound"]]
        ax.plot(xs, [r["median_s"] for r in rs if not r["bound"]], "o-", label=f"{name}")
        ax.plot(xs, [r["median_s"] for r in rs if r["bound"]], "s--", label=f"{name} + bound")
    ax.axhline(5.0, color="r", lw=0.8, label="goal 5 s")
    ax.set(xlabel="ε", ylabel="partition time (s, median)", title=f"4×1024 MLP, {args.threads} threads")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
