"""How many calibration samples the statistics need (issue 27: `tune --stats-samples`, default 1,024).

The pretrained CIFAR-10 ResNet-32 of ``../shared/data`` on real CIFAR-10 images (the first 7,000 for calibration,
the last 2,000 held out, as ``benchmarks/tune.py`` splits them): factorize is prepared on seeded subsamples of
1,024, 2,048 and all 7,000 calibration images (the tune's own draw, ``minreal.app.tune.candidate.first_of_shuffle``),
then realised at MAC ratios 0.9/0.7/0.5/0.3. Recorded per sample count: the time of ``prepare``, each layer's rank
at each ratio, and the zero-shot held-out top-1 of each realised model (what the tune's bisection decides on). Ranks
and accuracies that agree across sample counts back the default; the prepare times are its price.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/stats_samples.py --out benchmarks/stats_samples.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/stats_samples.py --out benchmarks/stats_samples.json"
COUNTS = (1024, 2048, 7000)
RATIOS = (0.9, 0.7, 0.5, 0.3)


def main() -> None:
    import numpy as np
    from _common import write_json
    from tune import cifar_resnet32, resnet32_case

    from minreal.app.tune.candidate import first_of_shuffle
    from minreal.compress.core.data import Dataset
    from minreal.compress.core.recover import held_out_metrics
    from minreal.compress.methods.factorize import FactorizeConfig
    from minreal.compress.registry import prepare, realise

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/stats_samples.json"))
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-tune")
    args = ap.parse_args()
    case = resnet32_case(args.work)  # writes the split .npz files and weights once (shared with benchmarks/tune.py)
    model = cifar_resnet32()
    model.load_state_dict(torch.load(case.weights, weights_only=True))
    model.eval()
    with np.load(case.data) as d:
        calib = Dataset(torch.from_numpy(d["x"]), torch.from_numpy(d["y"]))
    with np.load(case.eval_data) as d:
        held = Dataset(torch.from_numpy(d["x"]), torch.from_numpy(d["y"]))
    teacher = None
    rows = {}
    for count in COUNTS:
        data = first_of_shuffle(calib, count)
        t0 = time.perf_counter()
        prep = prepare(model, data, "factorize", FactorizeConfig(mac_ratio=RATIOS[0]))
        seconds = time.perf_counter() - t0
        per = {}
        for ratio in RATIOS:
            small, report = realise(prep, FactorizeConfig(mac_ratio=ratio), measure=False)
            metrics = held_out_metrics(model, small, held, teacher_outputs=teacher)
            per[str(ratio)] = {"mac_ratio": round(report.mac_ratio, 4),
                               "ranks": {lay.name: lay.rank for lay in report.layers if lay.rank is not None},
                               "heldout_top1": round(100 * metrics["accuracy"], 2)}
        rows[str(count)] = {"prepare_s": round(seconds, 1), "budgets": per}
        print(f"[stats_samples] {count} images: prepare {seconds:.1f} s; top-1 "
              + ", ".join(f"{r}: {per[str(r)]['heldout_top1']}" for r in RATIOS), file=sys.stderr, flush=True)
    full = rows[str(COUNTS[-1])]["budgets"]
    agreement = {str(c): {str(r): {"same_ranks": rows[str(c)]["budgets"][str(r)]["ranks"] == full[str(r)]["ranks"],
                                   "top1_minus_full_pp": round(rows[str(c)]["budgets"][str(r)]["heldout_top1"]
                                                               - full[str(r)]["heldout_top1"], 2)}
                          for r in RATIOS} for c in COUNTS[:-1]}
    write_json(args.out, {"usage": USAGE, "issue": 27, "model": case.describe, "threads": torch.get_num_threads(),
                          "counts": list(COUNTS), "ratios": list(RATIOS), "results": rows,
                          "against_all_7000": agreement})
    print(f"[stats_samples] wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
