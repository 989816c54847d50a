"""Width cuts on torchvision resnet18 and mobilenet_v2 at 224×224: measured latency against the original in fp32
and INT8, and the time and memory of the channel-group analysis on resnet50 and vit_b_16.

**Random weights** (nothing can be downloaded here): the latency of a network does not depend on its weights,
but accuracy does, so no accuracy is reported — the top-1 columns of the run report compare random models on
random labels and mean nothing. Budgets are measured-latency ratios from a width latency table built first
(batch 1, CPU provider); `magnitude` allocates the widths (any importance gives the same widths' latency
profile), Torch-Pruning's MetaPruner (group L1 magnitude, round_to=16) is cut to the MAC ratio our variant
reached. Latency: ONNX Runtime, CPU provider, fresh processes, batch 1 and 8, median and range over processes.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/width_torchvision.py --out benchmarks/width_torchvision.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torchvision
from _common import child_env, write_json
from torch import nn
from tp_baseline import TorchPruningConfig, torch_pruning_spec
from width_resnet20 import summarise

from minreal.app.pipeline import run_pipeline
from minreal.app.settings import PipelineConfig
from minreal.compress.core.data import Dataset
from minreal.compress.core.run_case import RunCase, VariantSpec
from minreal.compress.registry import register
from minreal.export.latency_table import build_width_latency_table
from minreal.runtime_bench import BenchConfig

MULTIPLE = 16  # the CPU provider's width multiple


def _classifier(m: nn.Module) -> list[nn.Module]:
    return [[mod for mod in m.modules() if isinstance(mod, nn.Linear)][-1]]


def _analysis_cost(name: str) -> dict:
    """Wall time and peak resident memory of ``analyse`` on ``name`` at 224×224 (batch 2), in a fresh process."""
    code = (
        "import resource, time, torch, torchvision\n"
        "from minreal.compress.core.width import analyse\n"
        f"m = torchvision.models.{name}().eval()\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "t = time.perf_counter(); wg = analyse(m, torch.randn(2, 3, 224, 224)); s = time.perf_counter() - t\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(s, base, peak, len(wg.groups), len(wg.cuttable()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=child_env(Path(__file__).resolve().parents[1]))
    s, base, peak, groups, cuttable = out.stdout.split()
    return {"seconds": float(s), "peak_rss_mb": int(peak) / 1024, "rss_before_mb": int(base) / 1024,
            "groups": int(groups), "cuttable": int(cuttable)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/width_torchvision.json")
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--ratios", default="0.8,0.6")
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    t_start = time.perf_counter()
    out: dict = {"weights": "random (latency only; accuracy not meaningful)", "cases": {}, "analysis": {}}
    for name in ("resnet50", "vit_b_16"):
        out["analysis"][name] = _analysis_cost(name)
        print(f"analysis {name}: {out['analysis'][name]}", flush=True)
    register(torch_pruning_spec(_classifier, round_to=MULTIPLE, samples=1, steps=8))
    from minreal.compress.methods.magnitude import MagnitudeConfig

    torch.manual_seed(0)
    x = torch.randn(48, 3, 224, 224)
    y = torch.randint(0, 1000, (48,))
    data = Dataset(x[:32], y[:32])
    held_out = Dataset(x[32:], y[32:])
    for name in filter(None, args.models.split(",")):
        model = getattr(torchvision.models, name)().eval()
        with tempfile.TemporaryDirectory() as tmp:
            table = Path(tmp) / "width.json"
            t0 = time.perf_counter()
            build_width_latency_table(model, x[:1], "cpu", MULTIPLE, out_path=table,
                                      progress=lambda m: print(m, flush=True))
            table_s = time.perf_counter() - t0
            runs, refused = [], {}
            from minreal.compress.core.errors import CompressionError
            from minreal.compress.registry import compress
            for r in (float(v) for v in args.ratios.split(",")):
                cfg = MagnitudeConfig(latency_ratio=r, latency_table=str(table), width_multiple=MULTIPLE)
                try:
                    _, rep = compress(model, data, "magnitude", cfg)
                except CompressionError as exc:
                    refused[f"magnitude-{r:g}"] = str(exc)
                    continue
                runs.append(VariantSpec(f"magnitude-{r:g}", "magnitude", cfg))
                runs.append(VariantSpec(f"torch_pruning-mac{rep.mac_ratio:.2f}", "torch_pruning",
                                    TorchPruningConfig(mac_ratio=rep.mac_ratio)))
            case = RunCase(f"{name}@224", model, data, held_out, runs, notes=["random weights: latency only"])
            timing = BenchConfig(batch_sizes=(1, 8), min_seconds=args.min_seconds, repeats=args.repeats)
            cfg = PipelineConfig(bench=timing)
            run_pipeline([case], Path(tmp) / "run", cfg, progress=lambda m: print(m, flush=True))
            doc = json.loads((Path(tmp) / "run" / "report.json").read_text())["cases"][0]
            width_table = json.loads(table.read_text())
        rows = [{k: v for k, v in row.items() if k != "top1"} for row in summarise(doc)]
        out["cases"][name] = {"table_seconds": table_s, "refused": refused, "summary": rows,
                              "width_table_uniform": width_table.get("uniform"), "report": doc}
    out["total_seconds"] = time.perf_counter() - t_start
    write_json(args.out, out, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
