"""End-to-end pipeline: compress → export → simplify → verify → INT8 / FP16 → benchmark → run directory.

Each stage is a plain function with a dataclass result; the CLI and the demo are thin shells over
:func:`run_pipeline`. The run is written into the staging folder of a claimed run directory and committed at the
end (:mod:`minreal.app.rundir`), so a failed run leaves no half-written output.

Test hook: ``MINREAL_FAULT_INJECT=STAGE:SIGNAL`` makes the process send itself SIGNAL (``SIGINT``,
``SIGTERM``) when STAGE starts (``export_original``, ``compress``, ``int8``, ``fp16``, ``benchmark``, ``commit``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torch import nn

import minreal.runtime_bench as rb
from minreal.app.case_warnings import collected_warnings
from minreal.app.int8_text import int8_cause, roundtrip_summary
from minreal.app.mismatch import DataCheck, check_data, require_match
from minreal.app.plan import run_variant
from minreal.app.report import cell_label
from minreal.app.run_report import RUN_SCHEMA_VERSION, CaseResult, RunReport
from minreal.app.rundir import RunDirClaim, claim_run_dir, commit_run_dir
from minreal.app.settings import PipelineConfig
from minreal.compress.core.evaluate import compare_outputs, predictions_kept
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.run_case import RunCase, VariantSpec
from minreal.compress.registry import apply_recovery, controls_interrupted
from minreal.export.errors import ParityError
from minreal.export.int8 import int8_skip_reason
from minreal.export.int8.target import resolve_target
from minreal.export.json_safe import to_jsonable, write_json
from minreal.export.ort_format import merge_operator_configs, ort_variant
from minreal.export.record import VariantRecord
from minreal.export.serialize import save_program
from minreal.export.settings import FEW_CALIBRATION_SAMPLES
from minreal.export.variant import (
    FP16_LABEL_SUFFIX,
    export_variant,
    file_stem,
    fp16_skip_reason,
    fp16_variant,
    layer_weights,
    quantize_variant,
    relative_to,
    trained_ranges,
)
from minreal.export.verify import feeds_of
from minreal.facts import int8_source
from minreal.runtime_bench.atomic import atomic_path

__all__ = ["FAULT_ENV", "run_pipeline", "fill_run_dir", "run_case"]

log = logging.getLogger(__name__)
FAULT_ENV = "MINREAL_FAULT_INJECT"
Progress = Callable[[str], None]


def _fault_point(stage: str) -> None:
    """Test hook: send this process the signal named by ``MINREAL_FAULT_INJECT=STAGE:SIGNAL`` at ``stage``."""
    where, _, name = os.environ.get(FAULT_ENV, "").partition(":")
    name = name.upper()
    if where == stage and name:
        os.kill(os.getpid(), signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])


def _export(module: nn.Module, label: str, method: str, case: RunCase, case_dir: Path,
            cfg: PipelineConfig) -> VariantRecord:
    """One variant of ``case`` exported into ``case_dir``, checked on the case's held-out inputs (its ORT-format
    copy too, with ``cfg.ort``)."""
    record = export_variant(module, case.test.x, case_dir / f"{file_stem(label)}.onnx", cfg.variant_config(),
                            label, method, dynamic_axes=case.axes() or None)
    if cfg.ort is not None:
        record.ort = ort_variant(record, case_dir, case.test.x, cfg.variant_config(), cfg.ort, module)
    return record


def _ort_int8(records: list[VariantRecord], case: RunCase, case_dir: Path, cfg: PipelineConfig) -> str | None:
    """With ``cfg.ort``: the ORT-format copies of the INT8 ``records`` (each checked against its ``.onnx`` file) and
    the case's merged operator configuration, of these and the fp32 ``.ort`` files (its name), else ``None``. FP16
    records get none (:data:`minreal.app.report.ORT_FP16_NOTE` says why, in the run's report)."""
    if cfg.ort is None:
        return None
    for r in records:
        if r.method.endswith("+int8"):
            r.ort = ort_variant(r, case_dir, case.test.x, cfg.variant_config(), cfg.ort)
    merged = case_dir / "required_operators.config"
    merge_operator_configs([case_dir / r.ort["config_path"] for r in records if r.ort], merged)
    return merged.name


def _add_ort_sizes(bench: dict[str, Any], records: list[VariantRecord]) -> None:
    """``ort_size_bytes`` beside ``file_size_bytes`` of each benchmarked model that has an ORT-format file, in place:
    ``minreal check --max-size`` and ``--max-size-ratio`` judge that file too (what ships)."""
    sizes = {r.label: r.ort["bytes"] for r in records if r.ort}
    for model in bench["models"]:
        if model["name"] in sizes:
            model["ort_size_bytes"] = sizes[model["name"]]


@dataclass
class Interrupts:
    """Whether a first Ctrl-C already ended a recovery in this command (the next one then aborts it)."""

    seen: bool = False


def variant_recovery(run: VariantSpec, recovery: RecoveryConfig | None,
                     interrupts: Interrupts) -> RecoveryConfig | None:
    """The recovery of one variant: its own, else the run's; one that may not swallow a Ctrl-C after the first."""
    chosen = run.recovery or recovery
    if chosen is not None and interrupts.seen:
        chosen = dataclasses.replace(chosen, catch_interrupt=False)
    return chosen


def run_case(case: RunCase, case_dir: Path, cfg: PipelineConfig, progress: Progress,
             interrupts: Interrupts | None = None) -> CaseResult:
    """Compress each variant of ``case``, export everything, quantise, benchmark side by side. What the case logs at
    WARNING or raises as a Python warning on the way (ONNX Runtime's quantisation pre-processing, an exporter's
    fallback) is one of its warnings too, after those of the run's own checks (:func:`collected_warnings`); when the
    case fails, those a brief console held back are shown before the error goes on."""
    # the original's outputs on the case's data are computed once for every variant judged against them
    with collected_warnings() as raised, predictions_kept(case.model):
        result = _run_case(case, case_dir, cfg, progress, interrupts or Interrupts())
    result.warnings += [w for w in raised if w not in result.warnings]
    if result.warnings:  # each warning is printed once, with the results (finish_run), and kept in report.json
        progress(f"[{case.name}] {len(result.warnings)} warning(s), listed with the results")
    return result


def _run_case(case: RunCase, case_dir: Path, cfg: PipelineConfig, progress: Progress,
              interrupts: Interrupts) -> CaseResult:
    """:func:`run_case` without collecting the warnings raised on the way."""
    check, mismatch = _data_check(case, cfg, progress)  # before any work: near chance stops the run
    case_dir.mkdir(parents=True, exist_ok=True)
    stages: dict[str, float] = {}
    t = time.perf_counter()
    _fault_point("export_original")
    progress(f"[{case.name}] exporting original")
    records = [_export(case.model, "original", "none", case, case_dir, cfg)]
    stages["export_original"] = time.perf_counter() - t
    weights: dict[str, dict[str, Any]] = {}  # layers with trained activation ranges, per variant label
    compressed = []  # every variant compressed first: a budget one cannot meet stops the run before any recovery
    for run in case.runs:
        t = time.perf_counter()
        _fault_point("compress")
        recovery = variant_recovery(run, cfg.recovery, interrupts)
        then = ", recovery after every variant is compressed" if len(case.runs) > 1 and recovery is not None \
            and recovery.enabled else ""
        progress(f"[{case.name}] compressing with {run.method} ({run.label}){then}")
        small, report = run_variant(case.model, case.train, run, recovery, case.test, case.axes(),
                                    recover_after=False)
        interrupts.seen |= controls_interrupted(report)  # cbalanced's controls train here
        compressed.append((run, small, report, time.perf_counter() - t))
    compressed.reverse()  # popped in the variants' order: each compressed model is freed once it is exported
    while compressed:
        run, small, report, seconds = compressed.pop()
        t = time.perf_counter()
        recovery = variant_recovery(run, cfg.recovery, interrupts)
        if recovery is not None and recovery.enabled:
            count, unit = (recovery.epochs, "epoch") if recovery.epochs else (recovery.steps, "step")
            progress(f"[{case.name}] recovering {run.label} ({count} {unit}{'s' if count != 1 else ''})")
        small = apply_recovery(report, case.model, small, case.train, recovery, case.test)
        interrupts.seen |= bool(report.recovery and report.recovery["interrupted"])
        stages[f"compress:{run.label}"] = seconds + time.perf_counter() - t
        t = time.perf_counter()
        rec = _export(small, run.label, run.method, case, case_dir, cfg)
        # Methods measure on the data they were given (calibration); the run also measures on held-out data.
        report.measured.held_out = compare_outputs(case.model, small, case.test)
        rec.compression = report
        records.append(rec)
        weights[run.label] = layer_weights(small, trained_ranges(rec))
        save_program(small, case.test.x[:2], case_dir / f"{file_stem(run.label)}.pt2", dynamic_axes=case.axes())
        del small  # the files hold it now; the compressed models are not kept through INT8 and the benchmark
        stages[f"export:{run.label}"] = time.perf_counter() - t
    fp32_records = list(records)
    if cfg.int8:
        t = time.perf_counter()
        _fault_point("int8")
        progress(f"[{case.name}] quantising to INT8 ({cfg.variant.quant_target}, {cfg.variant.quant_mode})")
        records += _int8_records(records, weights, case, case_dir, cfg)
        stages["int8"] = time.perf_counter() - t
    fp16_warnings: list[str] = []
    if cfg.wants_fp16():
        t = time.perf_counter()
        _fault_point("fp16")
        progress(f"[{case.name}] converting to FP16 (parity on {cfg.fp16_config().provider})")
        fp16_records, fp16_warnings = _fp16_records(fp32_records, case, case_dir, cfg)
        records += fp16_records
        stages["fp16"] = time.perf_counter() - t
    if cfg.ort is not None:
        int8 = "converting the INT8 files to ORT format, " if any(r.method.endswith("+int8") for r in records) else ""
        progress(f"[{case.name}] {int8}merging the required-operators configurations")
    ort_config = _ort_int8(records, case, case_dir, cfg)
    t = time.perf_counter()
    _fault_point("benchmark")
    progress(f"[{case.name}] benchmarking {len(records)} models")
    entries = [rb.ModelEntry(r.label, case_dir / r.onnx) for r in records]
    y = None if case.test.y is None else case.test.y.numpy()
    bench = rb.run_benchmark(entries, cfg.bench_config(_axis_values(case, cfg)), feeds_of(case.test.x), y,
                             progress=progress, fail_on_unavailable=not cfg.skip_unavailable_providers)
    stages["benchmark"] = time.perf_counter() - t
    result = CaseResult(case.name, records, relative_to(to_jsonable(bench), case_dir), stages, list(case.notes))
    _add_ort_sizes(result.bench, records)
    write_json(result.bench, case_dir / "bench.json")  # a `minreal bench` report, paths relative to the case
    slow = fp16_warnings + int8_quality_warnings(result) + slowdown_warnings(result)
    result.warnings, result.data_check = mismatch + axes_warnings(records) + slow, dataclasses.asdict(check)
    result.ort_config = ort_config
    return result


def _data_check(case: RunCase, cfg: PipelineConfig, progress: Progress) -> tuple[DataCheck, list[str]]:
    """The original's accuracy on the case's labelled data against chance, and the warning when it is near chance
    and ``cfg.allow_data_mismatch`` let the run go on.

    Raises
    ------
    DataMismatchError
        near chance, and not allowed.
    """
    check = require_match(check_data(case.model, {"evaluation": case.test, "calibration": case.train}),
                          cfg.allow_data_mismatch)
    warnings = [f"--allow-data-mismatch: {check.message()}"] if check.allowed else []
    if warnings:  # the warning itself is printed once, with the results
        progress(f"[{case.name}] going on despite a data mismatch (--allow-data-mismatch)")
    return check, warnings


def _axis_values(case: RunCase, cfg: PipelineConfig) -> dict[str, tuple[int, ...]]:
    """Lengths each dynamic axis is timed at: the user's (``cfg.bench.axis_values``), else the held-out data's length
    and half of it (so the report has latency per shape). Lengths longer than the data are refused by the
    benchmark (nothing is padded)."""
    from minreal.app.shapes import axis_lengths

    fixed = cfg.variant.fixed_shapes
    frozen = set() if fixed is None else {name for name, _ in fixed.dims} | {
        dim for name, _ in fixed.inputs for dim in case.axes().get(name, {}).values()}  # --fixed-shapes
    out = {}
    for dim, length in axis_lengths(case.test.x, case.axes()).items():
        if dim not in frozen:
            out[dim] = tuple(cfg.bench.axis_values.get(dim) or sorted({max(1, length // 2), length}))
    return out


def _int8_records(records: list[VariantRecord], weights: dict[str, dict[str, Any]], case: RunCase, case_dir: Path,
                  cfg: PipelineConfig) -> list[VariantRecord]:
    """INT8 copies of the fp32 ``records``, the original's too (the baseline a compressed model has to beat, not
    only the fp32 one). A variant recovered quantisation-aware gets its copy with the trained ranges and, beside
    it, a post-training copy of the same weights calibrated afresh (``LABEL.ptq.int8``). A variant with external
    data gets none; its ``quantization`` says why (``{"skipped": reason}``)."""
    out = []
    for r in records:
        if skip := int8_skip_reason(case_dir / r.onnx):
            r.quantization = {"skipped": skip}
            continue
        if not out and cfg.variant.quant_mode == "static" and \
                (n := min(len(case.train.x), cfg.variant.calib_samples)) < FEW_CALIBRATION_SAMPLES:
            log.warning("[%s] INT8 ranges from %d calibration sample(s) hold for those only: give --data with %d or "
                        "more", case.name, n, FEW_CALIBRATION_SAMPLES)
        out.append(quantize_variant(r, case_dir, case.train.x, cfg.variant_config(), weights.get(r.label)))
        if trained_ranges(r):
            out.append(quantize_variant(r, case_dir, case.train.x, cfg.variant_config(), post_training=True))
    return out


def _fp16_records(records: list[VariantRecord], case: RunCase, case_dir: Path,
                  cfg: PipelineConfig) -> tuple[list[VariantRecord], list[str]]:
    """FP16 copies (``LABEL.fp16``) of the fp32 ``records``, checked on the held-out inputs, and a warning for each
    one that failed parity: that variant's ``fp16`` says ``{"skipped": reason}`` and the run goes on without it."""
    out, warnings = [], []
    for r in records:
        if skip := fp16_skip_reason(r):
            r.fp16 = {"skipped": skip}
            continue
        try:
            out.append(fp16_variant(r, case_dir, case.test.x, cfg.variant_config(), cfg.fp16_config()))
        except ParityError as exc:
            r.fp16 = {"skipped": str(exc)}
            warnings.append(f"no FP16 copy of {r.label}: {exc}")
    return out, warnings


def _source(model: str) -> tuple[str, str]:
    """The fp32 model a benchmarked model is compared with, and the warning's wording."""
    source = int8_source(model)
    if source is not None:
        return source, "INT8 model slower than its fp32 source"
    if model.endswith(FP16_LABEL_SUFFIX):
        return model[: -len(FP16_LABEL_SUFFIX)], "FP16 model slower than its fp32 source"
    return "original", "compressed model not faster than the original"


def _roundtrip_cause(quantization: Mapping[str, Any]) -> str:
    """`` (likely cause: ...)`` from an INT8 record's ``float_roundtrips``; ``""`` without any."""
    summary = roundtrip_summary(quantization.get("float_roundtrips") or {})
    return f" (likely cause: {summary})" if summary else ""


INT8_MAX_DROP_PP = 1.0
"""An INT8 file losing more than this many points of accuracy (or of top-1 agreement with the original) against
its fp32 source on the held-out data is flagged."""
INT8_MAX_MSE_RISE = 0.10
"""... or raising the MSE against the targets by more than this fraction."""


def _int8_loss(m: Mapping[str, Any], src: Mapping[str, Any]) -> str | None:
    """What an INT8 model's held-out metrics ``m`` lose against its fp32 source's ``src`` beyond the thresholds."""
    if m.get("accuracy") is not None and src.get("accuracy") is not None:
        drop = 100.0 * (src["accuracy"] - m["accuracy"])
        return f"accuracy {100 * m['accuracy']:.2f} % vs {100 * src['accuracy']:.2f} %" if drop > INT8_MAX_DROP_PP \
            else None
    if m.get("mse") is not None and src.get("mse"):
        rise = m["mse"] / src["mse"] - 1.0
        return f"MSE {m['mse']:.4g} vs {src['mse']:.4g} (+{100 * rise:.3g} %)" if rise > INT8_MAX_MSE_RISE else None
    if m.get("top1_agreement") is not None and src.get("top1_agreement") is not None:
        drop = 100.0 * (src["top1_agreement"] - m["top1_agreement"])
        return (f"top-1 agreement with the original {100 * m['top1_agreement']:.2f} % vs "
                f"{100 * src['top1_agreement']:.2f} %") if drop > INT8_MAX_DROP_PP else None
    return None


def axes_warnings(records: list[Any]) -> list[str]:
    """Per variant, the trace's warning that decisions rest on a dynamic axis's length (the graph holds only
    where they keep their outcome: :data:`~minreal.compress.core.width.tracing.AXES_WARNING`)."""
    from minreal.compress.core.width.tracing import AXES_WARNING

    return [f"{r.label}: {note}" for r in records if r.compression is not None
            for note in r.compression.notes if AXES_WARNING in note]  # a chain's notes name their step first


def int8_quality_warnings(case: CaseResult) -> list[str]:
    """A line for every INT8 model whose held-out quality (measured by the benchmark) falls short of its fp32
    source's by more than :data:`INT8_MAX_DROP_PP` points or :data:`INT8_MAX_MSE_RISE`, naming the likely cause."""
    metrics = {m["model"]: m for m in case.bench.get("metrics") or ()}
    records = {v.label: v for v in case.variants}
    out = []
    for model, m in metrics.items():
        source = int8_source(model)
        if source is None or source not in metrics or (loss := _int8_loss(m, metrics[source])) is None:
            continue
        quantization = getattr(records.get(model), "quantization", None) or {}
        out.append(f"INT8 model loses quality: {model} {loss} of {source} on the held-out data "
                   f"(likely cause: {int8_cause(quantization)})")
    return out


def slowdown_warnings(case: CaseResult) -> list[str]:
    """A line for every compressed model not faster than the original, and every INT8 or FP16 model slower than
    its fp32 source, per (provider, batch size), from the median p50 latencies of the benchmark."""
    p50 = {(lat["model"], lat["provider"], cell_label(lat)): lat["stats"]["p50_ms"] for lat in case.bench["latency"]}
    causes = {v.label: _roundtrip_cause(v.quantization) for v in case.variants if getattr(v, "quantization", None)}
    out = []
    for (model, provider, batch), ms in sorted(p50.items()):
        if model == "original":
            continue
        source, kind = _source(model)
        ref = p50.get((source, provider, batch))
        if ref is not None and ms >= ref:
            out.append(f"{kind}: {model} {ms:.4g} ms vs {source} {ref:.4g} ms ({provider}, batch {batch})"
                       + (causes.get(model, "") if int8_source(model) else ""))
        baseline = p50.get(("original.int8", provider, batch))
        if not model.startswith("original") and baseline is not None and ms >= baseline:
            out.append(f"not faster than simply quantising the original: {model} {ms:.4g} ms vs original.int8 "
                       f"{baseline:.4g} ms ({provider}, batch {batch})")
    return out


def run_pipeline(cases: list[RunCase], out_dir: Path, cfg: PipelineConfig, overwrite: bool = False,
                 progress: Progress | None = None, inputs: Sequence[Path] = ()) -> RunReport:
    """Run every case into ``out_dir`` (report.json, report.md, plot.png, ONNX files per case)."""
    with claim_run_dir(Path(out_dir), overwrite, inputs) as claim:
        return fill_run_dir(cases, claim, cfg, progress)


def fill_run_dir(cases: list[RunCase], claim: RunDirClaim, cfg: PipelineConfig,
                 progress: Progress | None = None) -> RunReport:
    """Run every case into the staging folder of ``claim`` and commit it as the run directory; ``cfg``'s INT8 target
    is resolved here, once (the report keeps the one asked for)."""
    from minreal.app.plots import plot_accuracy_latency, plot_spectra
    from minreal.app.report import render_markdown

    notify, staging = progress or log.info, claim.staging
    interrupts = Interrupts()
    target = resolve_target(cfg.variant.quant_target, cfg.variant.quant_mode)
    resolved = dataclasses.replace(cfg, variant=dataclasses.replace(cfg.variant, quant_target=target))
    results = [run_case(c, staging / c.name, resolved, notify, interrupts) for c in cases]
    report = RunReport(RUN_SCHEMA_VERSION, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
                       to_jsonable(cfg), results)
    write_json(report, staging / "report.json")
    with atomic_path(staging / "report.md") as tmp:
        tmp.write_text(render_markdown(report))
    plot_accuracy_latency(report, staging / "plot.png")
    plot_spectra(report, staging / "spectra.png")
    _fault_point("commit")
    commit_run_dir(claim)
    return report
