"""Benchmark driver: fresh worker processes per (provider, batch size, shape), then metrics and report."""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from minreal.facts import PROGRESS_KEY

from .config import BenchConfig, ModelEntry, shape_label
from .environment import collect_environment
from .errors import BenchInputError, ProviderUnavailableError, WorkerError
from .inputs import (
    Data,
    check_batch,
    data_rows,
    has_qdq,
    input_specs,
    symbolic_axes,
    take_rows,
    timing_inputs,
)
from .load import cpu_counters
from .metrics import ModelMetrics, evaluate_models
from .model_info import files_sha256, model_info
from .placement import placement_from_dict
from .provider_options import ort_options, trt_profiles
from .providers import provider_name, require_available, unavailable_reason
from .report import SCHEMA_VERSION, BenchReport, LatencyResult, PlacementResult, RatioResult, UnavailableProvider
from .runtime import wheel_conflict
from .timing import latency_stats, ratio_summary
from .worker import WorkerJob, WorkerResult, save_data

__all__ = ["run_benchmark", "Progress"]

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]
#: Log records with this ``extra`` key carry (task, done, total); the CLI draws them as progress bars.
Cell = tuple[str, int, str]  # (provider, batch size, shape label) of one timing cell


def run_benchmark(
    models: Sequence[ModelEntry],
    config: BenchConfig,
    x: Data | None = None,
    y: np.ndarray | None = None,
    progress: Progress | None = None,
    fail_on_unavailable: bool = False,
) -> BenchReport:
    """Time ``models`` interleaved on every (provider, batch size, shape) and measure their agreement.

    Shapes are the combinations of ``config.axis_values`` (one unnamed shape ``""`` without them).
    Each cell runs in ``config.repeats`` fresh worker processes; ratios are vs
    ``models[0]``. Providers that cannot run here are reported in ``unavailable``, never replaced;
    with ``fail_on_unavailable`` they are an error instead (checked before any work, and again when a
    worker finds that onnxruntime fell back to another provider).
    Accuracy (with ``y``) and agreement are computed first, here on CPU, on ``x`` as given (or seeded
    random inputs at the first shape), so incompatible models fail before any timing.

    Parameters
    ----------
    models
        Models to compare; the first is the reference.
    config
        Timing protocol, providers, batch sizes and symbolic axis values.
    x
        Evaluation inputs (rows along axis 0), also used as timing inputs (cut along symbolic axes to
        each shape): one array for single-input models, or arrays keyed by graph input name.
    y
        Labels (integers: accuracy) or targets (floats: MSE) for ``x``.
    progress
        Called with one-line progress messages (default: ``logging.info``).
    fail_on_unavailable
        Raise :class:`ProviderUnavailableError` instead of reporting a provider
        that cannot run.
    """
    notify = progress or logger.info
    started = cpu_counters()
    _check_models(models)
    if (conflict := wheel_conflict()) is not None:
        logger.warning("%s", conflict)
    if fail_on_unavailable:
        require_available(config.providers)
    infos = tuple(model_info(m.name, m.path) for m in models)
    _check_inputs(models, config, x, y)
    threads = config.threads()
    notify("computing accuracy and agreement")
    metrics, metrics_data = _metrics(models, config, threads, x, y)
    unavailable = {p: r for p in config.providers if (r := unavailable_reason(p)) is not None}
    if len(unavailable) == len(config.providers):
        raise ProviderUnavailableError("none of the requested providers can run here ("
                                       + "; ".join(f"{p}: {r}" for p, r in unavailable.items())
                                       + "), so nothing would be timed; request one that can (e.g. cpu)")
    with tempfile.TemporaryDirectory(prefix="minreal-bench-") as tmp:
        data_path = save_data(x, Path(tmp))
        runs = _run_workers(models, config, threads, data_path, unavailable, Path(tmp), notify,
                            fail_on_unavailable)
    latency, ratios = _summarise(runs, [m.name for m in models])
    return BenchReport(
        schema_version=SCHEMA_VERSION,
        created_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
        environment=collect_environment(threads, started),
        config=config,
        models=infos,
        latency=latency,
        ratios=ratios,
        metrics=metrics,
        metrics_data=metrics_data,
        unavailable=tuple(UnavailableProvider(p, provider_name(p), r) for p, r in unavailable.items()),
        placement=_placements(runs),
    )


def _check_models(models: Sequence[ModelEntry]) -> None:
    if not models:
        raise BenchInputError("run_benchmark needs at least one model")
    names = [m.name for m in models]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BenchInputError(f"duplicate model names: {', '.join(duplicates)}")


def _check_inputs(
    models: Sequence[ModelEntry], config: BenchConfig, x: Data | None, y: np.ndarray | None
) -> None:
    """Fail in the parent, before any worker starts, on inputs a worker could not build."""
    rows = None if x is None else data_rows(x)
    if y is not None and (rows is None or len(y) != rows):
        raise BenchInputError(f"y needs x with the same number of rows (y has {len(y)})")
    specs = {model.name: input_specs(model.path) for model in models}
    axes = set().union(*map(symbolic_axes, specs.values()))
    unknown = [name for name in config.axis_values if name not in axes]
    if unknown:
        raise BenchInputError(f"axis_values (--axis-values) names {unknown}, which no model input has as a symbolic "
                              f"axis beyond batch (they have {sorted(axes)})")
    first = None if x is None else take_rows(x, 0, 1)
    for name, model_specs in specs.items():
        for batch in config.batch_sizes:
            check_batch(model_specs, batch, name)
        for shape in config.shapes():
            timing_inputs(model_specs, config.batch_sizes[0], first, config.seed, name, shape)


def _run_workers(
    models: Sequence[ModelEntry],
    config: BenchConfig,
    threads: int,
    data_path: str | None,
    unavailable: dict[str, str],
    workdir: Path,
    notify: Progress,
    fail_on_unavailable: bool = False,
) -> dict[Cell, list[WorkerResult]]:
    """Repeat-major loop over cells; model order rotates per repeat so no model is always first."""
    runs: dict[Cell, list[WorkerResult]] = defaultdict(list)
    shapes = config.shapes()
    options = {p: _provider_options(p, models, config, workdir) for p in config.providers}
    specs = {m.name: input_specs(m.path) for m in models}  # read here once: the workers then never import onnx
    done, total = 0, config.repeats * len(config.providers) * len(config.batch_sizes) * len(shapes)
    for repeat in range(config.repeats):
        order = [models[(i + repeat) % len(models)] for i in range(len(models))]
        for provider in config.providers:
            for batch, (index, shape) in itertools.product(config.batch_sizes, enumerate(shapes)):
                if provider in unavailable:
                    break
                job = WorkerJob(
                    names=[m.name for m in order], paths=[str(m.path) for m in order],
                    provider=provider_name(provider), batch_size=batch, threads=threads,
                    warmup=config.warmup, min_runs=config.min_runs, min_seconds=config.min_seconds,
                    seed=config.seed, data_path=data_path, axis_values=shape,
                    provider_options=[options[provider][m.name] for m in order],
                    io_binding=config.io_binding and provider != "cpu",
                    placement=repeat == 0 and batch == config.batch_sizes[0] and index == 0,
                    specs=[specs[m.name] for m in order],
                )
                label = shape_label(shape)
                notify(f"timing {provider} batch {batch}{' ' + label if label else ''} "
                       f"(process {repeat + 1}/{config.repeats})")
                result = _spawn(job, workdir / f"{provider}-b{batch}-s{index}-r{repeat}", config.worker_timeout_s)
                done += 1
                logger.info("timing processes: %d/%d", done, total,
                            extra={PROGRESS_KEY: ("timing processes", done, total)})
                if result.status != "ok":
                    unavailable[provider] = result.reason or "provider did not run"
                    if fail_on_unavailable:
                        raise ProviderUnavailableError(f"provider {provider} did not run: {unavailable[provider]}")
                    continue
                runs[(provider, batch, label)].append(result)
    return {cell: results for cell, results in runs.items() if cell[0] not in unavailable}


def _provider_options(provider: str, models: Sequence[ModelEntry], config: BenchConfig,
                      workdir: Path) -> dict[str, dict[str, str]]:
    """Each model's ONNX Runtime options on ``provider``: the user's settings, with TensorRT's caches in one
    directory of this run (so later timing processes load the engine the first one built) and a profile
    covering every timed batch size and axis value unless the user gave one."""
    settings = config.provider_settings.get(provider)
    if provider == "tensorrt":
        (workdir / "trt-cache").mkdir(exist_ok=True)
    out = {}
    for m in models:
        dims = {s.name: s.shape for s in input_specs(m.path)}
        profiles = trt_profiles(dims, config.batch_sizes, config.axis_values) if provider == "tensorrt" else {}
        if settings is not None and settings.profiles:
            _check_profiles(settings.profiles, dims, m)
        options = ort_options(provider, settings, workdir / "trt-cache", profiles)
        if provider == "tensorrt" and "trt_int8_enable" not in options and has_qdq(m.path):
            options["trt_int8_enable"] = "1"  # a Q/DQ file runs in int8 only with the flag (explicit quantisation)
        if settings is not None and settings.engine_cache:
            # ONNX Runtime names cached engines by file and node names, not weights: one folder per file content
            options["trt_engine_cache_path"] = str(Path(settings.engine_cache) / file_digest(m.path))
        out[m.name] = options
    return out


def _check_profiles(profiles: Mapping[str, tuple[str, str, str]], dims: Mapping[str, tuple], model: ModelEntry) -> None:
    """A user's TensorRT profile must name the model's inputs, each at its rank (else the engine build fails late,
    inside a worker)."""
    for name, shapes in profiles.items():
        if name not in dims:
            raise BenchInputError(f"TensorRT profile (`BenchConfig.provider_settings`) names input {name!r}, which "
                                  f"model {model.name!r} does not have (its inputs: {', '.join(dims)})",
                                  fields=("provider_settings",))
        rank = len(shapes[0].split("x"))
        if rank != len(dims[name]):
            raise BenchInputError(f"TensorRT profile (`BenchConfig.provider_settings`) of input {name!r} has rank "
                                  f"{rank}, but model {model.name!r} input {name!r} has shape {list(dims[name])}",
                                  fields=("provider_settings",))


def file_digest(path: Path) -> str:
    """First 16 hex digits of the SHA-256 of a model file and its external data files, if any."""
    return files_sha256(Path(path))[:16]


def _spawn(job: WorkerJob, stem: Path, timeout_s: float) -> WorkerResult:
    """Run one job in a fresh ``python -m minreal.runtime_bench.worker`` process."""
    job_path, result_path = stem.with_suffix(".job.json"), stem.with_suffix(".result.json")
    job_path.write_text(json.dumps(asdict(job)))
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    command = [sys.executable, "-m", "minreal.runtime_bench.worker", str(job_path), str(result_path)]
    where = " ".join(filter(None, [job.provider, f"batch {job.batch_size}", shape_label(job.axis_values)]))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise WorkerError(f"worker for {where} exceeded {timeout_s} s, the time limit of one measuring process "
                          f"({len(job.paths)} file(s), each {job.warmup} warm-up and at least {job.min_runs} measured "
                          "runs); measure fewer runs or fewer files at once, or raise the limit "
                          "(`BenchConfig.worker_timeout_s`, --worker-timeout)") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no stderr"])[-1]
        raise WorkerError(f"worker for {where} failed with exit code {done.returncode}: {last}")
    return WorkerResult(**json.loads(result_path.read_text()))


def _placements(runs: dict[Cell, list[WorkerResult]]) -> tuple[PlacementResult, ...]:
    """The placements the workers measured (one job per provider measures them), by model and provider."""
    return tuple(PlacementResult(name, provider, placement_from_dict(found))
                 for (provider, _, _), results in runs.items() for r in results for name, found in r.placements.items())


def _summarise(
    runs: dict[Cell, list[WorkerResult]], names: list[str]
) -> tuple[tuple[LatencyResult, ...], tuple[RatioResult, ...]]:
    """Pool latencies over processes per model and pair per-process medians into ratios."""
    latency, ratios = [], []
    for (provider, batch, shape), results in runs.items():
        p50 = {n: [float(np.median(r.latencies_ms[n])) for r in results] for n in names}
        for name in names:
            pooled = [v for r in results for v in r.latencies_ms[name]]
            device = [v for r in results for v in r.device_latencies_ms.get(name, [])]
            latency.append(LatencyResult(
                model=name, provider=provider, batch_size=batch, stats=latency_stats(pooled, batch),
                process_p50_ms=tuple(p50[name]), worker_pids=tuple(r.pid for r in results),
                actual_providers=tuple(results[0].actual_providers), shape=shape,
                session_s=tuple(r.session_s.get(name, float("nan")) for r in results),
                first_run_ms=tuple(r.first_run_ms.get(name, float("nan")) for r in results),
                device_stats=latency_stats(device, batch) if device else None,
                device_process_p50_ms=tuple(float(np.median(r.device_latencies_ms[name])) for r in results
                                            if r.device_latencies_ms.get(name)),
            ))
        for name in names[1:]:
            s = ratio_summary(p50[name], p50[names[0]])
            ratios.append(RatioResult(name, names[0], provider, batch, "p50_ms", s.median, s.min, s.max, s.per_process,
                                      shape=shape))
    return tuple(latency), tuple(ratios)


def _metrics(
    models: Sequence[ModelEntry], config: BenchConfig, threads: int, x: Data | None, y: np.ndarray | None
) -> tuple[tuple[ModelMetrics, ...], str]:
    """Accuracy/agreement on ``x`` as given; without data, agreement on seeded random rows of the first shape.

    Random rows are those of :func:`minreal.runtime_bench.inputs.timing_inputs` for the first model's inputs.

    Returns
    -------
    The metrics and a description of the data they were computed on.
    """
    names, paths = [m.name for m in models], [m.path for m in models]
    if x is not None:
        described = f"the evaluation data ({data_rows(x)} rows{', labelled' if y is not None else ''})"
        return tuple(evaluate_models(names, paths, x, y, config.eval_batch_size, threads)), described
    specs, shape = input_specs(models[0].path), config.shapes()[0]
    rows = next((b for s in specs if (b := s.fixed_batch()) is not None), config.eval_batch_size)
    x = timing_inputs(specs, rows, None, config.seed, models[0].name, shape)
    floats = all(np.dtype(s.dtype).kind == "f" for s in specs)
    kinds = "standard-normal" if floats else "valid (standard-normal floats, in-range indices, masks of ones)"
    at = f" at {shape_label(shape)}" if shape else ""
    described = f"{rows} random {kinds} rows{at} (seed {config.seed}), no labels"
    return tuple(evaluate_models(names, paths, x, None, config.eval_batch_size, threads)), described
