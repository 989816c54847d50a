"""Issue 18: does a tail-only Hankel regulariser keep full-order accuracy and still allow deep truncation?

Four arms per task and seed: unregularised; the full Hankel nuclear norm Σσ at a fixed weight (as
benchmarks/ssm_accuracy.py); the tail-only penalty Σ_{i>r} σ_i at the same weight, r the order of the deepest
truncation of interest (``--tail-trunc``, default 90 %; per layer, or a total budget with ``--tail-budget``); and
the tail-only penalty with its weights set by the per-layer energy-target controller (keep ≥ ``--target-energy`` of
Σσ in r states; warm-up, then a linear ramp; minreal.compress.methods.ssm.training); and, as the capacity reference, an
unregularised model with r states per layer trained from scratch (what an order-r model of this architecture reaches
directly: a model whose Hankel tail beyond r is negligible is an order-r model, so no regulariser can keep more at
that order than this arm reaches, short of optimisation effects). The absolute tail, not the ratio
Σ_{i>r} σ_i / Σσ: the scale-free ratio is lowered by inflating the unpenalised head σ_1, σ_2.
Training selects its epoch on a validation split (15 %) of the training data; the test split is only scored.
Each trained model is reduced by balanced truncation at 50/70/90/95 % of the states, per layer (``--trunc``)
and as a total budget shared at equal energy (``--state-budget`` with the same total). Tasks: sequential digits
(``digits-seq``, length 64) and the synthetic length-512 burst task (minreal.compress.datasets.synthetic_sequences);
64 states, 2 layers. Writes benchmarks/ssm_regulariser.json (atomically); ``--quick`` is a smoke run (one seed,
two epochs, data subsets) that also projects the full run's duration from its measured step times.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/ssm_regulariser.py [--quick --out /tmp/x.json]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from _common import write_json

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.datasets import sequential_digits, synthetic_sequences
from minreal.compress.methods.ssm import (
    HankelRegularisation,
    SSMConfig,
    SSMTrainSpec,
    hankel_singular_values,
    layer_gramians,
    order_from_trunc,
    rotation_layers,
    tail_energies,
    train_ssm_classifier,
)

TRUNCS = (0.5, 0.7, 0.9, 0.95)
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Task:
    """Training data, the validation split carved from it (epoch selection), held-out test data, and the base
    training spec of the arms."""

    name: str
    train: Dataset
    val: Dataset
    test: Dataset
    spec: SSMTrainSpec


def tasks(quick: bool) -> list[Task]:
    """digits-seq and the synthetic long-sequence task, 64 states × 2 layers (subsets and 2 epochs if quick)."""
    digits = sequential_digits(seed=0)
    synth = synthetic_sequences(n=1200, length=512, noise=0.5, seed=0)
    specs = (SSMTrainSpec(features=24, state=64, depth=2, reg_weight=3e-3, epochs=20, lr=5e-3),
             SSMTrainSpec(features=16, state=64, depth=2, reg_weight=3e-3, epochs=12, lr=5e-3))
    out = []
    for name, (train, test), spec in zip(("digits_seq", "synthetic_len512"), (digits, synth), specs):
        if quick:
            train, test, spec = train.take(192), test.take(96), replace(spec, epochs=2)
        fit, val = train.split(0.15, seed=0)
        out.append(Task(name, fit, val, test, spec))
    return out


def arms(spec: SSMTrainSpec, tail_trunc: float, target_energy: float, budget: bool) -> dict[str, SSMTrainSpec]:
    """Unregularised; full nuclear norm at the fixed weight; tail-only Σ_{i>r} σ_i at the same fixed weight; and
    tail-only with its weights from the energy-target controller (same starting weight, 20 % warm-up, 20 % ramp);
    and r states trained from scratch, unregularised. The tail's r is per layer, or with ``budget`` the same total
    shared at equal energy."""
    r = order_from_trunc(spec.state, tail_trunc)
    target = {"state_budget": r * spec.depth} if budget else {"target_order": r}
    tail = HankelRegularisation(**target)
    controlled = HankelRegularisation(**target, warmup=0.2, ramp=0.2, target_energy=target_energy)
    return {"none": replace(spec, reg_weight=0.0), "full": spec, "tail": replace(spec, regularisation=tail),
            "tail_target": replace(spec, regularisation=controlled),
            "scratch_r": replace(spec, state=r, reg_weight=0.0)}


def _accuracy(model: torch.nn.Module, data: Dataset) -> float:
    with torch.no_grad():
        return float((model(data.x).argmax(1) == data.y).double().mean())


def truncation_row(model: torch.nn.Module, task: Task, trunc: float) -> dict:
    """Accuracy after balanced truncation at ``trunc``: per layer, and as the same total budget at equal energy."""
    per_layer = order_from_trunc(task.spec.state, trunc)  # of the 64-state arms (scratch_r: of its r states)
    configs = {"per_layer": SSMConfig(trunc=trunc, error_samples=64),
               "budget": SSMConfig(state_budget=per_layer * task.spec.depth, error_samples=64)}
    row = {}
    for label, cfg in configs.items():
        reduced, rep = compress(model, task.train, "ssm", cfg)
        row[label] = {"accuracy": _accuracy(reduced, task.test), "orders": [l.rank for l in rep.layers],
                      "energy_kept": [l.details["energy_kept"] for l in rep.layers],
                      "bound": [l.details["bound"] for l in rep.layers],
                      "measured_gain_error": [l.details["measured_gain_error"] for l in rep.layers]}
    return row


def run_arm(task: Task, spec: SSMTrainSpec, tail_order: int) -> dict:
    """Train one arm and one seed, then truncate at every ratio; step times for the duration projection."""
    t0 = time.perf_counter()
    model, result = train_ssm_classifier(task.train, task.val, spec)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # The scratch arm already has the reduced order: it is the reference for the truncated 64-state models.
    rows = {str(t): truncation_row(model, task, t) for t in TRUNCS} if spec.state == task.spec.state else {}
    steps = math.ceil(len(task.train) / spec.batch_size) * spec.epochs
    return {"accuracy_full": _accuracy(model, task.test), "train_seconds": train_s, "train_steps": steps,
            "eval_seconds": time.perf_counter() - t0, "test_samples": len(task.test), "by_trunc": rows,
            "tail_energy_at_target": tail_energies(model, target_order=tail_order)[0],
            "hsv": {n: hankel_singular_values(*layer_gramians(m)).tolist() for n, m in rotation_layers(model).items()},
            "selected_epoch": result.selected_epoch, "final_weight": result.final_weight,
            "history": [asdict(e) for e in result.history]}


def summarise(runs: dict[str, dict[int, dict]]) -> dict:
    """Mean and spread (population std) over seeds of every accuracy, per arm."""
    def stats(values: list[float]) -> dict:
        return {"mean": statistics.fmean(values), "std": statistics.pstdev(values), "n": len(values)}

    out = {}
    for arm, by_seed in runs.items():
        seeds = list(by_seed.values())
        out[arm] = {"accuracy_full": stats([s["accuracy_full"] for s in seeds]),
                    **{f"{kind}@{t}": stats([s["by_trunc"][str(t)][kind]["accuracy"] for s in seeds])
                       for t in TRUNCS for kind in ("per_layer", "budget") if seeds[0]["by_trunc"]}}
    return out


def goal(summary: dict, tail_trunc: float) -> dict:
    """Issue 18's goal per tail arm: full-order accuracy within 0.3 pp of the unregularised arm, and ≥ 99 % of its
    own full-order accuracy kept at ``tail_trunc`` (per layer and budget), on the means over seeds."""
    none = summary["none"]["accuracy_full"]["mean"]
    out = {}
    for arm in ("tail", "tail_target"):
        full = summary[arm]["accuracy_full"]["mean"]
        kept = {kind: summary[arm][f"{kind}@{tail_trunc}"]["mean"] / full for kind in ("per_layer", "budget")}
        out[arm] = {"full_order_gap_pp": 100 * (none - full), "kept_at_trunc": kept,
                    "met": none - full <= 0.003 and min(kept.values()) >= 0.99}
    return out


def projected_seconds(runs: dict[str, dict[int, dict]], full: Task) -> float:
    """Full-run duration from a quick run: seconds per training step × the full run's steps, and evaluation
    time scaled by the full test set (an upper estimate: reduction costs do not grow with it), every arm and seed."""
    total = 0.0
    for by_seed in runs.values():
        for r in by_seed.values():
            full_steps = math.ceil(len(full.train) / full.spec.batch_size) * full.spec.epochs
            total += r["train_seconds"] / r["train_steps"] * full_steps * len(SEEDS)
            total += r["eval_seconds"] * len(full.test) / r["test_samples"] * len(SEEDS)
    return total


def run_task(task: Task, args: argparse.Namespace, seeds: tuple[int, ...]) -> dict:
    """Every arm and seed of one task, with the per-arm summary and the specs."""
    tail_order = order_from_trunc(task.spec.state, args.tail_trunc)
    specs = arms(task.spec, args.tail_trunc, args.target_energy, args.tail_budget)
    runs: dict[str, dict[int, dict]] = {}
    for arm, spec in specs.items():
        runs[arm] = {s: run_arm(task, replace(spec, seed=s), tail_order) for s in seeds}
        print(task.name, arm, {s: round(r["accuracy_full"], 4) for s, r in runs[arm].items()}, flush=True)
    summary = summarise(runs)
    return {"runs": runs, "summary": summary, "goal": goal(summary, args.tail_trunc), "tail_order": tail_order,
            "spec": {a: asdict(s) for a, s in specs.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/ssm_regulariser.json")
    ap.add_argument("--quick", action="store_true", help="smoke run: one seed, 2 epochs, data subsets")
    ap.add_argument("--tail-trunc", type=float, default=0.9, help="truncation the tail-only penalty targets")
    ap.add_argument("--target-energy", type=float, default=0.99, help="kept HSV energy the controller aims at")
    ap.add_argument("--tail-budget", action="store_true", help="tail target as a total budget (equal energy)")
    args = ap.parse_args()
    if args.tail_trunc not in TRUNCS:
        ap.error(f"--tail-trunc must be one of the measured truncations {TRUNCS}, got {args.tail_trunc}")
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    seeds = SEEDS[:1] if args.quick else SEEDS
    results = {task.name: run_task(task, args, seeds) for task in tasks(args.quick)}
    meta = {"truncs": TRUNCS, "seeds": seeds, "quick": args.quick, "tail_trunc": args.tail_trunc,
            "tail_budget": args.tail_budget, "target_energy": args.target_energy,
            "threads": torch.get_num_threads(),
            "note": "accuracy on the held-out test split (epochs selected on a validation split of the training "
                    "data); scratch_r = r states per layer trained from scratch (no truncation rows); per_layer = "
                    "--trunc, budget = --state-budget with the same "
                    "total order (equal energy across layers)"}
    if args.quick:
        full = {t.name: t for t in tasks(quick=False)}
        meta["projected_full_seconds"] = sum(projected_seconds(r["runs"], full[n]) for n, r in results.items())
        print(f"projected full run: {meta['projected_full_seconds'] / 60:.0f} min on {meta['threads']} threads")
    write_json(args.out, {"meta": meta, "results": results})


if __name__ == "__main__":
    main()
