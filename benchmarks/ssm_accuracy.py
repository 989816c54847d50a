"""SSM accuracy after balanced truncation, with and without the Hankel nuclear-norm regulariser.

Tasks: sequential digits (8×8 images read pixel by pixel, length 64) and a synthetic length-512 burst
frequency task (minreal.compress.datasets.synthetic_sequences). Short CPU schedules (stated in the JSON). Epochs are
selected on a validation split (15 %) of the training data and truncation calibrates on the training data; the test
split is only scored.
Writes benchmarks/ssm_accuracy.json and benchmarks/ssm_hsv_decay.png.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/ssm_accuracy.py
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from _common import pyplot, save_figure, write_json

from minreal.compress import compress
from minreal.compress.datasets import sequential_digits, synthetic_sequences
from minreal.compress.methods.ssm import SSMConfig
from minreal.compress.methods.ssm.training import SSMTrainSpec, train_ssm_classifier

TRUNCS = (0.5, 0.6, 0.7, 0.8, 0.9)
PAPER_SMNIST = {"with_reg": {0.6: 99.45, 0.7: 99.22, 0.8: 98.90, 0.9: 86.95},
                "without_reg": {0.6: 91.32, 0.7: 13.35, 0.8: 11.05, 0.9: 10.55}}


def _accuracy(model: torch.nn.Module, data) -> float:
    with torch.no_grad():
        return float((model(data.x).argmax(1) == data.y).double().mean())


def run_task(name: str, train, test, spec: SSMTrainSpec) -> dict:
    """Train with/without the regulariser, reduce at each truncation ratio, record accuracy and HSVs."""
    out = {}
    for label, weight in (("with_reg", spec.reg_weight), ("without_reg", 0.0)):
        s = SSMTrainSpec(**{**asdict(spec), "reg_weight": weight})
        t0 = time.perf_counter()
        fit, val = train.split(0.15, seed=spec.seed)  # epochs selected on training data, never on the test split
        model, _ = train_ssm_classifier(fit, val, s)
        row = {"train_seconds": time.perf_counter() - t0, "accuracy_full": _accuracy(model, test), "by_trunc": {}}
        for trunc in TRUNCS:
            reduced, rep = compress(model, fit, "ssm", SSMConfig(trunc=trunc))
            row["by_trunc"][str(trunc)] = {
                "accuracy": _accuracy(reduced, test), "orders": [l.rank for l in rep.layers],
                "bound": [l.details["bound"] for l in rep.layers],
                "measured_gain_error": [l.details["measured_gain_error"] for l in rep.layers],
                "forms": [l.details["form"] for l in rep.layers]}
        row["hsv"] = {l.name: l.details["hsv"] for l in rep.layers}
        out[label] = row
        print(name, label, {k: round(v["accuracy"], 4) for k, v in row["by_trunc"].items()},
              "full", round(row["accuracy_full"], 4), flush=True)
    return out


def plot_hsv(results: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6))
    for ax, (task, res) in zip(axes, results.items()):
        for label, style in (("with_reg", "-"), ("without_reg", "--")):
            for layer, hsv in res[label]["hsv"].items():
                h = torch.tensor(hsv)
                ax.semilogy(range(1, len(h) + 1), (h / h[0]).numpy(), style, label=f"{label} {layer}")
        ax.set(title=f"{task}: HSV decay", xlabel="index i", ylabel="σ_i / σ_1")
        ax.legend(fontsize=6)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/ssm_accuracy.json")
    ap.add_argument("--plot", default="benchmarks/ssm_hsv_decay.png")
    args = ap.parse_args()
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    digits_spec = SSMTrainSpec(features=24, state=32, depth=2, reg_weight=3e-3, epochs=12, lr=5e-3)
    synth_spec = SSMTrainSpec(features=16, state=32, depth=2, reg_weight=3e-3, epochs=8, lr=5e-3)
    tasks = {"sequential_digits": (sequential_digits(seed=0), digits_spec),
             "synthetic_len512": (synthetic_sequences(n=1200, length=512, noise=0.5, seed=0), synth_spec)}
    results = {name: run_task(name, *data, spec) for name, (data, spec) in tasks.items()}
    meta = {"schedules": {k: asdict(v[1]) for k, v in tasks.items()}, "truncs": TRUNCS,
            "threads": torch.get_num_threads(),
            "paper_smnist_accuracy_percent": PAPER_SMNIST,
            "note": "paper: sMNIST (length 784), long GPU schedules; here: short CPU schedules, 8×8 digits"}
    write_json(args.out, {"meta": meta, "results": results})
    plot_hsv(results, Path(args.plot))


if __name__ == "__main__":
    main()
