"""ε sweep: params kept vs test MSE for fde, fde + fine-tuning, magnitude and Wanda (same widths), per dataset,
over seeds (mean and 95% CI); plus networks grown by duplication, where near-equivalent neurons exist.

Run: ``OMP_WAIT_POLICY=PASSIVE python benchmarks/fde_sweep.py --out benchmarks/fde_sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from fde_common import grow_by_duplication, mean_ci, mse, trained_mlp

from minreal.compress import RecoveryConfig, compress
from minreal.compress.dynamics import REGRESSION_DATASETS, regression_dataset
from minreal.compress.methods.fde import FDEConfig
from minreal.compress.methods.magnitude import MagnitudeConfig
from minreal.compress.methods.wanda import WandaConfig

EPS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7)
FINETUNE_EPS = (0.3, 0.7)
METHODS = ("fde", "fde_ft", "magnitude", "wanda")


def _point(model, train_set, test_set, eps: float, finetune: bool) -> dict:
    new, rep = compress(model, train_set, "fde", FDEConfig(merge_eps=eps))
    widths = tuple(rep.predicted["hidden_widths"])
    row = {"eps": eps, "param_ratio": rep.param_ratio, "widths": list(widths), "fde": mse(new, test_set),
           "bound": rep.predicted["output_deviation_bound"], "dead_removed": rep.predicted["dead_removed"],
           "measured_box": rep.measured["max_output_deviation_box_float64"],
           "partition_s": rep.timings_s["partition"]}
    for name, cfg in (("magnitude", MagnitudeConfig(widths=widths)), ("wanda", WandaConfig(widths=widths))):
        row[name] = mse(compress(model, train_set, name, cfg)[0], test_set)
    if finetune:
        ft, _ = compress(model, train_set, "fde", FDEConfig(merge_eps=eps),  # label-only fine-tuning, as measured
                         RecoveryConfig(epochs=10, lr=1e-3, alpha=1.0))
        row["fde_ft"] = mse(ft, test_set)
    return row


def sweep(datasets: tuple[str, ...], seeds: tuple[int, ...], width: int) -> list[dict]:
    rows = []
    for name in datasets:
        for seed in seeds:
            tr, te = regression_dataset(name, seed)
            model = trained_mlp(tr, te, [width, width], seed)
            base = mse(model, te)
            for eps in EPS:
                rows.append({"dataset": name, "seed": seed, "original": base,
                             **_point(model, tr, te, eps, eps in FINETUNE_EPS)})
            print(f"{name} seed {seed}: done", flush=True)
    return rows


def grown(datasets: tuple[str, ...], seeds: tuple[int, ...], noise: float) -> list[dict]:
    """Train 32-wide, grow ×4 by duplication with noise, sweep ε."""
    rows = []
    for name in datasets:
        for seed in seeds:
            tr, te = regression_dataset(name, seed)
            small = trained_mlp(tr, te, [32, 32], seed)
            model = grow_by_duplication(small, 4, noise, seed)
            for eps in (0.0, 0.001, 0.01, 0.05, 0.2):
                rows.append({"dataset": name, "seed": seed, "original": mse(model, te), "narrow": mse(small, te),
                             **_point(model, tr, te, eps, False)})
    return rows


def summarise(rows: list[dict], eps_grid: tuple[float, ...]) -> dict:
    out: dict = {}
    for name in sorted({r["dataset"] for r in rows}):
        for eps in eps_grid:
            sel = [r for r in rows if r["dataset"] == name and r["eps"] == eps]
            if not sel:
                continue
            entry = {"param_ratio": mean_ci([r["param_ratio"] for r in sel]),
                     "original": mean_ci([r["original"] for r in sel])}
            for m in METHODS:
                if m in sel[0]:
                    entry[m] = mean_ci([r[m] for r in sel])
            out.setdefault(name, {})[str(eps)] = entry
    return out


def plot(summary: dict, path: Path, title: str) -> None:
    names = sorted(summary)
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        pts = summary[name]
        for m, style in zip(METHODS, ("o-", "s--", "^:", "v-.")):
            xs = [(p["param_ratio"][0], p[m]) for p in pts.values() if m in p]
            if xs:
                ax.errorbar([x for x, _ in xs], [v[0] for _, v in xs], yerr=[v[1] for _, v in xs], fmt=style,
                            label=m, capsize=2)
        ax.axhline(next(iter(pts.values()))["original"][0], color="k", lw=0.8, label="original")
        ax.set(xscale="linear", yscale="log", xlabel="params kept (ratio)", title=name)
    axes[0][0].set_ylabel("test MSE (mean ± 95% CI)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/fde_sweep.json"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--noise", type=float, default=1e-3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    seeds = tuple(range(args.seeds))
    t0 = time.perf_counter()
    rows = sweep(REGRESSION_DATASETS, seeds, args.width)
    grown_rows = grown(REGRESSION_DATASETS, seeds, args.noise)
    result = {"config": {"eps": EPS, "seeds": seeds, "width": args.width, "grown": {"narrow": 32, "factor": 4,
                                                                                      "noise": args.noise}},
              "trained": {"summary": summarise(rows, EPS), "rows": rows},
              "grown": {"summary": summarise(grown_rows, (0.0, 0.001, 0.01, 0.05, 0.2)), "rows": grown_rows},
              "wall_s": time.perf_counter() - t0}
    args.out.write_text(json.dumps(result, indent=1))
    plot(result["trained"]["summary"], args.out.with_suffix(".png"), f"trained {args.width}×2 ReLU MLPs")
    plot(result["grown"]["summary"], args.out.with_name(args.out.stem + "_grown.png"),
         "32×2 MLPs grown ×4 by duplication (+noise)")


if __name__ == "__main__":
    main()
