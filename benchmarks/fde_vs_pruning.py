"""fde (each representative × compensation on/off) against magnitude and Wanda pruning (Wanda also compensated)
at matched hidden widths and no fine-tuning, over whole-model parameter budgets from 90 % to 10 %, on held-out
data: a 10-128-128-1 ReLU MLP on scikit-learn's diabetes (standardised target, early stopping; test MSE) and a
64-128-128-10 ReLU MLP on the digits (test accuracy).

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/fde_vs_pruning.py --out benchmarks/fde_vs_pruning.json
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
from _common import write_json
from torch import nn

from minreal.compress import compress
from minreal.compress.core.chain import build_sequential, extract_chain
from minreal.compress.core.data import Dataset
from minreal.compress.core.evaluate import predict
from minreal.compress.core.prune import prune_chain
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.datasets import digits
from minreal.compress.methods.fde import FDEConfig
from minreal.compress.methods.fde.compensate import compensate
from minreal.compress.methods.fde.config import REPRESENTATIVES
from minreal.compress.methods.wanda import WandaConfig, wanda_scores
from minreal.compress.models import mlp
from minreal.compress.registry import get_method

Case = Callable[[], tuple[nn.Module, Dataset, Dataset, str]]
RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
RIDGE, HOLDOUT, SEED = 1e-3, 0.2, 0


def diabetes_case() -> tuple[nn.Module, Dataset, Dataset, str]:
    """10-128-128-1 ReLU MLP on the diabetes data (inputs and target standardised on the training split)."""
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    perm = np.random.default_rng(SEED).permutation(len(x))
    tr, va, te = perm[:265], perm[265:354], perm[354:]
    mx, sx, my, sy = x[tr].mean(0), x[tr].std(0), y[tr].mean(), y[tr].std()
    ds = lambda i: Dataset(torch.tensor((x[i] - mx) / sx, dtype=torch.float32),  # noqa: E731
                           torch.tensor((y[i, None] - my) / sy, dtype=torch.float32))
    torch.manual_seed(SEED)
    model = mlp(10, [128, 128], 1)
    train(model, ds(tr), ds(va), TrainConfig(epochs=300, batch_size=32, lr=1e-3, patience=20, seed=SEED))
    return model.eval(), ds(tr), ds(te), "mse"


def digits_case() -> tuple[nn.Module, Dataset, Dataset, str]:
    """64-128-128-10 ReLU MLP on the digits, early stopping on a split of the training part."""
    train_set, test = digits(SEED, as_images=False)
    fit, val = train_set.split(0.15, SEED)
    torch.manual_seed(SEED)
    model = mlp(64, [128, 128], 10)
    train(model, fit, val, TrainConfig(epochs=60, batch_size=64, lr=3e-3, patience=8, seed=SEED))
    return model.eval(), fit, test, "accuracy"


def metric(model: nn.Module, data: Dataset, kind: str) -> float:
    out = predict(model, data)
    if kind == "accuracy":
        return float((out.argmax(1) == data.y).double().mean())
    return float(((out - data.y) ** 2).mean())


def wanda_compensated(model: nn.Module, calib: Dataset, widths: list[int]) -> tuple[nn.Module, bool]:
    """Wanda's pruning redone on the chain (so each kept neuron's group names its original index) and refitted
    by the same held-out-checked least squares fde uses."""
    chain = extract_chain(model)
    pruned = prune_chain(chain, wanda_scores(chain, calib.x[:WandaConfig().norm_samples]), widths)
    comp = compensate(chain, pruned, calib.x, RIDGE, HOLDOUT, SEED)
    return build_sequential(comp.chain), comp.accepted


def run_budget(model: nn.Module, calib: Dataset, test: Dataset, kind: str, ratio: float) -> list[dict]:
    rows = []
    for rep in REPRESENTATIVES:
        for comp in (False, True):
            cfg = FDEConfig(param_ratio=ratio, representative=rep, compensation=comp, compensation_ridge=RIDGE,
                            compensation_holdout=HOLDOUT, bound_samples=256, seed=SEED)
            new, r = compress(model, calib, "fde", cfg)
            rows.append({"method": f"fde-{rep}" + ("+comp" if comp else ""), "metric": metric(new, test, kind),
                         "params": r.params_after, "widths": r.predicted["hidden_widths"],
                         "merge_eps_per_layer": r.predicted["merge_eps_per_layer"],
                         "bound": r.bounds["output"],
                         "compensation_accepted": r.predicted.get("compensation", {}).get("accepted")})
    for name in ("magnitude", "wanda"):
        new, r = compress(model, calib, name, get_method(name).config_cls(param_ratio=ratio))
        rows.append({"method": name, "metric": metric(new, test, kind), "params": r.params_after,
                     "widths": r.predicted["hidden_widths"]})
        if name == "wanda":
            refit, ok = wanda_compensated(model, calib, r.predicted["hidden_widths"])
            rows.append({"method": "wanda+comp", "metric": metric(refit, test, kind), "params": r.params_after,
                         "widths": r.predicted["hidden_widths"], "compensation_accepted": ok})
    return rows


def run_case(case: Case) -> dict:
    t0 = time.perf_counter()
    model, calib, test, kind = case()
    full = sum(p.numel() for p in model.parameters())
    out = {"metric": kind, "params_full": full, "metric_full": metric(model, test, kind),
           "calibration_samples": len(calib), "test_samples": len(test), "budgets": []}
    for ratio in RATIOS:
        out["budgets"].append({"param_ratio": ratio, "rows": run_budget(model, calib, test, kind, ratio)})
    out["seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/fde_vs_pruning.json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    doc = {"settings": {"ratios": RATIOS, "compensation_ridge": RIDGE, "compensation_holdout": HOLDOUT,
                        "seed": SEED, "fine_tuning": "none", "widths": "matched (uniform keep fraction, as pruning)"},
           "diabetes": run_case(diabetes_case), "digits": run_case(digits_case)}
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
