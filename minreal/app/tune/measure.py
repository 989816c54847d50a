"""What ONNX Runtime measures of a tune's deployable files: their quality on the held-out data, which decides
feasibility (:func:`ort_quality`), their sizes (:func:`file_sizes`, and :func:`ort_sizes` for the ``.ort`` files that
ship), and their latency in one timing pass on the target hardware (:func:`bench_on_target` hands a :class:`BenchJob`,
the files as bytes, to the executor's ``on_target``, which runs :func:`bench_files` there)."""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import minreal.runtime_bench as rb
from minreal.compress.core.data import Dataset
from minreal.export.json_safe import to_jsonable
from minreal.export.verify import feeds_of
from minreal.runtime_bench.metrics import evaluate_models

from .candidate import CandidateResult, cached_file
from .config import Constraint, Protocol, Quality, TuneConfig
from .executor import Executor
from .model import Candidate, Progress, cell_name
from .search import Clock

__all__ = ["BenchJob", "BenchOutcome", "bench_files", "bench_on_target", "p50_by_cell", "record_confirmation",
           "ort_quality", "file_sizes", "ort_sizes", "screen_references", "structure_screen"]


@dataclass(frozen=True)
class BenchJob:
    """One timing pass for :meth:`Executor.on_target`: the files travel as bytes (no shared storage needed)."""

    labels: tuple[str, ...]
    files: tuple[bytes, ...]
    config: rb.BenchConfig
    x: Any
    y: np.ndarray | None


@dataclass
class BenchOutcome:
    """The benchmark report (JSON-safe, model paths as in the job's temporary folder) and where it was measured."""

    report: dict[str, Any]
    host: str
    pid: int


def bench_files(job: BenchJob, progress: Progress | None = None) -> BenchOutcome:
    """Time ``job``'s files here with :func:`minreal.runtime_bench.run_benchmark` (fresh processes; providers must
    run)."""
    with tempfile.TemporaryDirectory(prefix="minreal-tune-bench-") as tmp:
        entries = []
        for i, (label, data) in enumerate(zip(job.labels, job.files)):
            path = Path(tmp) / f"{i}.onnx"
            path.write_bytes(data)
            entries.append(rb.ModelEntry(label, path))
        report = rb.run_benchmark(entries, job.config, job.x, job.y, progress=progress, fail_on_unavailable=True)
        return BenchOutcome(to_jsonable(report), socket.gethostname(), os.getpid())


def bench_on_target(candidates: list[Candidate], held_out: Dataset, cfg: TuneConfig, protocol: Protocol,
                    say: Progress, run: Executor, quality: bool = True) -> BenchOutcome:
    """One timing pass on the target hardware (``run.on_target``); the report names the files in ``models/``.
    ``quality``: the report's metrics on all the held-out data, with its labels (the confirmation: the release gate
    reads them); False for a pass that only ranks by latency (the files' quality is :func:`ort_quality`'s): the
    inputs are the rows the largest batch needs, and the metrics only the agreement on those."""
    bench_cfg = cfg.bench_config(protocol)
    x = held_out.x if quality else held_out.x[: max(bench_cfg.batch_sizes)]
    y = None if held_out.y is None or not quality else held_out.y.numpy()
    job = BenchJob(tuple(c.label for c in candidates), tuple(Path(c.onnx).read_bytes() for c in candidates),
                   bench_cfg, feeds_of(x), y)
    outcome = run.on_target(functools.partial(bench_files, progress=say), job)
    paths = {c.label: c.onnx for c in candidates}
    for model in outcome.report["models"]:
        model["path"] = paths[model["name"]]
    return outcome


def screen_references(baselines: list[Candidate], cfg: TuneConfig) -> list[Candidate]:
    """The baselines a structure must beat: those that meet the constraint (ONNX Runtime's quality, measured) and
    ``--max-size``."""
    return [c for c in baselines if c.feasible and cfg.fits(c.onnx_bytes)]


def structure_screen(results: list[CandidateResult], baselines: list[Candidate], held_out: Dataset, cfg: TuneConfig,
                     say: Progress, run: Executor) -> dict[tuple[str, float], dict[str, float]]:
    """Time the files of ``files_only`` results beside the ``baselines`` that meet the constraint (their ONNX Runtime
    quality measured already, and within ``--max-size``) in one pass of the short protocol on the target; for each
    ``(method, budget)``, by cell, the p50 of its fastest file over that of the fastest such baseline. Empty when no
    baseline meets the constraint (nothing to compare with)."""
    refs = screen_references(baselines, cfg)
    if not refs or not results:
        return {}
    files = [Candidate(f"{r.spec.label}.{kind}", "structure", kind, cached_file(r, kind), 0)
             for r in results for kind in ("fp32", "int8") if kind in r.files]
    say(f"[tune] structure screen: {len(files)} files of {len(results)} zero-shot structures beside "
        f"{len(refs)} baseline(s) ({cfg.screen.min_seconds:g} s per model, 1 process)")
    p50 = p50_by_cell(bench_on_target(refs + files, held_out, cfg, cfg.screen, say, run, quality=False).report)
    cells = sorted({cell for _, cell in p50})
    best = {cell: min(p50[(c.label, cell)] for c in refs) for cell in cells}
    return {(r.spec.method, r.spec.mac_ratio):
            {cell: min(p50[(f"{r.spec.label}.{k}", cell)] for k in ("fp32", "int8") if k in r.files) / best[cell]
             for cell in cells} for r in results}


def p50_by_cell(bench: dict[str, Any]) -> dict[tuple[str, str], float]:
    return {(lat["model"], cell_name(lat["provider"], lat["batch_size"])): lat["stats"]["p50_ms"]
            for lat in bench["latency"]}


def record_confirmation(confirmed: list[Candidate], confirm: dict[str, Any]) -> None:
    """Each confirmed file's p50 and its [fastest, slowest] per-process p50 by cell."""
    by_label = {c.label: c for c in confirmed}
    for lat in confirm["latency"]:
        c, cell = by_label[lat["model"]], cell_name(lat["provider"], lat["batch_size"])
        per = lat.get("process_p50_ms") or [lat["stats"]["p50_ms"]]
        c.confirm_ms[cell], c.confirm_range_ms[cell] = lat["stats"]["p50_ms"], [min(per), max(per)]


def ort_quality(candidates: list[Candidate], held_out: Dataset, constraint: Constraint, folder: Path,
                say: Progress, what: str | None = None) -> None:
    """ONNX Runtime's quality on the held-out data of every file not measured yet (the first of ``candidates`` is
    the original, the reference); feasibility judged on it (what deploys). ``what``: the progress line's words for
    an early measurement (the baselines', for the race's structure screen), which a log reader must not take for
    the tune's own ``[tune] measuring`` stage."""
    todo = [c for c in candidates if not c.quality]
    if not todo:
        return
    if candidates[0].quality:  # measured before (with the baselines, for the structure screen): it runs again
        todo = [candidates[0], *todo]  # only as the reference of top-1 agreement; its quality stays as measured
    say(f"[tune] {what} in ONNX Runtime: {len(todo)} files on {len(held_out)} held-out samples" if what else
        f"[tune] measuring {len(todo)} files with ONNX Runtime on {len(held_out)} held-out samples")
    y = None if held_out.y is None else held_out.y.numpy()
    metrics = evaluate_models([c.label for c in todo], [Path(c.onnx) for c in todo],
                              feeds_of(held_out.x), y, 64, rb.BenchConfig().threads())
    if candidates[0].quality:
        todo, metrics = todo[1:], metrics[1:]
        reference = Quality.from_metrics(candidates[0].quality)
    else:
        reference = Quality.from_metrics(dataclasses.asdict(metrics[0]))
    for c, m in zip(todo, metrics):
        c.quality = {k: v for k, v in dataclasses.asdict(m).items() if k in ("accuracy", "top1_agreement", "mse")}
        q = Quality.from_metrics(c.quality)
        c.loss = constraint.loss(q, reference)
        c.feasible = c.label == "original" or constraint.holds(q, reference)


def file_sizes(candidates: list[Candidate], cfg: TuneConfig, notes: list[str], say: Progress) -> None:
    """Each file's gzip-compressed bytes; ``--max-size``: a file over it is infeasible whatever its quality, the
    original's included (baselines are still timed, as references)."""
    from minreal.runtime_bench.model_info import gzip_bytes, model_files

    for c in candidates:
        c.gzip_bytes = gzip_bytes(model_files(Path(c.onnx)))
    over = [c for c in candidates if not cfg.fits(c.onnx_bytes)]
    for c in over:
        c.feasible = False
    if over:
        note = (f"{len(over)} of {len(candidates)} files exceed --max-size {cfg.max_size_kb:g} KB: "
                + ", ".join(f"{c.label} ({c.onnx_bytes / 1024:.1f} KB)" for c in over[:8])
                + (", ..." if len(over) > 8 else ""))
        notes.append(note)
        say(f"[tune] {note}")


def ort_sizes(candidates: list[Candidate], cfg: TuneConfig, folder: Path, notes: list[str], say: Progress,
              clock: Clock) -> None:
    """``--format onnx,ort`` with ``--max-size`` or ``--objective size``: each file still feasible converted to ORT
    format in a scratch folder inside ``folder`` (removed after; no parity check: :func:`.output.write_chosen_ort`
    checks the chosen file's copy) with the settings :func:`.output.write_chosen_ort` uses; its ``.ort`` bytes
    recorded (what ``--objective size`` ranks), and a file whose ``.ort`` file is over the limit, or that the converter
    refuses, is infeasible (what ships is the ``.ort`` file)."""
    from minreal.export.errors import OrtConversionError
    from minreal.export.ort_format import convert_to_ort, ort_for_target

    todo, refused, t0 = [c for c in candidates if c.feasible], [], time.perf_counter()
    if not todo:  # every file is out already (the .onnx files' own size, or their quality)
        return
    with tempfile.TemporaryDirectory(prefix=".minreal-ort-sizes-", dir=folder) as scratch:
        for c in todo:
            dst = Path(scratch) / Path(c.onnx).with_suffix(".ort").name
            try:
                c.ort_bytes = convert_to_ort(c.onnx, dst, ort_for_target(cfg.ort, cfg.quant_target)).bytes
            except OrtConversionError as exc:
                c.feasible = False
                refused.append(f"{c.label} ({exc})")
    over = [c for c in todo if c.ort_bytes is not None and not cfg.fits(c.ort_bytes)]
    for c in over:
        c.feasible = False
    why = "judge --max-size on" if cfg.max_size_kb is not None else "rank --objective size by"
    over_text = f"{len(over)} over it, " if cfg.max_size_kb is not None else ""
    say(f"[tune] converted {len(todo) - len(refused)} feasible file(s) to ORT format to {why} their .ort files: "
        f"{over_text}{time.perf_counter() - t0:.1f} s; {clock.elapsed()}")
    if over:
        notes.append(f"{len(over)} of {len(todo)} files exceed --max-size {cfg.max_size_kb:g} KB as .ort (what "
                     "ships with --format onnx,ort), though their .onnx files fit: "
                     + ", ".join(f"{c.label} (.ort {c.ort_bytes / 1024:.1f} KB, .onnx {c.onnx_bytes / 1024:.1f} KB)"
                                 for c in over[:8]) + (", ..." if len(over) > 8 else ""))
        say(f"[tune] {notes[-1]}")
    if refused:
        notes.append(f"ONNX Runtime's converter refused {len(refused)} file(s), so they cannot ship as .ort: "
                     + "; ".join(refused))
        say(f"[tune] {notes[-1]}")
