"""GPU benchmark (issue 16): the demo models and torchvision resnet18 / mobilenet_v2 (random weights, 224×224), each
original, factorised to half its MACs and (resnet18, mobilenet_v2: the models with residual blocks) cut to 0.7 of its
MACs by ``depth`` (whole residual blocks removed: fewer kernels, each at its full width), on CUDA and TensorRT in
fp32, fp16 and INT8 at batch 1 and 32.

Backends (every cell is one model × variant × backend × precision × batch size):

- ``torch-cuda``: the torch modules themselves on CUDA (fp32; fp16 by ``.half()``), timed by CUDA events. This is
  PyTorch, never ONNX Runtime; it runs whenever torch has CUDA, so a machine without onnxruntime-gpu still
  measures the original against the compressed model.
- ``ort-cuda``: ONNX Runtime's CUDA provider (:func:`minreal.runtime_bench.run_benchmark`, fresh processes) on the fp32
  file, its FP16 copy (:mod:`minreal.export.fp16`) and its explicit-QDQ INT8 copy (symmetric int8, TensorRT's format).
- ``ort-tensorrt``: ONNX Runtime's TensorRT provider on the fp32 file (fp32; fp16 with ``trt_fp16_enable``) and
  on the QDQ file (``trt_int8_enable``), with an engine cache shared by its timing processes.
- ``tensorrt``: TensorRT itself (:func:`minreal.export.tensorrt_check.tensorrt_check`): engines built from the fp32 file
  (fp32, fp16 flag) and from the QDQ file (INT8 flag), profile batch 1/32/32, build time and parity against ONNX
  Runtime's CPU provider recorded, then each engine timed through its execution context by CUDA events.

CUDA-event timing goes through the project's one timing loop (:func:`minreal.runtime_bench.timing.time_interleaved`,
warm-up discarded, original and compressed interleaved) with a clock that records an event on the stream and waits for
it.

A cell that cannot run is recorded as ``skipped`` with the reason (no GPU, a provider or module not importable,
the time budget spent); one that ran and broke as ``failed`` with the error. The whole run keeps to ``--budget-s``
(default 420 s): each model runs in a child process holding a share of what is left (by weight: a torchvision model
counts three digits models), which skips its remaining steps when its share runs out and is killed shortly after
it. ``benchmarks/gpu.json`` is written atomically after every model. On a machine without a GPU every cell is
skipped with its reason in a few seconds; ``--dry-run`` plans and probes without running anything.

Usage: benchmarks/gpu.sh [--python PATH | --wheelhouse DIR] [--budget-s S] [--dry-run]
   or: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/gpu.py [--out benchmarks/gpu.json] [--budget-s 420]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _common import write_json

from minreal.facts import error_line

OUT = Path(__file__).with_suffix(".json")
MODELS = ("digits-mlp", "digits-cnn", "resnet18", "mobilenet_v2")
WEIGHT = {"digits-mlp": 1, "digits-cnn": 1, "resnet18": 3, "mobilenet_v2": 3}  # shares of the time budget
DEPTH_VARIANT = "depth-mac0.7"
VARIANTS = ("original", "factorize-mac0.5", DEPTH_VARIANT)
#: Models with residual blocks, the only ones ``depth`` can cut; the others are measured without the depth variant.
DEPTH_MODELS = ("resnet18", "mobilenet_v2")
BATCHES = (1, 32)
#: Steps of one model, in the order they run, and the precisions each measures.
BACKENDS: dict[str, tuple[str, ...]] = {
    "torch-cuda": ("fp32", "fp16"),
    "ort-cuda": ("fp32", "fp16", "int8"),
    "tensorrt": ("fp32", "fp16", "int8"),
    "ort-tensorrt": ("fp32", "fp16", "int8"),
}
#: The ONNX file each TensorRT precision is built from (fp16: the fp32 file with the FP16 flag).
SOURCE = {"fp32": "fp32", "fp16": "fp32", "int8": "int8"}
#: Seconds a step needs at least to be worth starting (TensorRT builds take tens of seconds per engine).
MIN_STEP_S = {"torch-cuda": 5.0, "ort-cuda": 15.0, "tensorrt": 30.0, "ort-tensorrt": 30.0}
KILL_GRACE_S = 15.0
TIMING = {"warmup": 10, "min_runs": 30, "min_seconds": 0.3}
SCHEMA = 1


@dataclass
class Cell:
    """One measurement: status ``pending``/``ok``/``skipped``/``failed``, the reason when not ``ok`` (on an ``ok``
    tensorrt cell: the warning that its engine failed parity), the latency statistics
    (:class:`minreal.runtime_bench.timing.LatencyStats` as a dict) when ``ok``. ONNX Runtime cells are timed with
    I/O binding: ``latency`` includes copying the inputs from and the outputs to the host (what a caller holding
    numpy arrays pays), ``device_latency`` has inputs and outputs already on the GPU (the model alone)."""

    model: str
    variant: str
    backend: str
    precision: str
    batch: int
    status: str = "pending"
    reason: str | None = None
    latency: dict[str, float] | None = None
    device_latency: dict[str, float] | None = None

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return self.model, self.variant, self.backend, self.precision, self.batch


def variants(model: str) -> tuple[str, ...]:
    """The variants measured of ``model``: the original, factorize, and depth where the model has residual blocks."""
    return ("original", "factorize-mac0.5", *((DEPTH_VARIANT,) if model in DEPTH_MODELS else ()))


def plan(models: tuple[str, ...]) -> list[Cell]:
    """Every cell of the run, pending."""
    return [Cell(m, v, b, p, n) for m in models for b, precisions in BACKENDS.items() for v in variants(m)
            for p in precisions for n in BATCHES]


# --- what this machine offers --------------------------------------------------------------------------------------

def _torch_cuda_reason() -> str | None:
    import torch

    return None if torch.cuda.is_available() else f"torch {torch.__version__} has no CUDA device"


def _gpu_reason(torch_reason: str | None) -> str | None:
    """Why no GPU is usable here (``None``: one is): CUDA_VISIBLE_DEVICES hides them, or neither torch nor
    nvidia-smi sees one."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return "no GPU: CUDA_VISIBLE_DEVICES hides every device"
    if torch_reason is None:
        return None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return f"no GPU: {torch_reason} and nvidia-smi is not installed"
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    found = listed.returncode == 0 and "GPU" in listed.stdout
    return None if found else f"no GPU: {torch_reason}, nvidia-smi lists none"


def _joined(*reasons: str | None) -> str | None:
    return "; ".join(r for r in reasons if r) or None


def _ort_reason(unavailable_reason: Any, provider: str) -> str | None:
    """Why ONNX Runtime cannot run ``provider`` here, also when no ONNX Runtime wheel is installed at all (the
    torch-CUDA rows are then still measured)."""
    from minreal.runtime_bench.runtime import RuntimeMissingError

    try:
        return unavailable_reason(provider)
    except RuntimeMissingError as exc:
        return str(exc)


def probe() -> tuple[dict[str, str | None], dict[str, Any]]:
    """Backend → why it cannot run here (``None``: it can): no GPU, then what the backend itself lacks; and what
    was found (``gpu`` reason, TensorRT version)."""
    from minreal.export.tensorrt_check import import_tensorrt
    from minreal.runtime_bench.providers import unavailable_reason

    torch_reason = _torch_cuda_reason()
    gpu = _gpu_reason(torch_reason)
    trt, trt_reason = import_tensorrt()
    reasons = {
        "torch-cuda": _joined(gpu, None if gpu else torch_reason),
        "ort-cuda": _joined(gpu, _ort_reason(unavailable_reason, "cuda")),
        "ort-tensorrt": _joined(gpu, _ort_reason(unavailable_reason, "tensorrt")),
        "tensorrt": _joined(gpu, f"tensorrt not importable: {trt_reason}" if trt is None else None,
                            None if gpu else torch_reason),
    }
    return reasons, {"gpu": gpu or "found", "tensorrt": trt.__version__ if trt is not None else trt_reason}


# --- the parent: plan, children, merge, write ----------------------------------------------------------------------

@dataclass
class Run:
    """The document being filled (written as ``gpu.json``)."""

    out: Path
    budget_s: float
    dry_run: bool
    environment: dict[str, Any]
    cells: list[Cell]
    started: float = field(default_factory=time.time)
    models: dict[str, Any] = field(default_factory=dict)
    tensorrt_checks: list[dict[str, Any]] = field(default_factory=list)

    def write(self) -> None:
        counts = {s: sum(c.status == s for c in self.cells) for s in ("ok", "skipped", "failed", "pending")}
        write_json(self.out, {
            "schema": SCHEMA, "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
            "budget_s": self.budget_s, "elapsed_s": round(time.time() - self.started, 2), "dry_run": self.dry_run,
            "environment": self.environment, "timing": TIMING, "summary": counts, "models": self.models,
            "cells": [asdict(c) for c in self.cells], "tensorrt_checks": self.tensorrt_checks,
        }, indent=1)


def skip_pending(cells: list[Cell], reason: str) -> None:
    for c in cells:
        if c.status == "pending":
            c.status, c.reason = "skipped", reason


def mark_unavailable(cells: list[Cell], found: dict[str, str | None], dry_run: bool) -> None:
    """Skip every cell whose backend cannot run here (with its reason); in a dry run, every other cell too."""
    for c in cells:
        if found[c.backend] is not None:
            c.status, c.reason = "skipped", found[c.backend]
    if dry_run:
        skip_pending(cells, "dry run: nothing was run (the backend is available here)")


def share_deadline(model: str, pending_models: list[str], deadline: float) -> float:
    """The end of ``model``'s share of the time left, by :data:`WEIGHT`."""
    total = sum(WEIGHT[m] for m in pending_models)
    return time.time() + max(0.0, deadline - time.time()) * WEIGHT[model] / total


def run_child(run: Run, model: str, until: float, workdir: Path) -> None:
    """Run one model's steps in a child process that starts no step after ``until - KILL_GRACE_S`` and is killed
    at ``until``, then merge what it recorded."""
    backends = sorted({c.backend for c in run.cells if c.model == model and c.status == "pending"})
    result = workdir / f"{model}.json"
    cmd = [sys.executable, __file__, "--child", model, "--backends", ",".join(backends),
           "--until", str(until - KILL_GRACE_S), "--workdir", str(workdir / model), "--result", str(result)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, until - time.time()))
        exit_note = None if done.returncode == 0 else \
            f"the {model} child exited with {done.returncode}: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    except subprocess.TimeoutExpired:
        exit_note = "time budget: the child was killed at the end of its share"
    merge(run, model, json.loads(result.read_text()) if result.is_file() else {}, exit_note)


def merge(run: Run, model: str, result: dict[str, Any], exit_note: str | None) -> None:
    """Copy a child's cells, preparation notes and TensorRT checks into ``run``; cells it left out get ``exit_note``."""
    by_key = {c.key: c for c in run.cells}
    for d in result.get("cells", []):
        cell = by_key[(model, d["variant"], d["backend"], d["precision"], d["batch"])]
        cell.status, cell.reason, cell.latency = d["status"], d["reason"], d["latency"]
        cell.device_latency = d.get("device_latency")
    run.models[model] = result.get("prepare", {})
    run.tensorrt_checks += result.get("tensorrt_checks", [])
    step = result.get("step")
    note = exit_note or "the child recorded no result for this cell"
    for c in run.cells:
        if c.model == model and c.status == "pending":
            c.status = "skipped" if note.startswith("time budget") else "failed"
            c.reason = f"{note} (during its {step} step)" if step else note


def parent(args: argparse.Namespace) -> None:
    models = tuple(args.models.split(","))
    run = Run(Path(args.out), args.budget_s, args.dry_run, {}, plan(models))
    deadline = run.started + args.budget_s
    found, seen = probe()
    run.environment = {"python": sys.version.split()[0], **seen, **_versions(), "unavailable": found}
    mark_unavailable(run.cells, found, args.dry_run)
    run.write()
    cut = "time budget: the run ended before this cell"
    try:
        with tempfile.TemporaryDirectory(prefix="minreal-gpu-") as tmp:
            for model in models:
                pending = [m for m in models[models.index(model):]
                           if any(c.model == m and c.status == "pending" for c in run.cells)]
                if model in pending:
                    run_child(run, model, share_deadline(model, pending, deadline), Path(tmp))
                    run.write()
    except SystemExit:
        cut = "stopped by SIGTERM (gpu.sh's hard time limit) before this cell"
        raise
    finally:
        skip_pending(run.cells, cut)
        run.write()
    print(json.dumps({"out": str(run.out), "summary": {s: sum(c.status == s for c in run.cells)
                                                       for s in ("ok", "skipped", "failed")}}))


def _versions() -> dict[str, Any]:
    """torch, ONNX Runtime (or why it is missing) and the machine record every report has (GPU model, memory,
    driver, CUDA, cuDNN, TensorRT: :func:`minreal.runtime_bench.environment.collect_environment`)."""
    from dataclasses import asdict

    import torch

    from minreal.runtime_bench.runtime import RuntimeMissingError, onnxruntime_module

    out: dict[str, Any] = {"torch": torch.__version__}
    try:
        ort = onnxruntime_module()
        out.update(onnxruntime=ort.__version__, onnxruntime_providers=",".join(ort.get_available_providers()))
        from minreal.runtime_bench.environment import collect_environment

        out["environment"] = asdict(collect_environment(1))
    except RuntimeMissingError as exc:
        out["onnxruntime"] = f"missing: {exc}"
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(0)
    return out


# --- the child: one model's steps ----------------------------------------------------------------------------------

@dataclass
class Prepared:
    """One model's torch modules, ONNX files and inputs; ``errors`` says why a module or file is missing."""

    modules: dict[str, Any]
    files: dict[tuple[str, str], Path]
    rows: Any
    calib: np.ndarray
    errors: dict[str, str]
    notes: dict[str, Any]

    def example(self, batch: int) -> Any:
        """``batch`` example rows (the first few, repeated)."""
        return self.rows[[i % len(self.rows) for i in range(batch)]]


def _case(model: str) -> tuple[Any, Any, Any]:
    """(module, calibration Dataset, example rows) of a benchmark model."""
    import torch
    import torchvision

    from minreal.app.demo import demo_factories
    from minreal.compress.core.data import Dataset

    if model.startswith("digits-"):
        case = demo_factories()[model](True)
        return case.model.eval(), case.train, case.test.x[:8]
    torch.manual_seed(0)
    module = getattr(torchvision.models, model)(weights=None).eval()
    x = torch.randn(48, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return module, Dataset(x), x[:8]


def _attempt(errors: dict[str, str], label: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``None`` with the error recorded under ``label``."""
    try:
        return fn()
    except Exception as exc:  # a variant that cannot be made is a finding of the benchmark
        errors[label] = error_line(exc, with_type=True, max_chars=300)
        return None


def prepare(model: str, workdir: Path) -> Prepared:
    """The original and compressed modules, their fp32 / FP16 / INT8 (QDQ, symmetric int8) ONNX files."""
    from minreal.app.method_options import build_config, provider_defaults
    from minreal.compress import compress
    from minreal.export.fp16 import convert_fp16
    from minreal.export.int8 import QuantConfig, quantize_int8
    from minreal.export.onnx_export import to_onnx

    t = time.perf_counter()
    module, calib, rows = _case(model)
    errors: dict[str, str] = {}
    config = build_config("factorize", {"mac_ratio": 0.5}, provider_defaults(("cuda", "tensorrt")))
    small = _attempt(errors, VARIANTS[1], lambda: compress(module, calib, "factorize", config))
    modules = {VARIANTS[0]: module, **({VARIANTS[1]: small[0]} if small else {})}
    shallow = None
    if DEPTH_VARIANT in variants(model):  # whole residual blocks removed: fewer kernels, each at its full width
        depth_config = build_config("depth", {"mac_ratio": 0.7}, provider_defaults(("cuda", "tensorrt")))
        shallow = _attempt(errors, DEPTH_VARIANT, lambda: compress(module, calib, "depth", depth_config))
        modules.update({DEPTH_VARIANT: shallow[0]} if shallow else {})
    workdir.mkdir(parents=True, exist_ok=True)
    files, x = {}, calib.x[:16].numpy()
    for variant, m in modules.items():
        fp32 = workdir / f"{variant}.onnx"
        if _attempt(errors, f"{variant}.fp32", lambda: to_onnx(m, rows[:2], fp32)) is None:
            continue
        files[(variant, "fp32")] = fp32
        q = _attempt(errors, f"{variant}.int8", lambda: quantize_int8(fp32, workdir / f"{variant}.int8.onnx", x,
                                                                      QuantConfig(target="tensorrt")))
        h = _attempt(errors, f"{variant}.fp16", lambda: convert_fp16(fp32, [x[:1], x[:4]]))
        files.update({(variant, p): Path(r.out_path) for p, r in (("int8", q), ("fp16", h)) if r is not None})
    notes = {"prepare_s": round(time.perf_counter() - t, 2), "errors": errors,
             "mac_ratio": small[1].mac_ratio if small else None,
             **({"depth_mac_ratio": shallow[1].mac_ratio} if shallow else {}),
             "files": sorted(f"{v}.{p}" for v, p in files)}
    return Prepared(modules, files, rows, x, errors, notes)


def cuda_clock(stream: Any) -> Callable[[], float]:
    """A clock for :func:`time_interleaved`: seconds between a first event and one recorded now on ``stream``,
    waited for, so each timed call spans from its launch to the end of its GPU work."""
    import torch

    base = torch.cuda.Event(enable_timing=True)
    base.record(stream)
    base.synchronize()

    def now() -> float:
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        event.synchronize()
        return base.elapsed_time(event) / 1e3

    return now


def _timed(fns: list[Callable[[], Any]], batch: int, stream: Any) -> list[dict[str, float]]:
    from minreal.runtime_bench.timing import latency_stats, time_interleaved

    lat = time_interleaved(fns, TIMING["warmup"], TIMING["min_runs"], TIMING["min_seconds"], clock=cuda_clock(stream))
    return [asdict(latency_stats(ms, batch)) for ms in lat]


def _cells(backend: str, precision: str, batch: int, results: dict[str, dict[str, Any] | str]) -> list[dict[str, Any]]:
    """Cell dicts of the variants this process measures (:func:`variants`): latency stats (ok), or a reason string
    (failed)."""
    out = []
    for v in VARIANTS:
        r = results.get(v, "not made: see the model's preparation errors")
        ok = isinstance(r, dict)
        out.append({"variant": v, "backend": backend, "precision": precision, "batch": batch,
                    "status": "ok" if ok else "failed", "reason": None if ok else r, "latency": r if ok else None})
    return out


def step_torch_cuda(prep: Prepared) -> Iterator[list[dict[str, Any]]]:
    """Original and compressed torch modules on CUDA, fp32 and ``.half()``, interleaved; cells per precision and
    batch size."""
    import torch

    for precision, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        names = list(prep.modules)
        modules = [copy.deepcopy(prep.modules[v]).to("cuda", dtype).eval() for v in names]
        for batch in BATCHES:
            x = prep.example(batch).to("cuda", dtype)
            with torch.inference_mode():
                stats = _timed([lambda m=m: m(x) for m in modules], batch, torch.cuda.current_stream())
            yield _cells("torch-cuda", precision, batch, dict(zip(names, stats)))


def _ort_cells(report: Any, backend: str, labels: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """Cells from a :class:`minreal.runtime_bench.BenchReport`: each latency row of a labelled model."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    device: dict[tuple[str, int, str], dict[str, Any]] = {}
    for row in report.latency:
        variant, precision = labels[row.model]
        found.setdefault((precision, row.batch_size), {})[variant] = asdict(row.stats)
        if row.device_stats is not None:
            device[(precision, row.batch_size, variant)] = asdict(row.device_stats)
    cells = [c for (precision, batch), results in found.items() for c in _cells(backend, precision, batch, results)]
    for c in cells:
        c["device_latency"] = device.get((c["precision"], c["batch"], c["variant"]))
    return cells


def _bench(files: dict[tuple[str, str], Path], provider: str, precisions: tuple[str, ...], until: float,
           settings: Any = None, repeats: int = 2) -> list[dict[str, Any]]:
    """ONNX Runtime on ``provider`` for the ``(variant, precision)`` files (original first: the ratios' reference)."""
    import minreal.runtime_bench as rb

    labels = {f"{v}.{p}": (v, p) for p in precisions for v in VARIANTS if (v, p) in files}
    if not labels:
        return [c for p in precisions for b in BATCHES for c in _cells(f"ort-{provider}", p, b, {})]
    entries = [rb.ModelEntry(name, files[labels[name]]) for name in labels]
    extra = {"provider_settings": {provider: settings}} if settings is not None else {}
    config = rb.BenchConfig(providers=(provider,), batch_sizes=BATCHES, warmup=TIMING["warmup"],
                            min_runs=TIMING["min_runs"], min_seconds=TIMING["min_seconds"], repeats=repeats,
                            io_binding=True, worker_timeout_s=max(10.0, until - time.time()), **extra)
    report = rb.run_benchmark(entries, config, fail_on_unavailable=True, progress=lambda m: None)
    cells = _ort_cells(report, f"ort-{provider}", labels)
    made = {(c["precision"], c["batch"]) for c in cells}
    return cells + [c for p in precisions for b in BATCHES if (p, b) not in made
                    for c in _cells(f"ort-{provider}", p, b, {})]


def step_ort_cuda(prep: Prepared, until: float) -> Iterator[list[dict[str, Any]]]:
    """The fp32, FP16 and QDQ files on ONNX Runtime's CUDA provider, in one benchmark."""
    yield _bench(prep.files, "cuda", BACKENDS["ort-cuda"], until)


def step_ort_tensorrt(prep: Prepared, workdir: Path, until: float) -> Iterator[list[dict[str, Any]]]:
    """One benchmark per precision (the provider's flags apply to a whole session): fp32 and fp16 read the fp32
    file, int8 the QDQ file."""
    from minreal.runtime_bench.provider_options import ProviderSettings

    cache = str(workdir / "ort-trt-cache")
    for precision in BACKENDS["ort-tensorrt"]:
        if until - time.time() < MIN_STEP_S["ort-tensorrt"]:
            late = dict.fromkeys(VARIANTS, "time budget: this model's share ran out before this precision")
            yield [c for b in BATCHES for c in _cells("ort-tensorrt", precision, b, late)]
            continue
        files = {(v, precision): p for (v, s), p in prep.files.items() if s == SOURCE[precision]}
        settings = ProviderSettings(fp16=precision == "fp16", int8=precision == "int8", engine_cache=cache,
                                    timing_cache=cache)
        yield _bench(files, "tensorrt", (precision,), until, settings, repeats=1)


def step_tensorrt(prep: Prepared, workdir: Path, until: float,
                  checks: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Engines from the fp32 file (fp32, fp16) and the QDQ file (int8), checked (each check yielded as it is made,
    with no cell, so that it is saved), then timed interleaved per precision."""
    from minreal.export.json_safe import to_jsonable
    from minreal.export.tensorrt_check import tensorrt_check

    engines: dict[tuple[str, str], tuple[str, dict[str, Any], str | None] | str] = {}
    for (variant, source), path in sorted(prep.files.items()):
        built_from = [p for p, s in SOURCE.items() if s == source]
        if not built_from:
            continue  # the FP16 ONNX file: TensorRT builds fp16 from the fp32 file with its FP16 flag
        if until - time.time() < MIN_STEP_S["tensorrt"]:
            engines.update({(variant, p): "time budget: no time left to build this engine" for p in built_from})
            continue
        check = tensorrt_check(path, batch=(1, 32, 32), precisions=built_from, data=prep.calib,
                               engine_dir=workdir / "engines")
        checks.append({"variant": variant, "file": source, **to_jsonable(check)})
        if not check.used_tensorrt:  # TensorRT could not build here: the check says why
            engines.update({(variant, p): check.checker for p in built_from})
        for b in check.builds:
            usable = b.built and b.engine_path and not b.error
            engines[(variant, b.precision)] = (b.engine_path, check.profile, _parity_note(b)) if usable else \
                (b.error or "not built")
        yield []
    for precision in BACKENDS["tensorrt"]:
        yield _time_engines(prep, precision, engines)


def _parity_note(build: Any) -> str | None:
    """The warning an ok cell carries when its engine's outputs did not match ONNX Runtime's."""
    if build.passed or build.parity_skipped:
        return None
    worst = max((p.max_abs_err for p in build.parity), default=float("nan"))
    return (f"timed, but its outputs differ from ONNX Runtime's CPU provider (max |err| {worst:.3g}; "
            "see tensorrt_checks)")


def _time_engines(prep: Prepared, precision: str, engines: dict[tuple[str, str], Any]) -> list[dict[str, Any]]:
    """Both variants' engines of ``precision`` at each batch size, on one stream, interleaved."""
    import torch

    from minreal.export.tensorrt_check import EngineRunner, import_tensorrt, parity_feeds

    ready = {v: e for v in VARIANTS if isinstance(e := engines.get((v, precision)), tuple)}
    failed = {v: e for v in VARIANTS if isinstance(e := engines.get((v, precision)), str)}
    if not ready:
        return [c for batch in BATCHES for c in _cells("tensorrt", precision, batch, failed)]
    trt, _ = import_tensorrt()
    stream = torch.cuda.Stream()
    runners = {v: EngineRunner(trt, Path(path).read_bytes(), stream=stream) for v, (path, _, _) in ready.items()}
    out = []
    for batch in BATCHES:
        for v, (_, profile, _) in ready.items():
            shapes = {n: (batch, *r["opt"][1:]) for n, r in profile.items()}
            runners[v].bind(parity_feeds(prep.files[(v, SOURCE[precision])], shapes, None, 0))
        stats = _timed([r.launch for r in runners.values()], batch, stream)
        cells = _cells("tensorrt", precision, batch, {**failed, **dict(zip(runners, stats))})
        for c in cells:
            c["reason"] = c["reason"] or (ready[c["variant"]][2] if c["variant"] in ready else None)
        out += cells
    return out


def child(args: argparse.Namespace) -> None:
    """Run one model's steps (``--backends``) until ``--until``, writing ``--result`` whenever a step yields."""
    global VARIANTS  # this process measures one model: every step below reads that model's variants
    VARIANTS = variants(args.child)
    until, workdir, result = float(args.until), Path(args.workdir), Path(args.result)
    state: dict[str, Any] = {"cells": [], "prepare": {}, "tensorrt_checks": [], "step": "prepare"}
    write_json(result, state)
    backends = [b for b in BACKENDS if b in args.backends.split(",")]
    try:
        prep = prepare(args.child, workdir)
    except Exception as exc:  # no model, no cell: say why in every one
        reason = f"preparing the model failed: {error_line(exc, with_type=True, max_chars=300)}"
        state["cells"] = [c for b in backends for c in _all_cells(b, "failed", reason)]
        write_json(result, {**state, "step": None})
        return
    state["prepare"] = prep.notes
    steps = {"torch-cuda": lambda: step_torch_cuda(prep),
             "ort-cuda": lambda: step_ort_cuda(prep, until),
             "tensorrt": lambda: step_tensorrt(prep, workdir, until, state["tensorrt_checks"]),
             "ort-tensorrt": lambda: step_ort_tensorrt(prep, workdir, until)}
    for backend in backends:
        state["step"] = backend
        write_json(result, state)
        left = until - time.time()
        if left < MIN_STEP_S[backend]:
            reason = f"time budget: {left:.0f} s of this model's share left, the step needs {MIN_STEP_S[backend]:.0f}"
            state["cells"] += _all_cells(backend, "skipped", reason)
            continue
        try:
            for cells in steps[backend]():
                state["cells"] += cells
                write_json(result, state)
        except Exception as exc:  # one backend's failure must not cost the others (or its own earlier) cells
            done = {(c["variant"], c["precision"], c["batch"]) for c in state["cells"] if c["backend"] == backend}
            state["cells"] += [c for c in _all_cells(backend, "failed", error_line(exc, with_type=True, max_chars=300))
                               if (c["variant"], c["precision"], c["batch"]) not in done]
    state["step"] = None
    write_json(result, state)


def _all_cells(backend: str, status: str, reason: str) -> list[dict[str, Any]]:
    return [{"variant": v, "backend": backend, "precision": p, "batch": b, "status": status, "reason": reason,
             "latency": None} for v in VARIANTS for p in BACKENDS[backend] for b in BATCHES]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget of the whole run")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dry-run", action="store_true", help="probe and plan only: every cell skipped with its reason")
    for name in ("--child", "--backends", "--until", "--workdir", "--result"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        ap.error(f"unknown model {unknown}; choose from {', '.join(MODELS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # gpu.sh's hard limit: still write the document
    parent(args)


if __name__ == "__main__":
    main()
