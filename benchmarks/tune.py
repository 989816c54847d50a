"""Benchmark of `minreal tune` (issues 14, 27): the front and the winner per model and accuracy budget, and what the
tune itself costs, by phase.

Models (``--only``, default ``resnet20,resnet32``):
- ``resnet20``: the CIFAR ResNet-20 trained on ``digits32`` (``trained_models.resnet20_digits32``), 0.5 pp, recovery
  cap 1 epoch; goal 5 minutes on 2 idle cores;
- ``resnet32``: the pretrained CIFAR-10 ResNet-32 of ``../shared/data`` on real CIFAR-10 images (the first 7,000
  for calibration and recovery, the last 2,000 held out), 1 pp, recovery cap 3 epochs; goal 15 minutes. Without
  ``../shared/data`` it stops with one line;
- ``mlp``, ``cnn``: ``minreal demo``'s digits models (0.5 and 2 pp, 1 epoch), trained once and kept in the work folder.
One tune runs exactly as ``minreal tune --workers 1`` runs it: the inputs as specs
(:class:`~minreal.app.tune.SpecSource`) loaded again in one worker process, every method with a MAC budget over the
default grid, bisected without recovery, the budgets below each zero-shot boundary raced with recovery by successive
halving (and quantisation-aware recovery for the INT8 of the winners), the default screening (0.25 s, 1 process) and
release protocols (2 s, 3 fresh processes), on the CPU at batch sizes 1 and 32.

The tune chooses on its first batch size (1); the batch-32 winner is chosen here by the tune's own rule (its
``_choose``: the lowest confirmed p50, but a structural win that does not hold in every confirmation process
against a baseline is a tie, which goes to the baseline) over the same confirmed measurements (every file on either
cell's front and the baselines is confirmed at both batch sizes), so one tune gives both; ``fastest`` is the lowest
confirmed p50 per cell without the tie rule (:func:`minreal.app.tune.front.choose`). The first drop of each model
starts from an empty candidate cache (its wall time is the cold one, against the goal); a second drop reuses that
cache. ``phases_s`` is the tune's own wall-time breakdown (``TuneReport.phases_s``: prepare, realise, recover,
measure, export summed over candidates; baselines, search, ort_quality, screen, confirm as wall time).
The load average at the start and end of every run is recorded: run it alone.

The JSON is rewritten atomically after every run; ``--resume`` skips runs it already holds. Tune folders (report,
front.png, ONNX files) and caches go to ``--work`` (ignored by git); the ResNet fronts are copied next to the
JSON. ``--refresh`` re-derives the winners and tables of the runs already in the JSON from their tune folders'
``report.json`` without tuning again. ``--quick`` is a smoke test (one method, two ratios, short protocols) and
needs its own ``--out``.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/tune.py --out benchmarks/tune.json
The cell behind tune's default recovery cap (0): the same models at caps 0 and 1 into one JSON,
    for cap in 0 1; do OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/tune.py --only mlp,cnn,resnet20 \
        --recover-epochs $cap --resume --out benchmarks/tune_recovery_cap.json; done
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from minreal.compress.models import mlp, small_cnn

THIS = Path(__file__).resolve()
ROOT = THIS.parents[1]
DROPS = (0.5, 2.0)
BATCHES = (1, 32)
PROVIDER = "cpu"
RECOVER_EPOCHS = 1
GOAL_S = 15 * 60
USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/tune.py --out benchmarks/tune.json"
STAGES = (("ort_quality", "[tune] measuring"), ("screen", "[tune] screening"), ("confirm", "[tune] confirming"))
"""Stages the progress lines mark: a stage starts at the last line that starts with its text (runs of 2026-12-04
measured the baselines' quality for the race's structure screen with the same words, inside the search; the tune
now words that line differently, so the first and the last agree)."""


# -------------------------------------------------------------------------- factories (workers load them by path)
def digits_mlp() -> nn.Module:
    """The demo's digits MLP architecture (weights come from ``--weights``)."""
    return mlp(64, [128, 128], 10)


def digits_cnn() -> nn.Module:
    """The demo's digits CNN architecture (weights come from ``--weights``)."""
    return small_cnn(1, (32, 64, 64), 10)


def ssm_digits() -> nn.Module:
    """The ``ssm`` method's demo model architecture: an SSMClassifier on sequential digits (64 steps of 1 pixel, 10
    classes) of the demo's training spec (weights come from ``--weights``)."""
    from minreal.compress.methods.ssm import SSMClassifier, SSMTrainSpec

    spec = SSMTrainSpec()
    return SSMClassifier(1, spec.features, spec.state, spec.depth, 10)


# ---------------------------------------------------------------------------------------------- models and data
@dataclass(frozen=True)
class Case:
    """A model to tune, as the specs a worker loads again (``minreal tune MODEL --weights W --data DATA``)."""

    name: str
    model: str
    weights: str
    data: str
    describe: str
    eval_data: str | None = None
    drops: tuple[float, ...] = DROPS
    recover_epochs: int = RECOVER_EPOCHS
    goal_s: float = GOAL_S


def _demo_weights(key: str, work: Path, prepare: bool = True) -> Path:
    """The demo model ``key`` trained as ``minreal demo`` trains it, saved once under ``work`` and reused (without
    ``prepare``, only its path)."""
    path = work / f"{key}.pt"
    if prepare and not path.is_file():
        from minreal.app.demo import demo_factories
        from minreal.runtime_bench.atomic import atomic_path

        work.mkdir(parents=True, exist_ok=True)
        model = demo_factories()[key](True).model
        with atomic_path(path) as tmp:
            torch.save(model.state_dict(), tmp)
    return path


def mlp_case(work: Path, prepare: bool = True) -> Case:
    return Case("mlp", f"{THIS}:digits_mlp", str(_demo_weights("digits-mlp", work, prepare)), "digits-flat",
                "minreal demo's digits-mlp: mlp(64, [128, 128], 10) on flat 8x8 digits, trained as the demo (12 ep.)")


def cnn_case(work: Path) -> Case:
    return Case("cnn", f"{THIS}:digits_cnn", str(_demo_weights("digits-cnn", work)), "digits",
                "minreal demo's digits-cnn: small_cnn(1, (32, 64, 64), 10) on 8x8 digits, trained as the demo (12 ep.)")


def resnet20_case(work: Path) -> Case:
    from trained_models import cache_paths, resnet20_digits32  # benchmarks/ is on sys.path only in the main process

    r = resnet20_digits32().record
    return Case("resnet20", "resnet20_cifar", str(cache_paths(r.seed, r.epochs)[0]), "digits32",
                f"resnet20_cifar (option A) trained {r.epochs} epochs on digits32's calibration split (held-out "
                f"top-1 {100 * r.heldout_top1:.2f} %)", drops=(0.5,), goal_s=5 * 60)


def cifar_resnet32() -> nn.Module:
    """The pretrained CIFAR-10 ResNet-32's architecture (weights come from ``--weights``)."""
    from minreal.compress.models import CifarResNet

    return CifarResNet(blocks_per_stage=5)


def cifar_resnet44() -> nn.Module:
    """The pretrained CIFAR-10 ResNet-44's architecture (weights come from ``--weights``)."""
    from minreal.compress.models import CifarResNet

    return CifarResNet(blocks_per_stage=7)


SHARED = ROOT.parent / "shared" / "data"
PRETRAINED: dict[str, tuple[Path, Callable[[], nn.Module]]] = {
    "resnet32": (SHARED / "resnet_cifar" / "resnet32-d509ac18.th", cifar_resnet32),
    "resnet44": (SHARED / "resnet_cifar" / "resnet44-014dd654.th", cifar_resnet44)}
"""The pretrained CIFAR-10 ResNets of ../shared/data by case name: checkpoint and architecture."""
RESNET32 = PRETRAINED["resnet32"][0]
CIFAR = SHARED / "cifar10" / "cifar10_test_jpeg_1000_9999.npz"
CIFAR_CALIB, CIFAR_HELDOUT = 7000, 2000
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # as the pretrained ResNets were trained


def resnet32_case(work: Path, prepare: bool = True) -> Case:
    """The pretrained CIFAR-10 ResNet-32 on real CIFAR-10 images (:func:`pretrained_cifar_case`)."""
    return pretrained_cifar_case("resnet32", work, prepare)


def pretrained_cifar_case(name: str, work: Path, prepare: bool = True) -> Case:
    """A pretrained CIFAR-10 ResNet of :data:`PRETRAINED` (../shared/data, akamaster's weights, keys without
    ``module.``) on real CIFAR-10 test images: the first 7,000 for calibration and recovery, the last 2,000 held
    out, as ``.npz`` files (float32 NCHW normalised with the ImageNet statistics, labels) written once under ``work``
    and shared by the ResNets (without ``prepare``, only named)."""
    checkpoint, factory = PRETRAINED[name]
    if prepare and not (checkpoint.is_file() and CIFAR.is_file()):
        raise SystemExit(f"tune benchmark: {checkpoint} or {CIFAR} is missing (../shared/data); run --only without "
                         f"{name}")
    weights, calib, held = work / f"{name}.pt", work / "cifar_calib7000.npz", work / "cifar_heldout2000.npz"
    if prepare and not weights.is_file():
        _write_pretrained(checkpoint, factory(), weights)
    if prepare and not (calib.is_file() and held.is_file()):
        _write_cifar_split(calib, held)
    return Case(name, f"{THIS}:{factory.__name__}", str(weights), str(calib),
                f"pretrained CIFAR-10 ResNet-{name.removeprefix('resnet')} (akamaster, option-A shortcuts; "
                "../shared/data) on CIFAR-10 test images decoded from JPEG: the first "
                f"{CIFAR_CALIB} for calibration and recovery, the last {CIFAR_HELDOUT} held out", eval_data=str(held),
                drops=(1.0,), recover_epochs=3)


def _write_pretrained(checkpoint: Path, model: nn.Module, weights: Path) -> None:
    """akamaster's checkpoint as a plain state dict of ``model`` (``module.`` prefixes dropped)."""
    from minreal.runtime_bench.atomic import atomic_path

    weights.parent.mkdir(parents=True, exist_ok=True)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()}, strict=False)
    with atomic_path(weights) as tmp:
        torch.save(model.state_dict(), tmp)


def _write_cifar_split(calib: Path, held: Path) -> None:
    """The first :data:`CIFAR_CALIB` and the last :data:`CIFAR_HELDOUT` images of :data:`CIFAR` as ``.npz``."""
    import numpy as np

    from minreal.runtime_bench.atomic import atomic_path

    calib.parent.mkdir(parents=True, exist_ok=True)
    with np.load(CIFAR) as data:
        images, labels = data["x"], data["y"]
    mean = np.asarray(IMAGENET_MEAN, np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(IMAGENET_STD, np.float32).reshape(1, 3, 1, 1)
    x = ((images.transpose(0, 3, 1, 2).astype(np.float32) / 255 - mean) / std).astype(np.float32)
    for path, rows in ((calib, slice(0, CIFAR_CALIB)), (held, slice(len(x) - CIFAR_HELDOUT, len(x)))):
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, x=x[rows], y=labels[rows].astype(np.int64))


CASES: dict[str, Callable[[Path], Case]] = {"mlp": mlp_case, "cnn": cnn_case, "resnet20": resnet20_case,
                                            "resnet32": resnet32_case}


# ------------------------------------------------------------------------------------------------- configuration
def tune_config(drop: float, quick: bool, recover_epochs: int = RECOVER_EPOCHS) -> Any:
    from minreal.app.tune import Constraint, Protocol, TuneConfig
    from minreal.runtime_bench import BenchConfig

    cfg = TuneConfig(Constraint(max_accuracy_drop=drop), BenchConfig(providers=(PROVIDER,), batch_sizes=BATCHES),
                     recover_epochs=recover_epochs)
    if not quick:
        return cfg
    return dataclasses.replace(cfg, methods=("svd",), grid=(0.8, 0.5), screen=Protocol(0.05, 1, 5, 2)).with_bench(
        min_seconds=0.1, repeats=1, min_runs=5, warmup=2)


def cli_line(case: Case, drop: float, cache: Path, cfg: Any, workers: int = 1) -> str:
    """The `minreal tune` command that runs the same tune."""
    line = (f"minreal tune {case.model} --weights {case.weights} --data {case.data}"
            f"{f' --eval-data {case.eval_data}' if case.eval_data else ''} --batch "
            f"{','.join(map(str, BATCHES))} --max-accuracy-drop {drop:g} --recover-epochs-max {case.recover_epochs} "
            f"--cache-dir {cache} --workers {workers}")
    if cfg.methods:
        line += (f" {' '.join(f'-m {m}' for m in cfg.methods)} --grid {','.join(f'{g:g}' for g in cfg.grid)} "
                 f"--screen-seconds {cfg.screen.min_seconds:g} --min-seconds {cfg.confirm.min_seconds:g} "
                 f"--repeats {cfg.confirm.repeats}")
    return line


# ---------------------------------------------------------------------------------------------------- progress
class StageClock:
    """Forwards the tune's progress to stderr (one line per step) and timestamps its stages; the accuracy-controlled
    baseline, which the tune does not announce the end of, is timed by wrapping its function while the clock runs."""

    def __init__(self, prefix: str, log_path: Path) -> None:
        self.prefix, self.t0, self.marks = prefix, time.perf_counter(), {}
        self.log = log_path.open("w")

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, line: str) -> None:
        t = self.now()
        for stage, start in STAGES:
            if line.startswith(start):
                self.marks[stage] = t
        self.log.write(f"{t:8.1f} {line}\n")
        self.log.flush()
        print(f"{self.prefix} {t:6.0f}s {line}", file=sys.stderr, flush=True)

    @contextmanager
    def timing_accuracy_control(self) -> Iterator[None]:
        """Marks ``accuracy_control`` and ``search`` (which starts when it returns) around the tune's call."""
        import minreal.export.accuracy_control as ac

        original = ac.quantize_with_accuracy_control

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.marks["accuracy_control"] = self.now()
            try:
                return original(*args, **kwargs)
            finally:
                self.marks["search"] = self.now()

        ac.quantize_with_accuracy_control = timed
        try:
            yield
        finally:
            ac.quantize_with_accuracy_control = original

    def stages(self, end: float) -> dict[str, float]:
        """Seconds per stage: baselines, accuracy_control, search (with QAT), ort_quality, screen, confirm."""
        names = ["baselines", "accuracy_control", "search", *(s for s, _ in STAGES)]
        times = [0.0, *(self.marks.get(n) for n in names[1:]), end]
        known = [(n, t) for n, t in zip(names, times) if t is not None] + [("end", end)]
        return {n: round(b - a, 1) for (n, a), (_, b) in zip(known, known[1:])}

    def close(self) -> None:
        self.log.close()


def say(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------- records
def _row(c: Any, cells: list[str]) -> dict[str, Any]:
    """One deployable file: what it is, its ONNX Runtime quality and its p50 per cell (screen and confirm)."""
    acc = c.quality.get("accuracy")
    return {"label": c.label, "kind": c.kind, "precision": c.precision, "method": c.method,
            "mac_ratio": round(c.mac_ratio, 4), "recover_epochs": c.recover_epochs, "kb": round(c.onnx_bytes / 1024, 1),
            "accuracy": None if acc is None else round(100 * acc, 2), "loss_pp": _r(c.loss, 3),
            "feasible": c.feasible, "screen_p50_ms": {k: _r(c.screen_ms.get(k), 4) for k in cells},
            "confirm_p50_ms": {k: _r(c.confirm_ms.get(k), 4) for k in cells if k in c.confirm_ms},
            "confirm_range_ms": {k: [_r(v, 4) for v in c.confirm_range_ms[k]] for k in cells
                                 if k in getattr(c, "confirm_range_ms", {})}}


def _r(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def tune_choice(report: Any, cell: str, cfg: Any) -> tuple[str | None, str]:
    """The tune's own choice and verdict on ``cell`` from its confirmed latencies, tie rule included (a structural
    win that does not hold in every confirmation process against a baseline goes to the baseline): the tune's
    :func:`minreal.app.tune.choice.choose_candidate`, called here so that the rule has one definition."""
    from minreal.app.tune.choice import choose_candidate

    confirmed = [c for c in report.candidates if cell in c.confirm_ms]
    chosen, verdict = choose_candidate(confirmed, report.candidates, cell, cfg, [])
    return None if chosen is None else chosen.label, verdict


def fastest(report: Any, cell: str, constraint: Any) -> str | None:
    """The feasible file with the lowest confirmed p50 on ``cell`` (no tie rule)."""
    from minreal.app.tune import Point, Quality, choose

    points = []
    for c in report.candidates:
        score = constraint.score(Quality.from_metrics(c.quality))
        if cell in c.confirm_ms and score is not None:
            points.append(Point(c.label, c.confirm_ms[cell], score, c.onnx_bytes, c.feasible))
    best = choose(points, "latency")
    return None if best is None else best.label


def winner_record(rows: dict[str, dict[str, Any]], label: str | None, cell: str) -> dict[str, Any]:
    """The winner on ``cell`` with its confirmed p50 against the original in INT8 and fp32 on the same cell."""
    if label is None:
        return {"label": None}
    w, out = rows[label], {"label": label}
    ms = w["confirm_p50_ms"].get(cell)
    out.update(accuracy=w["accuracy"], loss_pp=w["loss_pp"], p50_ms=ms, kb=w["kb"])
    for base in ("original.int8", "original"):
        b_ms = rows.get(base, {}).get("confirm_p50_ms", {}).get(cell)
        out[f"x_of_{base}"] = None if not (ms and b_ms) else round(ms / b_ms, 3)
    return out


def funnel(counts: dict[str, int], rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many candidates reached each stage: torch probes → exported files → timed (screen) → confirmed."""
    structural = [r for r in rows if r["kind"] == "structural"]
    return {"torch_probes": counts["evaluated"], "torch_refused": counts["refused"],
            "torch_missed_constraint": counts["evaluated"] - counts["refused"] - counts["feasible_in_torch"],
            "structural_files": len(structural),
            "structural_missed_in_ort": sum(not r["feasible"] for r in structural),
            "structural_screened": sum(r["feasible"] for r in structural),
            "structural_confirmed": sum(bool(r["confirm_p50_ms"]) for r in structural),
            "baselines_timed": len(rows) - len(structural)}


def candidate_seconds(cache: Path, since: float) -> dict[str, float]:
    """Seconds spent compressing, recovering and exporting the candidates evaluated (not cached) in this run."""
    import json

    total = {"compress": 0.0, "recover": 0.0, "export": 0.0}
    for path in cache.glob("*/result.json"):
        if path.stat().st_mtime >= since:
            for k, v in json.loads(path.read_text()).get("seconds", {}).items():
                total[k] = total.get(k, 0.0) + v
    return {k: round(v, 1) for k, v in total.items()}


def searches(report: Any) -> list[dict[str, Any]]:
    return [{"method": s["method"], "recover_epochs": s["recover_epochs"], "smallest_feasible": s["smallest_feasible"],
             "monotone": s["monotone"], "abandoned": s["abandoned"],
             "probes": [[p["budget"], p["ok"], _r(p["score"], 4)] for p in s["probes"]]} for s in report.searches]


def winners(report: Any, cfg: Any, rows: dict[str, dict[str, Any]], cells: list[str]) -> dict[str, Any]:
    """Per cell: the tune's choice with its verdict (``winner``) and the lowest confirmed p50 (``fastest``)."""
    out: dict[str, Any] = {"winner": {}, "fastest": {}}
    for cell in cells:
        label, verdict = tune_choice(report, cell, cfg)
        out["winner"][cell] = winner_record(rows, label, cell) | {"verdict": verdict}
        out["fastest"][cell] = winner_record(rows, fastest(report, cell, cfg.constraint), cell)
    return out


def derived(report: Any, cfg: Any) -> dict[str, Any]:
    """Everything a run record takes from the tune's report (re-derivable from its ``report.json``)."""
    cells = [f"{PROVIDER}/b{b}" for b in BATCHES]
    rows = {c.label: _row(c, cells) for c in report.candidates}
    fronts = {cell: [{k: rows[lb][k] for k in ("label", "accuracy", "loss_pp")} |
                     {"screen_p50_ms": rows[lb]["screen_p50_ms"][cell],
                      "confirm_p50_ms": rows[lb]["confirm_p50_ms"].get(cell)} for lb in labels]
              for cell, labels in report.front.items()}
    found = winners(report, cfg, rows, cells)
    return {"wall_s_in_report": round(report.wall_s, 1),
            "reference_torch_accuracy": _r(100 * (report.reference["torch"]["accuracy"] or 0), 2),
            "counts": report.counts, "funnel": funnel(report.counts, list(rows.values())),
            "baselines": {lb: rows[lb] for lb in ("original", "original.int8", "original.int8-ac") if lb in rows},
            "front": fronts, "chosen": report.chosen,
            "chosen_matches_b1_winner": report.chosen == found["winner"][cells[0]]["label"], **found,
            "verdict": report.verdict, "notes": report.notes, "searches": searches(report),
            "candidates": list(rows.values())}


def load_report(folder: Path) -> Any:
    """The :class:`~minreal.app.tune.TuneReport` a tune wrote to ``folder/report.json``."""
    import json

    from minreal.app.tune import Candidate, TuneReport

    data = json.loads((folder / "report.json").read_text())
    data["candidates"] = [Candidate(**c) for c in data["candidates"]]
    return TuneReport(**data)


def restaged(run: dict[str, Any]) -> dict[str, float]:
    """``run``'s ``stage_s`` again, the log-marked stages (:data:`STAGES`) read from its folder's ``progress.log`` and
    the others (baselines, accuracy control, the start of the search) kept from the record (for records whose
    clock marked a stage at its first line rather than its last); the record's own when there is no log."""
    log, old = Path(run["folder"]) / "progress.log", run.get("stage_s") or {}
    if not log.is_file() or "wall_s" not in run:
        return old
    marks: dict[str, float] = {}
    for line in log.read_text().splitlines():
        t, _, text = line.strip().partition(" ")
        for stage, start in STAGES:
            if text.startswith(start):
                marks[stage] = float(t)
    head = [n for n in ("baselines", "accuracy_control", "search") if n in old]
    times = [sum(old[m] for m in head[:i]) for i in range(len(head))]
    known = [*zip(head, times), *sorted(marks.items(), key=lambda kv: kv[1]), ("end", run["wall_s"])]
    return {n: round(b - a, 1) for (n, a), (_, b) in zip(known, known[1:])}


def refresh(doc: dict[str, Any], quick: bool) -> None:
    """Re-derive every finished run's record from its tune folder's ``report.json`` (measurements untouched) and
    its ``stage_s`` from its ``progress.log`` (:func:`restaged`)."""
    fresh = new_document(quick)
    doc["method"], doc["summary_legend"] = fresh["method"], fresh["summary_legend"]
    for key, run in doc["runs"].items():
        if "error" not in run:
            cfg = tune_config(run["max_accuracy_drop_pp"], quick, run.get("recover_epochs", RECOVER_EPOCHS))
            run.update(derived(load_report(Path(run["folder"])), cfg))
            run["stage_s"] = restaged(run)
            say(f"{key}: re-derived from {run['folder']}/report.json")


# --------------------------------------------------------------------------------------------------------- runs
def run_one(case: Case, drop: float, work: Path, quick: bool, workers: int = 1, suffix: str = "") -> dict[str, Any]:
    """One tune of ``case`` under ``drop``; its folder under ``work`` is rewritten, its cache shared per model (and
    ``suffix``: ``_capN`` for a ``--recover-epochs`` override, which gets its own folders and cache)."""
    from _common import cpu_share, cpu_times  # benchmarks/ is on sys.path when this file runs as a script

    from minreal.app.data import load_data
    from minreal.app.models import checked_dataset, load_model, packed_model
    from minreal.app.tune import ProcessExecutor, SpecSource, tune
    from minreal.app.tune.output import write_tune_dir

    tag = ("" if workers == 1 else f"_workers{workers}") + suffix
    folder, cache = work / f"{case.name}_drop{drop:g}{tag}", work / "cache" / f"{case.name}{tag}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cached_before = len(list(cache.glob("*/result.json")))
    cfg = tune_config(drop, quick, case.recover_epochs)
    net = load_model(case.model, weights=case.weights)
    loaded = load_data(case.data, eval_spec=case.eval_data)
    net = packed_model(net, loaded.calib.x, case.model)  # as the CLI and the workers: named inputs in forward order
    calib = checked_dataset(net, loaded.calib, case.model, case.data)
    held = None if loaded.evaluation is None else checked_dataset(net, loaded.evaluation, case.model,
                                                                  case.eval_data or case.data)
    source = SpecSource(case.model, case.data, case.eval_data, case.weights)
    clock = StageClock(f"[{case.name} {drop:g}pp]", folder / "progress.log")
    load_start, started, cpu_start = os.getloadavg(), time.time(), cpu_times()
    cfg = dataclasses.replace(cfg, workers=workers)
    executor = ProcessExecutor(workers)
    try:
        with clock.timing_accuracy_control():
            report = tune(net, calib, held, cfg, folder, cache, source, executor, clock)
    finally:
        executor.close()
        clock.close()
    wall = time.perf_counter() - clock.t0
    write_tune_dir(report, folder)
    stages = clock.stages(wall)
    timing = {"wall_s": round(wall, 1), "wall_min": round(wall / 60, 2),
              "cache": "cold (empty cache directory)" if cached_before == 0 else
                       f"warm ({cached_before} cached candidates of the model's earlier tune)",
              "candidate_seconds": candidate_seconds(cache, started), "loadavg_start": list(load_start),
              "loadavg_end": list(os.getloadavg()), "cpu_share": cpu_share(cpu_start, cpu_times()),
              "cli": cli_line(case, drop, cache, cfg, workers),
              "folder": str(folder), "workers": workers}
    timing["goal_s"] = case.goal_s
    timing["within_goal"] = wall <= case.goal_s
    return {"model": case.name, "max_accuracy_drop_pp": drop, "recover_epochs": case.recover_epochs, **timing,
            "stage_s": stages, "phases_s": report.phases_s, "halving": report.halving, **derived(report, cfg)}


def run_model(doc: dict[str, Any], name: str, args: argparse.Namespace, save: Callable[[], None]) -> None:
    """Both drops of one model; the first that has to run with an empty cache starts from a fresh cache folder."""
    case = CASES[name](args.work)
    cap = "" if args.recover_epochs is None else f"/cap{args.recover_epochs}"
    if cap:  # every run of the model at this recovery cap, keyed and cached apart from the model's own cap
        case = dataclasses.replace(case, recover_epochs=args.recover_epochs)
    doc["models"][name + cap] = dataclasses.asdict(case)
    tag = ("" if args.workers == 1 else f"/workers{args.workers}") + cap
    for i, drop in enumerate(case.drops):
        key = f"{name}/drop{drop:g}{tag}"
        if args.resume and key in doc["runs"] and "error" not in doc["runs"][key]:
            say(f"{key}: in the JSON already, skipped (--resume)")
            continue
        if i == 0:
            shutil.rmtree(args.work / "cache" / (name + tag.replace("/", "_")), ignore_errors=True)
        say(f"{key}: tuning ({case.model}, data {case.data}), load {os.getloadavg()[0]:.1f}")
        try:
            doc["runs"][key] = run_one(case, drop, args.work, args.quick, args.workers, cap.replace("/", "_"))
        except Exception as exc:  # one failed run must not cost the others
            doc["runs"][key] = {"model": name, "max_accuracy_drop_pp": drop,
                                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        say(f"{key}: {summary_line(doc['runs'][key])}")
        copy_front(doc["runs"][key], args.out)
        save()


def summary_line(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"FAILED: {run['error']}"
    wins = ", ".join(f"{cell} {w['label']} ({w.get('x_of_original.int8')}x of INT8)"
                     for cell, w in run["winner"].items())
    return f"{run['wall_s']:.0f} s ({run['cache'].split()[0]}); winners {wins}; counts {run['counts']}"


def copy_front(run: dict[str, Any], out: Path) -> None:
    """The ResNet fronts next to the JSON (``<out stem>_<model>_drop<D>_front.png``)."""
    if run.get("model") not in ("resnet20", "resnet32") or "folder" not in run or run.get("workers", 1) != 1:
        return
    src = Path(run["folder"]) / "front.png"
    if src.is_file():
        shutil.copyfile(src, out.with_name(f"{out.stem}_{run['model']}_drop{run['max_accuracy_drop_pp']:g}_front.png"))


def summarise(doc: dict[str, Any]) -> dict[str, Any]:
    """One row per run: wall time (against its model's goal when its cache was cold), winners and the funnel."""
    rows = {}
    for key, run in doc["runs"].items():
        if "error" in run:
            rows[key] = {"error": run["error"]}
            continue
        f = run["funnel"]
        rows[key] = {"wall_min": run["wall_min"], "cache": run["cache"].split()[0],
                     "within_goal": run.get("within_goal") if run["cache"].startswith("cold") else None,
                     "phases_s": run.get("phases_s"),
                     "winners": {cell: [w["label"], w.get("p50_ms"), w.get("x_of_original.int8")]
                                 for cell, w in run["winner"].items()},
                     "fastest": {cell: [w["label"], w.get("p50_ms"), w.get("x_of_original.int8")]
                                 for cell, w in run.get("fastest", {}).items()},
                     "torch_probes": f["torch_probes"], "missed_in_torch": f["torch_missed_constraint"],
                     "files_timed": run["counts"]["screened"], "files_screened_out": run["counts"]["screened_out"],
                     "files_confirmed": run["counts"]["confirmed"], "verdict": run["verdict"]}
    return rows


# ----------------------------------------------------------------------------------------------------------- main
def git_state() -> dict[str, Any]:
    """The commit the library was at, and its files modified or untracked at the start (the run imports those)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "uncommitted": git("status", "--porcelain").splitlines()}


def header() -> dict[str, Any]:
    import onnxruntime

    return {"git": git_state(), "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
            "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "machine": platform.processor() or platform.machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def new_document(quick: bool) -> dict[str, Any]:
    from minreal.app.tune import default_methods

    cfg = tune_config(DROPS[0], quick)
    return {"usage": USAGE, "issue": 27, "header": header(), "quick": quick,
            "setting": {"methods": list(cfg.methods or default_methods()), "grid": list(cfg.grid),
                        "recover_epochs": "per model (models.*.recover_epochs)",
                        "halving": {"eta": cfg.halving_eta, "rungs": cfg.halving_rungs,
                                    "per_method": cfg.halving_per_method}, "qat": cfg.qat, "int8": cfg.quant_target,
                        "provider": PROVIDER, "batch_sizes": list(BATCHES), "drops_pp": "per model (models.*.drops)",
                        "screen": dataclasses.asdict(cfg.screen), "confirm": dataclasses.asdict(cfg.confirm),
                        "executor": "ProcessExecutor(1) with SpecSource: as `minreal tune --workers 1`",
                        "goal_s": "per model (models.*.goal_s)"},
            "method": "one tune per (model, drop) at batch sizes 1 and 32: the tune chooses on batch 1; the batch-32 "
                      "winner is the tune's own rule (minreal.app.tune.choice.choose_candidate, tie rule included) "
                      "over the same confirmed p50s (fronts of both cells and the baselines are confirmed at both); "
                      "fastest = the lowest confirmed p50 per cell (minreal.app.tune.front.choose, no tie rule). The "
                      "first drop of a model starts from an empty cache (cold wall time); the second reuses it (warm). "
                      "p50 in ms; accuracy in % (ONNX Runtime, held-out split); loss_pp = accuracy drop vs the "
                      "original fp32 file in ONNX Runtime; x_of_* = winner p50 / baseline p50 on the same cell "
                      "(confirmed protocol).",
            "summary_legend": "winners: cell -> [label, confirmed p50 ms, p50 / original.int8's p50], the tune's "
                              "choice on that cell (a structural p50 win that does not hold in every confirmation "
                              "process against a baseline is a tie, which goes to the baseline); fastest: the same "
                              "for the lowest confirmed p50 (no tie rule); files_timed: "
                              "files timed with the screening protocol (baselines included); files_screened_out: "
                              "files that missed the constraint in ONNX Runtime (never timed unless a baseline); "
                              "missed_in_torch: probes never exported",
            "models": {}, "runs": {}}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/tune.json"))
    ap.add_argument("--only", default="resnet20,resnet32", help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-tune",
                    help="tune folders and candidate caches (default: runs/bench-tune, ignored by git)")
    ap.add_argument("--resume", action="store_true", help="skip runs the JSON already holds")
    ap.add_argument("--workers", type=int, default=1,
                    help="candidate worker processes (runs with more than one are recorded as "
                         "<model>/drop<D>/workers<N>, with their own cold cache)")
    ap.add_argument("--recover-epochs", type=int, default=None, metavar="N",
                    help="recovery cap of every selected model instead of its own (runs recorded as "
                         "<model>/drop<D>/capN, with their own cold cache): the cell behind tune's default cap")
    ap.add_argument("--refresh", action="store_true",
                    help="re-derive the runs in --out from their tune folders' report.json (no tuning)")
    ap.add_argument("--quick", action="store_true", help="smoke test: svd only, grid 0.8/0.5, short protocols")
    args = ap.parse_args()
    check_only_and_quick(ap, args, CASES, "tune.json")
    return args


def check_only_and_quick(ap: argparse.ArgumentParser, args: argparse.Namespace, names: Any, document: str) -> None:
    """``args.only`` as a list of names from ``names`` (else a usage error), and ``--quick`` kept off
    ``benchmarks/DOCUMENT`` with its work in a ``quick`` subfolder (shared by this file and real_models.py)."""
    args.only = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        ap.error(f"unknown model {', '.join(unknown)}; choose from {', '.join(names)}")
    if args.quick and args.out.resolve() == (ROOT / "benchmarks" / document).resolve():
        ap.error(f"--quick needs its own --out (it must not overwrite benchmarks/{document})")
    if args.quick:
        args.work = args.work / "quick"


def main() -> None:
    import json

    from _common import write_json  # benchmarks/ is on sys.path only when this file runs as a script

    args = parse()
    reuse = (args.resume or args.refresh) and args.out.is_file()
    doc = json.loads(args.out.read_text()) if reuse else new_document(args.quick)
    if doc.get("quick") != args.quick:
        raise SystemExit(f"{args.out} holds a {'quick' if doc.get('quick') else 'full'} run; use another --out")
    def save() -> None:
        doc["summary"] = summarise(doc)
        write_json(args.out, doc)

    if args.refresh:
        refresh(doc, args.quick)
        save()
        return
    for name in args.only:
        run_model(doc, name, args, save)
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    save()
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
