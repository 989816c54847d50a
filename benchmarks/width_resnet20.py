"""Width methods on a trained CIFAR ResNet-20 (option-A shortcuts) on digits32, against the rows to beat.

Every variant gets the same recovery (distillation from the original, ``--recover-epochs`` on the calibration
split); accuracy is top-1 on the held-out split the methods never saw; latency is measured with ONNX Runtime
on the CPU provider in fresh processes (batch 1 and 32, spread over processes), fp32 and INT8 of every
variant next to the original in fp32 and INT8. Budgets: measured-latency ratios 0.8/0.6/0.5 from width and
rank latency tables built first on this machine (batch 32).

Torch-Pruning's own pruner (DepGraph, group magnitude importance, round_to=8) and ``fde`` (budget by ε) run at the
MAC ratio our magnitude variant reached at each latency target. ``cbalanced`` sets widths by its energy
tolerance; its own training is off and it gets the same recovery as every other variant. On option-A shortcuts DepGraph
ties the 16/32/64 streams through ``F.pad`` position by position and the pruned model fails to run; its rows therefore
prune the block-internal channels only (the stream convolutions are in ``ignored_layers``), which is stated in the JSON.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/width_resnet20.py --out benchmarks/width_resnet20.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_json
from torch import nn
from tp_baseline import TorchPruningConfig, torch_pruning_spec
from trained_models import resnet20_digits32

from minreal.app.pipeline import run_pipeline
from minreal.app.settings import PipelineConfig
from minreal.compress.core.data import Dataset
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.run_case import RunCase, VariantSpec
from minreal.compress.datasets import digits32
from minreal.compress.registry import register
from minreal.export.latency_table import build_latency_table, build_width_latency_table
from minreal.runtime_bench import BenchConfig

MULTIPLE = 8  # the CPU provider's width multiple (minreal.compress.core.options.WIDTH_MULTIPLE_BY_PROVIDER)
TP_NOTE = ("torch-pruning 1.6.1 DepGraph treats the option-A F.pad as elementwise and ties the 16/32/64 streams "
           "position by position; pruned that way the model fails to run (mat1 and mat2 shapes cannot be "
           "multiplied). Its rows prune block-internal channels only: conv1 and every block's conv2 are ignored.")


def _stream_layers(m: nn.Module) -> list[nn.Module]:
    """The layers writing the option-A streams, which DepGraph would mis-tie (see TP_NOTE), and the classifier."""
    return [m.linear, m.conv1] + [b.conv2 for stage in (m.layer1, m.layer2, m.layer3) for b in stage]


def _feasible(model: nn.Module, data: Dataset, runs: list[VariantSpec]
              ) -> tuple[list[VariantSpec], dict[str, str], dict[str, float]]:
    """The runs whose method meets its budget on this model, the refusal of each other one (one line), and the
    whole-model MAC ratio each feasible run reached."""
    from minreal.compress.core.errors import CompressionError
    from minreal.compress.registry import compress, compress_chain

    ok, refused, macs = [], {}, {}
    for run in runs:
        try:
            if run.steps:
                _, report = compress_chain(model, data, run.steps)
            else:
                _, report = compress(model, data, run.method, run.config)
            ok.append(run)
            macs[run.label] = report.mac_ratio
        except CompressionError as exc:
            refused[run.label] = str(exc)
            print(f"{run.label}: refused: {exc}", flush=True)
    return ok, refused, macs


def summarise(case: dict) -> list[dict]:
    """One row per model (fp32 and INT8 of every variant and of the original): held-out top-1 and the latency
    ratio to the original fp32 at each batch size (median and range over fresh processes), MACs and params."""
    bench = case["bench"]
    acc = {m["model"]: m["accuracy"] for m in bench["metrics"]}
    ratios = {(r["model"], r["batch_size"]): r for r in bench["ratios"] if r["reference"] == "original"}
    sizes = {v["label"]: (v["macs"], v["params"]) for v in case["variants"]}
    rows = []
    for name in acc:
        base = name[:-5] if name.endswith(".int8") else name
        row = {"model": name, "top1": acc[name], "macs": sizes.get(base, (None, None))[0],
               "params": sizes.get(base, (None, None))[1]}
        for b in sorted({k[1] for k in ratios}):
            r = ratios.get((name, b))
            row[f"b{b}"] = None if name == "original" else (
                {"median": r["median"], "min": r["min"], "max": r["max"]} if r else None)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/width_resnet20.json")
    ap.add_argument("--ratios", default="0.8,0.6,0.5")
    ap.add_argument("--recover-epochs", type=int, default=6)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ratios = [float(r) for r in args.ratios.split(",")]
    t_start = time.perf_counter()
    trained = resnet20_digits32()
    model, record = trained.model, trained.record
    model.eval()
    calib, held_out = digits32(0, 0.25)
    register(torch_pruning_spec(_stream_layers, round_to=8, note=TP_NOTE))
    from minreal.compress.methods.cbalanced import CBalancedConfig
    from minreal.compress.methods.factorize.config import FactorizeConfig
    from minreal.compress.methods.fde import FDEConfig
    from minreal.compress.methods.magnitude import MagnitudeConfig
    from minreal.compress.methods.wanda import WandaConfig

    with tempfile.TemporaryDirectory() as tmp:
        example = calib.x[:32]
        t0 = time.perf_counter()
        width_table = Path(tmp) / "width.json"
        build_width_latency_table(model, example, "cpu", MULTIPLE, out_path=width_table)
        rank_table = Path(tmp) / "rank.json"
        build_latency_table(model, example, "cpu", ranks_per_layer=6, out_path=rank_table)
        tables_s = time.perf_counter() - t0
        runs: list[VariantSpec] = []
        refused: dict[str, str] = {}
        for r in ratios:
            w = dict(latency_ratio=r, latency_table=str(width_table), width_multiple=MULTIPLE)
            budgeted = [VariantSpec(f"magnitude-{r:g}", "magnitude", MagnitudeConfig(**w)),
                        VariantSpec(f"wanda-{r:g}", "wanda", WandaConfig(**w)),
                        VariantSpec(f"factorize-{r:g}", "factorize",
                                FactorizeConfig(latency_ratio=r, latency_table=str(rank_table))),
                        VariantSpec(f"magnitude+factorize-{r:g}", "magnitude+factorize", None,
                                steps=(("magnitude", MagnitudeConfig(**{**w, "latency_ratio": min(1.0, r + 0.1)})),
                                       ("factorize", FactorizeConfig(mac_ratio=0.8))))]
            ok, no, macs = _feasible(model, calib, budgeted)
            runs += ok
            refused.update(no)
            if f"magnitude-{r:g}" in macs:  # fde and Torch-Pruning at the MAC ratio magnitude reached there
                m = round(macs[f"magnitude-{r:g}"], 3)
                runs += [VariantSpec(f"fde-mac{m:g}", "fde", FDEConfig(mac_ratio=m)),
                         VariantSpec(f"torch_pruning-mac{m:g}", "torch_pruning", TorchPruningConfig(mac_ratio=m))]
        for eps in (1e-2, 1e-3):  # widths from the energy tolerance; trained by the same recovery as the others
            runs.append(VariantSpec(f"cbalanced-eps{eps:g}", "cbalanced",
                                CBalancedConfig(energy_eps=eps, controls=False, width_multiple=MULTIPLE)))
        case = RunCase("resnet20_cifar@digits32", model, calib, held_out, runs,
                        notes=[f"trained {record.epochs} epochs on the calibration split; held-out top-1 "
                               f"{record.heldout_top1:.4f}", TP_NOTE])
        cfg = PipelineConfig(bench=BenchConfig(batch_sizes=(1, 32), min_seconds=args.min_seconds, repeats=args.repeats),
                             recovery=RecoveryConfig(epochs=args.recover_epochs))
        report = run_pipeline([case], Path(tmp) / "run", cfg, progress=lambda m: print(m, flush=True))
        doc = json.loads((Path(tmp) / "run" / "report.json").read_text())
    out = {"model": "resnet20_cifar (option A, 16/32/64) trained on digits32 calibration split",
           "held_out_samples": len(held_out), "recover_epochs": args.recover_epochs, "ratios": ratios,
           "tables_seconds": tables_s, "total_seconds": time.perf_counter() - t_start,
           "torch_pruning_note": TP_NOTE, "refused": refused, "summary": summarise(doc["cases"][0]),
           "report": doc["cases"][0]}
    write_json(args.out, out, indent=1)
    print(f"wrote {args.out}")
    del report


if __name__ == "__main__":
    main()
