"""Issue 27, item 4: statistics with float32 per-chunk products (float64 accumulation) against float64 products.

For each benchmark model the statistics are computed in both precisions and what the methods *choose* is compared:

- ``factorize``: the rank of every layer at whole-model ``mac_ratio`` 0.9/0.7/0.5/0.3, realised from one prepared
  state per precision (``minreal.compress.registry.prepare``/``realise`` with ``FactorizeConfig(stats_dtype=...)``); the
  relative Frobenius difference of every layer's input moment E[xxᵀ] and the largest difference of its whitened
  spectrum (relative to its top value); and the time of the statistics pass
  (:func:`minreal.compress.core.stats.collect_moments` alone) in each precision, alternated in one process, with the
  spread.
  factorize now takes a layer with fewer outputs than inputs from the o × o Gram of its outputs instead; this
  benchmark still measures the input moment of every layer (``collect_moments`` without ``output_side``), as its
  committed figures were.
- ``cbalanced``: its Gramian products (``Moments.update`` and ``gram_sum``) have no precision option; the benchmark
  times their share of the Gramian pass (float64, as shipped) and reruns the pass with those two functions replaced
  by float32-product versions (float64 centring and accumulation) to see whether the C ranks (the widths it
  chooses, before rounding) would change.
- ``magnitude`` uses no statistics (weight norms only); ``wanda``'s activation norms are elementwise sums of
  squares, not products: both are recorded as not applicable.

Models: ``resnet20_cifar`` trained on digits32 (``benchmarks/trained_models.py``, cached under benchmarks/cache/)
on 1,024 calibration images; the pretrained CIFAR-10 ResNet-32 of ``../shared/data`` on 1,024 JPEG test images
drawn (seed 0) from the first 7,000 (skipped with one line when the folder is missing); the embedded demo's digits
MLP and CNN (trained here, seeded, quick schedule) on their first 1,024 training samples.

Writes benchmarks/stats_precision.json atomically.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/stats_precision.py [--out PATH] [--repeats 5]
    [--threads 2] [--models resnet20-digits32 resnet32-cifar10 digits-mlp digits-cnn] [--go-samples 256]
    [--merge RUN.json ...]  (one document from runs over different models)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from _common import write_json
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.stats import collect_moments
from minreal.compress.core.width import analyse
from minreal.compress.datasets import digits32
from minreal.compress.methods.cbalanced import empirical_gramians, graph_gramians
from minreal.compress.methods.cbalanced.analysis import analyse_states
from minreal.compress.methods.cbalanced.config import CBalancedConfig
from minreal.compress.methods.cbalanced.empirical_gramians import collect_gramians, default_state_points
from minreal.compress.methods.cbalanced.graph_gramians import group_gramians, select_groups
from minreal.compress.methods.cbalanced.realise import is_mlp
from minreal.compress.methods.factorize import FactorizeConfig
from minreal.compress.registry import Prepared, prepare, realise

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).with_suffix(".json")
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/stats_precision.py --out benchmarks/stats_precision.json"
MAC_RATIOS = (0.9, 0.7, 0.5, 0.3)
DTYPES = ("float64", "float32")
SAMPLES, CIFAR_POOL = 1024, 7000
MODELS = ("resnet20-digits32", "resnet32-cifar10", "digits-mlp", "digits-cnn")
_T0 = time.perf_counter()


def say(line: str) -> None:
    """A progress line on stderr, with the seconds since the script started."""
    print(f"[stats_precision {time.perf_counter() - _T0:7.1f} s] {line}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------ models
@dataclass
class Case:
    """A trained model (eval mode) and its calibration data, with a description for the JSON."""

    name: str
    description: str
    model: nn.Module
    data: Dataset


def resnet20_case() -> Case:
    from trained_models import resnet20_digits32

    trained = resnet20_digits32()
    calib, _ = digits32(trained.record.seed)
    return Case("resnet20-digits32", f"resnet20_cifar trained on digits32 (benchmarks/trained_models.py, held-out "
                f"top-1 {trained.record.heldout_top1:.2%}); the first {SAMPLES} calibration images",
                trained.model.eval(), calib.take(SAMPLES))


def resnet32_case() -> Case | None:
    from int8_formats import CIFAR, RESNET32, cifar_inputs, load_resnet32

    if not (RESNET32.is_file() and CIFAR.is_file()):
        print(f"stats_precision: {RESNET32} or {CIFAR} is missing; skipping resnet32-cifar10", flush=True)
        return None
    with np.load(CIFAR) as data:
        images = data["x"]
    pick = np.sort(np.random.default_rng(0).choice(CIFAR_POOL, SAMPLES, replace=False))
    return Case("resnet32-cifar10", f"pretrained CIFAR-10 ResNet-32 (../shared/data, CifarResNet(5)); {SAMPLES} "
                f"JPEG test images drawn (seed 0) from the first {CIFAR_POOL}", load_resnet32(RESNET32),
                Dataset(cifar_inputs(images[pick])))


def demo_case(key: str) -> Case:
    from minreal.app.demo import demo_factories

    case = demo_factories()[key](True)
    return Case(key, f"embedded demo case {key!r} ({type(case.model).__name__}, quick schedule, seeded); the first "
                f"{min(SAMPLES, len(case.train))} training samples", case.model.eval(), case.train.take(SAMPLES))


def build_case(name: str) -> Case | None:
    builders: dict[str, Callable[[], Case | None]] = {
        "resnet20-digits32": resnet20_case, "resnet32-cifar10": resnet32_case,
        "digits-mlp": lambda: demo_case("digits-mlp"), "digits-cnn": lambda: demo_case("digits-cnn")}
    return builders[name]()


# --------------------------------------------------------------------------------------------------- factorize
def spread(values: list[float]) -> dict[str, float]:
    """Median, minimum and maximum."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def factorize_ranks(prep: Prepared, dtype: str) -> dict[str, dict[str, int | None]]:
    """Per ``mac_ratio``: the rank of every factorisation target (None where the layer is kept whole)."""
    out = {}
    for ratio in MAC_RATIOS:
        _, report = realise(prep, FactorizeConfig(mac_ratio=ratio, stats_dtype=dtype))
        out[str(ratio)] = {lr.name: lr.rank for lr in report.layers if lr.name in prep.state.bases}
    return out


def moment_difference(prep: Prepared, repeats: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Relative difference of the moments in the two precisions, and the alternated timing of the pass."""
    model = prep.state.unfused.model
    layers = {t.name: t.layer for t in prep.state.targets}
    cfg = FactorizeConfig()
    seconds: dict[str, list[float]] = {d: [] for d in DTYPES}
    moments: dict[str, dict[str, torch.Tensor]] = {}
    for i in range(repeats):
        for dtype in DTYPES if i % 2 == 0 else DTYPES[::-1]:
            t0 = time.perf_counter()
            stats = collect_moments(model, layers, prep.data, cfg.calib_batch_size, cfg.memory_cap_bytes, dtype)
            seconds[dtype].append(time.perf_counter() - t0)
            moments[dtype] = {n: s.moment for n, s in stats.items()}
    rel = {n: float(torch.linalg.matrix_norm(moments["float32"][n] - m).max()
                    / torch.linalg.matrix_norm(m).max().clamp_min(1e-300)) for n, m in moments["float64"].items()}
    ratios = [a / b for a, b in zip(seconds["float32"], seconds["float64"])]
    timing = {"repeats": repeats, "order": "alternated (float64 first on even repeats)",
              "seconds": {d: spread(v) for d, v in seconds.items()}, "float32_over_float64": spread(ratios)}
    return {"relative_frobenius_by_layer": rel, "max": max(rel.values()), "median": statistics.median(rel.values())}, \
        timing


def spectrum_difference(preps: dict[str, Prepared]) -> dict[str, float]:
    """Per layer: max |σ²₃₂ − σ²₆₄| / σ²₆₄[0] of the whitened spectra that the rank allocator reads."""
    a, b = preps["float64"].state.bases, preps["float32"].state.bases
    return {n: float((b[n].sq_values - a[n].sq_values).abs().max() / a[n].sq_values.max().clamp_min(1e-300))
            for n in a}


def factorize_block(case: Case, repeats: int) -> dict[str, Any]:
    preps = {d: prepare(case.model, case.data, "factorize", FactorizeConfig(mac_ratio=MAC_RATIOS[0], stats_dtype=d))
             for d in DTYPES}
    ranks = {d: factorize_ranks(p, d) for d, p in preps.items()}
    changed = {r: {n: [ranks["float64"][r][n], ranks["float32"][r][n]] for n in ranks["float64"][r]
                   if ranks["float64"][r][n] != ranks["float32"][r][n]} for r in ranks["float64"]}
    moments, timing = moment_difference(preps["float64"], repeats)
    spectra = spectrum_difference(preps)
    return {"targets": len(preps["float64"].state.targets), "ranks_float64": ranks["float64"],
            "changed_ranks": changed, "ranks_changed": any(changed.values()), "moment_difference": moments,
            "spectrum_difference": {"by_layer": spectra, "max": max(spectra.values())},
            "statistics_pass_s": timing,
            "prepare_s": {d: p.seconds for d, p in preps.items()}}


# --------------------------------------------------------------------------------------------------- cbalanced
def _moments_update32(self: empirical_gramians.Moments, x: torch.Tensor) -> None:
    """``Moments.update`` with float32 products of the float64-centred rows, accumulated in float64."""
    for chunk in x.detach().split(1 << 16):
        c = chunk.double()
        if self.shift is None:
            self.shift = c.mean(0)
            self.s1, self.s2 = torch.zeros_like(self.shift), c.new_zeros(c.shape[1], c.shape[1])
        c = c - self.shift
        self.s1 += c.sum(0)
        c32 = c.float()
        self.s2 += (c32.T @ c32).double()
        self.n += len(c)


def _gram_sum32(g: torch.Tensor) -> torch.Tensor:
    """``gram_sum`` with float32 products, accumulated in float64."""
    acc = g.new_zeros(g.shape[1], g.shape[1], dtype=torch.float64)
    for chunk in g.detach().split(1 << 16):
        c = chunk.float()
        acc += (c.T @ c).double()
    return acc


@contextmanager
def gramian_products(dtype: str, clock: dict[str, float]) -> Iterator[None]:
    """The Gramian products of cbalanced in ``dtype`` ("float64" is the library's own), with their time added to
    ``clock["products_s"]``. A measurement device for this benchmark only: the library has no such option."""
    update = empirical_gramians.Moments.update if dtype == "float64" else _moments_update32
    gram = empirical_gramians.gram_sum if dtype == "float64" else _gram_sum32

    def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                clock["products_s"] = clock.get("products_s", 0.0) + time.perf_counter() - t0
        return run

    with mock.patch.object(empirical_gramians.Moments, "update", timed(update)), \
            mock.patch.object(empirical_gramians, "gram_sum", timed(gram)), \
            mock.patch.object(graph_gramians, "gram_sum", timed(gram)):
        yield


def cbalanced_gramians(case: Case, go_samples: int) -> Callable[[], dict[str, Any]]:
    """The Gramian pass cbalanced runs on this model (Sequential MLP or channel groups), with its defaults."""
    cfg = CBalancedConfig()
    if is_mlp(case.model):
        points = default_state_points(case.model)
        return lambda: collect_gramians(case.model, case.data, points, cfg.max_exact_outputs, cfg.probes, go_samples,
                                        seed=cfg.seed)
    wg = analyse(case.model, case.data.x[:2])
    groups = select_groups(wg, cfg.state_points)
    return lambda: group_gramians(wg, groups, case.data, cfg.max_exact_outputs, cfg.probes, go_samples, seed=cfg.seed)


def cbalanced_block(case: Case, go_samples: int) -> dict[str, Any]:
    cfg = CBalancedConfig()
    run = cbalanced_gramians(case, go_samples)
    ranks, gc, seconds, share = {}, {}, {}, {}
    for dtype in DTYPES:
        clock: dict[str, float] = {}
        t0 = time.perf_counter()
        with gramian_products(dtype, clock):
            grams = run()
        seconds[dtype] = time.perf_counter() - t0
        share[dtype] = clock.get("products_s", 0.0) / seconds[dtype]
        analyses = analyse_states(grams, cfg.energy_eps, cfg.state_budget)
        ranks[dtype] = {n: a.rank_c for n, a in analyses.items()}
        gc[dtype] = {n: (g.gc, g.go) for n, g in grams.items()}
    rel = {n: max(float((gc["float32"][n][k] - gc["float64"][n][k]).norm() / gc["float64"][n][k].norm()
                        .clamp_min(1e-300)) for k in (0, 1)) for n in gc["float64"]}
    changed = {n: [ranks["float64"][n], ranks["float32"][n]] for n in ranks["float64"]
               if ranks["float64"][n] != ranks["float32"][n]}
    return {"state_points": len(ranks["float64"]), "go_samples": min(go_samples, len(case.data)),
            "energy_eps": cfg.energy_eps, "c_ranks_float64": ranks["float64"], "changed_c_ranks": changed,
            "ranks_changed": bool(changed), "gramian_relative_difference_max": max(rel.values()),
            "gramian_pass_s": seconds, "products_share_of_pass": share}


# ------------------------------------------------------------------------------------------------------- main
def header(threads: int) -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "uncommitted": git("status", "--porcelain").splitlines(),
            "torch": torch.__version__, "threads": threads, "cpus": os.cpu_count(),
            "machine": platform.processor() or platform.machine(), "load_avg_1min": os.getloadavg()[0],
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


NOT_APPLICABLE = {
    "magnitude": "no statistics: L1 norms of weight rows only",
    "wanda": "activation norms are elementwise sums of squares (value.double().pow(2).sum), not chunked products; "
             "the forward pass dominates their cost",
    "svd": "no statistics", "fde": "float64 forward passes of the folded chain, not chunked products",
}


def decide(models: dict[str, Any]) -> dict[str, Any]:
    """The default per method: float32 products where no model changed a choice, else float64."""
    fact = [m["factorize"]["ranks_changed"] for m in models.values()]
    cb = [m["cbalanced"]["ranks_changed"] for m in models.values() if "cbalanced" in m]
    shares = [m["cbalanced"]["products_share_of_pass"]["float64"] for m in models.values() if "cbalanced" in m]
    return {"factorize_stats_dtype": "float32" if not any(fact) else "float64",
            "factorize_reason": "no rank changed on any model at any mac_ratio" if not any(fact)
            else "a rank changed: float64 kept",
            "cbalanced": f"C ranks changed on {sum(cb)} of {len(cb)} models with float32 products; the products "
                         f"take {max(shares, default=0):.1%} of the Gramian pass at most (forward and backward passes "
                         "dominate), so float32 products would save little: float64 kept, no option added",
            "not_applicable": NOT_APPLICABLE}


def merge(paths: list[Path], out: Path) -> None:
    """One document from runs over different models (each keeps its header), with the decision over all."""
    docs = [json.loads(p.read_text()) for p in paths]
    models = {k: v for d in docs for k, v in d["models"].items()}
    write_json(out, {"usage": USAGE, "runs": [{"models": list(d["models"]), "header": d["header"],
                                              "repeats": d.get("repeats"), "total_s": d.get("total_s")} for d in docs],
                     "mac_ratios": list(MAC_RATIOS), "samples": SAMPLES, "models": models,
                     "decision": decide({k: v for k, v in models.items() if "factorize" in v})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--go-samples", type=int, default=256, help="observability-Gramian samples of cbalanced")
    ap.add_argument("--no-cbalanced", action="store_true")
    ap.add_argument("--merge", type=Path, nargs="+", help="combine finished runs (JSON files) into --out, no measuring")
    args = ap.parse_args()
    if args.merge:
        merge(args.merge, args.out)
        return
    torch.set_num_threads(args.threads)
    doc: dict[str, Any] = {"usage": USAGE, "header": header(args.threads), "repeats": args.repeats,
                           "mac_ratios": list(MAC_RATIOS), "samples": SAMPLES, "models": {}}
    for name in args.models:
        case = build_case(name)
        if case is None:
            doc["models"][name] = {"skipped": "../shared/data is missing"}
            continue
        say(f"{name}: factorize")
        entry: dict[str, Any] = {"description": case.description, "factorize": factorize_block(case, args.repeats)}
        if not args.no_cbalanced:
            say(f"{name}: cbalanced Gramians")
            entry["cbalanced"] = cbalanced_block(case, args.go_samples)
        doc["models"][name] = entry
        say(f"{name}: factorize ranks changed {entry['factorize']['ranks_changed']}, moment rel. diff max "
            f"{entry['factorize']['moment_difference']['max']:.2e}, f32/f64 time "
            f"{entry['factorize']['statistics_pass_s']['float32_over_float64']['median']:.2f}")
        write_json(args.out, doc)
    doc["decision"] = decide({k: v for k, v in doc["models"].items() if "factorize" in v})
    doc["total_s"] = time.perf_counter() - _T0
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
