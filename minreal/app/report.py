"""Human-readable views of a run: the summary tables (console and Markdown) and report.md; its plots are in
:mod:`minreal.app.plots`.

At a little over 600 lines this module is one concern (a run's report rendered as text); its sections share the
row and table helpers, and each section is a pair of functions (rows for the console, a section for report.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from minreal.app.int8_text import dropped_suffix, format_suffix, node_names, roundtrip_suffix
from minreal.app.run_report import CaseLike, ReportLike, RunReport, case_result, run_report, variant_compression
from minreal.compress.core.report import CompressionReport

if TYPE_CHECKING:
    from minreal.export.record import VariantRecord

__all__ = ["summary_rows", "macs_notes", "format_summary", "format_compact", "render_markdown", "spectra_layers",
           "SUMMARY_HEADERS", "RECOVERY_HEADERS", "recovery_rows", "format_recovery", "INT8_HEADERS", "int8_rows",
           "format_int8", "MOBILE_HEADERS", "mobile_rows", "FP16_HEADERS", "fp16_rows", "tensorrt_lines",
           "verdict_lines", "grouped_warnings", "warning_kind", "VERDICT_MAX_DROP_PP", "ORT_HEADERS", "ort_rows",
           "ort_line", "ORT_FP16_NOTE", "ort_fp16_note", "cell_label", "cell_order", "CaseVerdict", "case_verdict"]

#: The accuracy cost a verdict accepts: the fastest model within this many points of the original's held-out accuracy.
VERDICT_MAX_DROP_PP = 1.0

SUMMARY_HEADERS = ("case", "model", "params", "MACs", "MAC ratio", "file KB", "provider", "batch (shape)", "p50 ms",
                   "p90 ms", "p99 ms", "samples/s", "lat. ratio", "accuracy", "MSE", "agreement", "gzip KB")

RECOVERY_HEADERS = ("case", "model", "metric", "zero-shot", "recovered", "agreement zero-shot", "agreement recovered",
                    "KL zero-shot", "KL recovered", "epochs", "steps", "samples seen", "wall s", "status")

MOBILE_HEADERS = ("case", "model", "input shapes", "NNAPI", "CoreML NeuralNetwork", "CoreML MLProgram",
                  "unsupported ops", "checker's advice")

INT8_HEADERS = ("case", "fp32 model", "target", "post-training INT8", "quantisation-aware INT8", "accuracy PTQ",
                "accuracy QAT", "agreement PTQ", "agreement QAT", "MSE PTQ", "MSE QAT", "trained tensors")

ORT_HEADERS = ("case", "model", ".ort file", "file KB", ".onnx KB", "optimisation", "operators", "parity against",
               "max abs err", "batch sizes")

ORT_FP16_NOTE = ("FP16 files are not converted to ORT format: ONNX Runtime's converter optimises the graph for its "
                 "CPU execution provider, which has no float16 Conv/Gemm kernels, so it bakes Casts to float into the "
                 "file (an fp16 CNN converted that way ran Cast, Conv and Gemm in float), and ORT-format minimal "
                 "builds serve the CPU and mobile providers, not the CUDA/TensorRT providers FP16 files are made for")
"""Why a run with ``--format onnx,ort`` writes no ``.ort`` file of its FP16 files (:func:`ort_fp16_note`)."""

FP16_HEADERS = ("case", "FP16 model", "fp32 model", "I/O", "parity", "max err / output scale", "rtol", "file KB",
                "fp32 KB", "kept fp32 by converter", "run in fp32 by provider")


def _gzip_kb(variant: VariantRecord) -> float | None:
    """A variant's gzip-compressed KB, or None for a report written before sizes were compressed."""
    return variant.gzip_bytes / 1024 if variant.gzip_bytes else None


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def summary_rows(report: ReportLike) -> list[tuple[str, ...]]:
    """One row per (case, model, provider, batch size) with costs, latency, quality and agreement.

    The MAC ratio (predicted saving) sits next to the measured latency ratio, both vs the original.
    """
    report = run_report(report)
    rows = []
    for case in report.cases:
        bench = case.bench
        metrics = {m["model"]: m for m in bench["metrics"]}
        ratios = {(r["model"], r["provider"], r["batch_size"], r.get("shape", "")): r for r in bench["ratios"]
                  if r.get("statistic", "p50") in ("p50", "median", "p50_ms")}
        variants = {v.label: v for v in case.variants}
        base_macs = max(case.variants[0].macs, 1)
        for lat in bench["latency"]:
            v, m, s = variants[lat["model"]], metrics.get(lat["model"], {}), lat["stats"]
            ratio = ratios.get((lat["model"], lat["provider"], lat["batch_size"], lat.get("shape", "")))
            acc = m.get("accuracy")
            rows.append((case.name, lat["model"], str(v.params), str(v.macs),
                         f"{v.macs / base_macs:.3f}", f"{v.onnx_bytes / 1024:.1f}",
                         lat["provider"], cell_label(lat),
                         f"{s['p50_ms']:.3f}", f"{s['p90_ms']:.3f}", f"{s['p99_ms']:.3f}",
                         f"{s['throughput_sps']:.0f}", _fmt(ratio and ratio["median"], ".3f"),
                         _fmt(None if acc is None else 100 * acc, ".2f"), _fmt(m.get("mse"), ".4g"),
                         _fmt(m.get("top1_agreement"), ".4f"),
                         _fmt(_gzip_kb(v), ".1f")))
    return rows


def cell_label(row: Mapping[str, Any]) -> str:
    """A latency row's batch column: ``"32"``, or ``"32 seq=128"`` for a shape of a dynamic axis."""
    shape = row.get("shape") or ""
    return f"{row['batch_size']} {shape}" if shape else str(row["batch_size"])


def cell_order(label: str) -> tuple[int, str]:
    """The sort key of a :func:`cell_label`: batch size first, then shape."""
    batch, _, shape = label.partition(" ")
    return int(batch), shape


def _text_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    table = [headers, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_summary(report: ReportLike) -> str:
    """Fixed-width console table with every (case, model, provider, batch) row."""
    return _text_table(SUMMARY_HEADERS, summary_rows(report))


def _shape_text(shapes: Mapping[str, Sequence[int]]) -> str:
    """``input 16×8`` (per-sample shapes, batch axis dropped; names only for several inputs)."""
    if len(shapes) == 1 and "input" in shapes:
        return "×".join(map(str, shapes["input"])) or "scalar"
    return ", ".join(f"{name} {'×'.join(map(str, shape)) or 'scalar'}" for name, shape in shapes.items())


def macs_notes(report: ReportLike) -> list[str]:
    """Where a case's MACs depend on the input's length: one line per such case saying at which per-sample shape
    the table's MACs were counted (one held-out sample) and, when they differ, the compression reports' (the first
    calibration sample); none for a case timed at one shape per batch size whose counts share a shape."""
    lines = []
    for case in run_report(report).cases:
        counted = next((dict(v.macs_at) for v in case.variants if v.macs_at), None)
        if counted is None:
            continue
        shaped = any(row.get("shape") for row in case.bench.get("latency", ()))
        comp = next((dict(c.macs_at) for v in case.variants if (c := variant_compression(v)) and c.macs_at), None)
        other = comp is not None and comp != counted
        if not (shaped or other):
            continue
        line = (f"{case.name}: MACs are per sample at the held-out data's shape ({_shape_text(counted)})"
                + ("; rows at other shapes have other MACs" if shaped else ""))
        if other:
            line += f"; the compression reports' ratios were counted at the calibration data's ({_shape_text(comp)})"
        lines.append(line)
    return lines


def format_compact(report: ReportLike, keep: Callable[[str, str], bool] | None = None) -> str:
    """One line per (case, model): params, MAC ratio, file size, p50 latency and its ratio per batch size on
    the first provider, accuracy or MSE, agreement; only the (case, model) pairs ``keep`` accepts when given. Cases
    timed at different cells (batch sizes, or shapes of a dynamic axis) get a table each. The full table is in
    report.md."""
    report = run_report(report)
    full = summary_rows(report)
    first_provider = full[0][6] if full else "cpu"
    grouped: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
    for r in full:
        if r[6] == first_provider and (keep is None or keep(r[0], r[1])):
            grouped.setdefault((r[0], r[1]), {})[r[7]] = r
    cells_of: dict[str, set[str]] = {}
    for (case, _), by_batch in grouped.items():
        cells_of.setdefault(case, set()).update(by_batch)
    tables: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for (case, model), by_batch in grouped.items():
        batches = tuple(sorted(cells_of[case], key=cell_order))
        any_row = next(iter(by_batch.values()))
        cells = [c for b in batches for c in ((by_batch[b][8], by_batch[b][12]) if b in by_batch else ("-", "-"))]
        tables.setdefault(batches, []).append((case, model, any_row[2], any_row[4], any_row[5], *cells,
                                               *any_row[13:16]))
    texts = [_text_table(("case", "model", "params", "MAC ratio", "KB",
                          *(h for b in batches for h in (f"p50 ms b{b}", f"ratio b{b}")), "accuracy", "MSE",
                          "agreement"), rows) for batches, rows in tables.items()]
    notes = "".join(f"\n{line}" for line in macs_notes(report))
    return f"provider {first_provider}\n" + "\n\n".join(texts or [_text_table(("case", "model"), [])]) + notes


def _within_budget(m: Mapping[str, Any], base: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a model's held-out quality is within :data:`VERDICT_MAX_DROP_PP` of the original's, and its cost."""
    if m.get("accuracy") is not None and base.get("accuracy") is not None:
        drop = 100 * (base["accuracy"] - m["accuracy"])
        return drop <= VERDICT_MAX_DROP_PP + 1e-9, f"accuracy {0.0 - drop:+.2f} pp".replace("-0.00", "+0.00")
    if m.get("mse") is not None and base.get("mse") is not None:
        rise = m["mse"] / base["mse"] - 1 if base["mse"] > 0 else 0.0
        return rise <= 0.01 * VERDICT_MAX_DROP_PP + 1e-12, f"MSE {100 * rise:+.1f} %"
    if m.get("top1_agreement") is not None:  # unlabelled data: agreement with the original stands in
        agreement = m["top1_agreement"]
        return agreement >= 1 - 0.01 * VERDICT_MAX_DROP_PP - 1e-12, f"agreement {100 * agreement:.2f} %"
    return False, "quality not measured"


class CaseVerdict(NamedTuple):
    """One case's verdict on the first provider (:func:`case_verdict`): the fastest model within
    :data:`VERDICT_MAX_DROP_PP` of the original's quality (``best``, ``None`` when none is), its quality cost, its
    speed-ups per timed cell against the original fp32 and the original's low-precision file ``low``; and the
    compressed model that came closest, to say why nothing compressed won."""

    case: str
    provider: str
    best: str | None
    cost: str
    speedups: list[tuple[str, float, float | None]]  # (cell, × the original fp32, × low)
    low: str | None
    rival: str | None  # the fastest compressed model within the budget, else the fastest compressed model
    rival_cost: str
    rival_within: bool
    rival_ratio: float  # its mean latency ratio to the original fp32 across the cells
    rival_vs_best: float  # its mean latency ratio to ``best`` (1.0 without a best)
    rival_faster_somewhere: bool = False  # faster than ``best`` at one timed cell at least (not on average)


def case_verdict(case: CaseLike) -> CaseVerdict | None:
    """The verdict of one case of a run report (``None`` without a timed original): see :class:`CaseVerdict`."""
    case = case_result(case)
    bench = case.bench
    metrics = {m["model"]: m for m in bench.get("metrics") or ()}
    lat = bench.get("latency") or []
    if not lat or "original" not in metrics:
        return None
    provider = lat[0]["provider"]
    p50 = {(r["model"], cell_label(r)): r["stats"]["p50_ms"] for r in lat if r["provider"] == provider}
    cells = sorted({c for _, c in p50}, key=cell_order)
    ok = {m: _within_budget(metrics[m], metrics["original"]) for m in metrics}
    timed = [m for m in metrics if all((m, c) in p50 for c in cells)]
    measured = any(cost != "quality not measured" for _, cost in ok.values())

    def ratio(m: str, to: str = "original") -> float:  # mean latency ratio across the cells
        return sum(p50[(m, c)] / p50[(to, c)] for c in cells) / len(cells)

    fit = [m for m in timed if ok[m][0] or not measured]
    best = min(fit, key=ratio, default=None)
    low = next((b for b in ("original.int8", "original.fp16") if all((b, c) in p50 for c in cells)), None)
    speedups = [] if best is None else [
        (c, p50[("original", c)] / p50[(best, c)],
         p50[(low, c)] / p50[(best, c)] if low and low != best else None) for c in cells]
    rivals = [m for m in timed if not m.startswith("original")]
    rival = min(rivals, key=lambda m: (not ok[m][0], ratio(m)), default=None)
    return CaseVerdict(case.name, provider, best,
                       "" if best is None else ok[best][1] if measured else
                       "quality not measured: the fastest model overall", speedups, low, rival,
                       "" if rival is None else ok[rival][1], rival is not None and ok[rival][0],
                       1.0 if rival is None else ratio(rival),
                       1.0 if rival is None or best is None else ratio(rival, best),
                       rival is not None and best is not None and any(p50[(rival, c)] < p50[(best, c)] for c in cells))


def verdict_lines(report: ReportLike) -> list[str]:
    """One line per case: the fastest model within :data:`VERDICT_MAX_DROP_PP` of the original's held-out quality,
    against the original fp32 and the original's INT8 (or FP16), at each batch on the first provider; or, plainly,
    that nothing compressed beats the original's low-precision file."""
    report = run_report(report)
    out = []
    for v in filter(None, map(case_verdict, report.cases)):
        if v.best is None:
            out.append(f"- **{v.case}**: no model is within {VERDICT_MAX_DROP_PP:g} pp of the "
                       "original's held-out quality")
            continue
        versus = "; ".join(f"batch {c}: {fp32:.2f}× the original fp32" + (f", {low:.2f}× {v.low}" if low else "")
                           for c, fp32, low in v.speedups)
        head = (f"fastest within {VERDICT_MAX_DROP_PP:g} pp: **{v.best}**" if not v.best.startswith("original") else
                f"nothing compressed beats the original within {VERDICT_MAX_DROP_PP:g} pp; fastest: **{v.best}**")
        out.append(f"- **{v.case}** ({v.provider}): {head} ({v.cost}); {versus} (speed-ups, p50)")
    return out


def warning_kind(warning: str) -> str:
    """A warning's kind: the text before its first colon (the whole text when it has none)."""
    return warning.partition(":")[0].strip()


def grouped_warnings(warnings: list[str]) -> list[str]:
    """One report.md line per kind of warning (:func:`warning_kind`): how many, and the first; every warning in full
    is in report.json (``cases[].warnings``)."""
    kinds: dict[str, list[str]] = {}
    for w in warnings:
        kinds.setdefault(warning_kind(w), []).append(w)
    return [f"- **WARNING** {items[0]}" if len(items) == 1 else
            f"- **WARNING** {kind} ({len(items)}×; all in report.json), e.g. "
            f"{items[0].partition(':')[2].strip() or items[0]}" for kind, items in kinds.items()]


def _warnings_in_full(warnings: list[str]) -> list[str]:
    """Every warning of a case, in full, folded under one line (the console shows only counts per kind)."""
    if not warnings:
        return []
    return ["", f"<details><summary>All {len(warnings)} warning(s) in full</summary>", "",
            *(f"- {w}" for w in warnings), "", "</details>"]


def _tensorrt_meant(report: RunReport, variant: VariantRecord) -> bool:
    """Whether a file is meant for TensorRT: tensorrt among the run's providers, or INT8 in TensorRT's format."""
    config = report.config or {}
    q = variant.quantization or {}
    return "tensorrt" in (config.get("providers") or ()) or q.get("target") == "tensorrt"


def render_markdown(report: ReportLike) -> str:
    """``report.md``: one verdict line per case, the summary table, per-case notes, INT8 kernel counts, warnings
    grouped by kind."""
    report = run_report(report)
    out = ["# minreal run report", "", f"Created {report.created_utc} UTC.", ""]
    verdicts = verdict_lines(report)
    if verdicts:
        out += ["## Verdict", "", *verdicts, ""]
    out += ["| " + " | ".join(SUMMARY_HEADERS) + " |", "|" + "---|" * len(SUMMARY_HEADERS)]
    out += ["| " + " | ".join(r) + " |" for r in summary_rows(report)]
    if counted_at := macs_notes(report):
        out += ["", *(f"- {line}." for line in counted_at)]
    rec_rows = recovery_rows(report)
    if rec_rows:
        out += ["", "## Recovery: zero-shot vs recovered (held-out data, torch)", "",
                "| " + " | ".join(RECOVERY_HEADERS) + " |", "|" + "---|" * len(RECOVERY_HEADERS)]
        out += ["| " + " | ".join(r) + " |" for r in rec_rows]
    q_rows = int8_rows(report)
    if q_rows:
        out += ["", "## INT8 of the quantisation-aware weights: calibrated afresh vs trained ranges "
                "(ORT, held-out data)",
                "", "A float recovery with post-training INT8 at the same budget is what `run` gives without "
                "`--recover-int8`.", "",
                "| " + " | ".join(INT8_HEADERS) + " |", "|" + "---|" * len(INT8_HEADERS)]
        out += ["| " + " | ".join(r) + " |" for r in q_rows]
    out += _mobile_section(report)
    out += _ort_section(report)
    out += _fp16_section(report)
    for case in report.cases:
        out += ["", f"## {case.name}", ""]
        for v in case.variants:
            comp = variant_compression(v)
            if comp:
                pred = ", ".join(f"{k}={val:.4g}" for k, val in comp.predicted.items()
                                 if isinstance(val, (int, float)))
                meas = ", ".join(f"{k}={val:.4g}" for k, val in comp.measured.items()
                                 if isinstance(val, (int, float)))
                held = ", ".join(f"{k}={val:.4g}" for k, val in (comp.measured.held_out or {}).items())
                out.append(f"- **{v.label}** ({v.method}): predicted {pred or '-'}; "
                           f"measured on calibration data {meas or '-'}; on held-out data {held or '-'}")
                out += _budget_and_bounds(v.label, comp)
                out += _recovery_line(v.label, comp.recovery)
            skipped_fp16 = (v.fp16 or {}).get("skipped")
            if skipped_fp16:
                out.append(f"- **{v.label}**: FP16 skipped: {skipped_fp16}")
            q = v.quantization
            if q and "skipped" in q:
                out.append(f"- **{v.label}**: INT8 skipped: {q['skipped']}")
            elif q:
                nonfinite = q.get("nonfinite_nodes") or []
                out.append(f"- **{v.label}**: {_int8_kind(q)} {q.get('mode', '')} for {q.get('target', '')}"
                           f"{format_suffix(q)}, integer kernels {q.get('integer_kernels', '-')}, float kernels left "
                           f"{q.get('float_kernels', '-')}"
                           + (f"; left in float because calibration met an infinite value (e.g. a -inf attention "
                              f"mask): {node_names(nonfinite)}" if nonfinite else "")
                           + dropped_suffix(q.get("roundtrip_nodes") or [])
                           + roundtrip_suffix(q.get("float_roundtrips") or {}))
        for v in case.variants:
            if _tensorrt_meant(report, v):
                out += tensorrt_lines(v.label, v.tensorrt_readiness)
        for u in case.bench.get("unavailable", []):
            out.append(f"- provider **{u['provider']}** unavailable: {u['reason']}")
        out += [f"- note: {n}" for n in case.notes]
        out += grouped_warnings(list(case.warnings))
        out += _warnings_in_full(list(case.warnings))
    return "\n".join(out) + "\n"


def tensorrt_lines(label: str, readiness: Mapping[str, Any] | None) -> list[str]:
    """report.md lines of one variant's TensorRT findings (:mod:`minreal.export.readiness`): a heading, then one line
    per grouped finding; a report written before findings were grouped (one issue per node) shows its first few."""
    from minreal.export.readiness import EXAMPLE_NODES

    if not readiness or readiness.get("ready", True):
        return []
    if "findings" in readiness:
        lines = [f["message"] for f in readiness["findings"]]
    else:
        issues = list(readiness.get("issues", []))
        more = len(issues) - EXAMPLE_NODES
        lines = issues[:EXAMPLE_NODES] + ([f"... and {more} more"] if more > 0 else [])
    found = readiness.get("tensorrt") or {}
    lines += [f"TensorRT parser: node {i.get('node')!r} ({i.get('op')}): {i.get('reason')}"
              for i in found.get("unsupported", [])]
    lines += [f"TensorRT {b.get('precision')} engine: "
              f"{b.get('error') or b.get('parity_skipped') or 'outputs differ from ONNX Runtime beyond tolerance'}"
              for b in found.get("builds", []) if not b.get("passed", False)]
    checker = f" (decided by {readiness['checker']})" if readiness.get("checker") else ""
    return [f"- **{label}** not TensorRT-ready{checker}:", *(f"  - {line}" for line in lines)]


def _shapes_cell(v: VariantRecord, dynamic: list[str]) -> str:
    """``input 1x3x32x32`` for a fixed-shape file, else which inputs are dynamic."""
    fixed = v.fixed_shapes
    if fixed:
        return ", ".join(f"{n} {'x'.join(map(str, s))}" for n, s in fixed["input_shapes"].items())
    return f"dynamic ({', '.join(dynamic)})" if dynamic else "fixed"


def mobile_rows(report: ReportLike) -> list[tuple[str, ...]]:
    """One row per exported model with ONNX Runtime's mobile-usability verdict (:mod:`minreal.export.mobile`): nodes
    NNAPI and CoreML would run and in how many partitions, the ops they lack, and the checker's advice."""
    report = run_report(report)
    from minreal.export.mobile import ep_summary, unsupported_summary, usability_from_dict

    rows = []
    for case in report.cases:
        for v in case.variants:
            raw = v.mobile
            if not raw:
                continue
            m = usability_from_dict(raw)
            cells = [ep_summary(e) for e in m.eps.values()] if not m.error else ["-"] * 3
            rows.append((case.name, v.label, _shapes_cell(v, m.dynamic_inputs), *cells,
                         unsupported_summary(m), m.error or m.recommendation))
    return rows


def _mobile_section(report: RunReport) -> list[str]:
    """report.md lines of :func:`mobile_rows` (none when no record has a verdict)."""
    rows = mobile_rows(report)
    if not rows:
        return []
    return ["", "## Mobile (NNAPI / CoreML): ONNX Runtime's usability checker", "",
            "Nodes each accelerator would run (op support by type, as `python -m onnxruntime.tools."
            "check_onnx_model_mobile_usability`); NNAPI runs no node fed by a dynamic shape: export with "
            "`--fixed-shapes batch=1` for a phone.", "",
            "| " + " | ".join(MOBILE_HEADERS) + " |", "|" + "---|" * len(MOBILE_HEADERS),
            *("| " + " | ".join(r) + " |" for r in rows)]


def ort_rows(report: ReportLike) -> list[tuple[str, ...]]:
    """One row per ORT-format copy (:mod:`minreal.export.ort_format`): its file and size beside the ``.onnx`` file's,
    the converter's level, style and platform, how many operators its configuration lists, and its parity."""
    report = run_report(report)
    rows = []
    for case in report.cases:
        for v in case.variants:
            o = v.ort
            if not o:
                continue
            p = o["parity"]
            rows.append((case.name, v.label, o["path"], f"{o['bytes'] / 1024:.1f}",
                         f"{v.onnx_bytes / 1024:.1f}",
                         f"{o['optimization']}, {o['style']}, for {o.get('target_platform') or 'any'}",
                         str(len(o["operators"])), p["against"], f"{p['max_abs_err']:.3g}",
                         ", ".join(map(str, p["batch_sizes"]))))
    return rows


def ort_line(case: CaseLike) -> str | None:
    """One console line on a case's ORT-format files and their merged configuration (``None`` without)."""
    case = case_result(case)
    files = [v.ort for v in case.variants]
    names = [o["path"] for o in files if o]
    config = case.ort_config
    if not names or not config:
        return None
    return f"[{case.name}] ORT format: {', '.join(names)} (parity ok); operators of all of them: {config}"


def ort_fp16_note(report: ReportLike) -> str | None:
    """:data:`ORT_FP16_NOTE` for a run that wrote ORT-format files and FP16 files (once for the run), else ``None``."""
    report = run_report(report)
    variants = [v for case in report.cases for v in case.variants]
    if any(v.ort for v in variants) and any(v.method.endswith("+fp16") for v in variants):
        return ORT_FP16_NOTE
    return None


def _ort_section(report: RunReport) -> list[str]:
    """report.md lines of :func:`ort_rows` and each case's merged configuration (none without ORT-format files)."""
    rows = ort_rows(report)
    if not rows:
        return []
    merged = [f"- {c.name}: `{c.name}/{c.ort_config}`"
              for c in report.cases if c.ort_config]
    fp16 = ["", f"{note}."] if (note := ort_fp16_note(report)) else []
    return ["", "## ORT format: files for ONNX Runtime's minimal build", "",
            "Each `.ort` file was loaded by ONNX Runtime and checked against torch (INT8: against its `.onnx` file); "
            "its operators are in `NAME.required_operators.config`, those of every file of a case in one "
            "configuration (build with `--minimal_build --include_ops_by_config FILE`):", "", *merged, "",
            "| " + " | ".join(ORT_HEADERS) + " |", "|" + "---|" * len(ORT_HEADERS),
            *("| " + " | ".join(r) + " |" for r in rows), *fp16]


def _counts(ops: dict[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in sorted(ops.items())) or "none"


def fp16_rows(report: ReportLike) -> list[tuple[str, ...]]:
    """One row per FP16 copy (:mod:`minreal.export.fp16`): its parity against the fp32 file (status, worst error on the
    output's scale, rtol), sizes, the nodes the converter kept in float32 and what the parity provider runs in
    float32 anyway (ONNX Runtime's CPU provider casts most float16 ops to float32)."""
    report = run_report(report)
    rows = []
    for case in report.cases:
        for v in case.variants:
            f = v.fp16 or {}
            if "parity" not in f:
                continue
            parity, precisions = f["parity"], f.get("provider_precisions") or {}
            ran_fp32 = _counts(precisions["float32"]) if precisions else "-"
            rows.append((case.name, v.label, str(f["fp32_path"]),
                         "fp32" if f.get("keep_io_types", True) else "fp16",
                         f"{parity['status']} ({parity['provider']})",
                         _fmt(parity.get("max_scaled_err"), ".3g"), f"{parity['rtol']:.3g}",
                         f"{f['size_fp16_bytes'] / 1024:.1f}", f"{f['size_fp32_bytes'] / 1024:.1f}",
                         _counts(f.get("fp32_nodes") or {}), ran_fp32))
    return rows


def _fp16_section(report: RunReport) -> list[str]:
    """report.md lines of :func:`fp16_rows` (none when the run made no FP16 copy)."""
    rows = fp16_rows(report)
    if not rows:
        return []
    return ["", "## FP16 copies: parity against the fp32 file", "",
            "An element passes when |fp16 - fp32| <= rtol·|fp32| + atol_scale·max|fp32| of its output (both 10 × "
            "float16's epsilon 2^-10 by default). ONNX Runtime's CPU provider runs most float16 ops in float32 "
            "(last column), so parity on CPU checks the conversion and the weights' rounding, not float16 "
            "arithmetic.", "",
            "| " + " | ".join(FP16_HEADERS) + " |", "|" + "---|" * len(FP16_HEADERS),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _metric(before: dict[str, float], after: dict[str, float]) -> tuple[str, str, str]:
    """(name, zero-shot, recovered) of the task metric: accuracy in %, or MSE, or MSE to the original."""
    for key, name, scale, spec in (("accuracy", "accuracy %", 100.0, ".2f"), ("mse", "MSE", 1.0, ".4g"),
                                   ("mse_to_original", "MSE to original", 1.0, ".4g")):
        if key in before and key in after:
            return name, format(scale * before[key], spec), format(scale * after[key], spec)
    return "-", "-", "-"


def recovery_rows(report: ReportLike) -> list[tuple[str, ...]]:
    """One row per recovered variant: its zero-shot and recovered quality side by side on the run's held-out
    data (``measured.held_out_zero_shot``/``held_out_recovered``), and what the recovery cost."""
    report = run_report(report)
    rows = []
    for case in report.cases:
        for v in case.variants:
            comp = variant_compression(v)
            rec = comp.recovery if comp else None
            if not comp or not rec or not comp.measured.held_out_recovered:
                continue
            before, after = comp.measured.held_out_zero_shot, comp.measured.held_out_recovered
            status = ("interrupted" if rec.get("interrupted") else "stopped early" if rec.get("stopped_early")
                      else "budget spent")
            rows.append((case.name, v.label, *_metric(before, after),
                         _fmt(before.get("agreement"), ".4f"), _fmt(after.get("agreement"), ".4f"),
                         _fmt(before.get("kl"), ".4g"), _fmt(after.get("kl"), ".4g"), str(rec.get("epochs", 0)),
                         str(rec.get("steps", 0)), str(rec.get("samples_seen", 0)), f"{rec.get('wall_s', 0.0):.1f}",
                         status))
    return rows


def _titled_table(title: str, headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A console table under a title line, or "" when there are no rows."""
    return f"{title}\n{_text_table(headers, rows)}" if rows else ""


def format_recovery(report: ReportLike) -> str:
    """Console table of :func:`recovery_rows` ("" when no variant was recovered)."""
    return _titled_table("recovery: zero-shot vs recovered on the held-out data (torch)", RECOVERY_HEADERS,
                         recovery_rows(report))


def _int8_kind(q: dict[str, Any]) -> str:
    """How an INT8 copy got its activation ranges."""
    if q.get("range_source") == "trained":
        return f"INT8 (quantisation-aware, trained ranges: {q.get('trained_ranges', 0)} tensors)"
    return "INT8 (post-training, calibrated)"


def _percent(fraction: float | None) -> str:
    return _fmt(None if fraction is None else 100 * fraction, ".2f")


def int8_rows(report: ReportLike) -> list[tuple[str, ...]]:
    """One row per variant recovered quantisation-aware: its post-training INT8 copy (calibrated afresh) and its
    quantisation-aware one (trained ranges), both of the same recovered weights, side by side as measured by the
    benchmark (accuracy, top-1 agreement, MSE)."""
    report = run_report(report)
    rows = []
    for case in report.cases:
        metrics = {m["model"]: m for m in case.bench["metrics"]}
        quantized = [(v.label, q) for v in case.variants if (q := v.quantization)]
        for label, q in quantized:
            ptq = [lab for lab, other in quantized if other.get("fp32_path") == q.get("fp32_path")
                   and other.get("range_source") != "trained"]
            if q.get("range_source") != "trained" or not ptq:
                continue
            a, b = metrics.get(ptq[0], {}), metrics.get(label, {})
            rows.append((case.name, str(q.get("fp32_path")), str(q.get("target")), ptq[0], label,
                         _percent(a.get("accuracy")), _percent(b.get("accuracy")),
                         _fmt(a.get("top1_agreement"), ".4f"), _fmt(b.get("top1_agreement"), ".4f"),
                         _fmt(a.get("mse"), ".4g"), _fmt(b.get("mse"), ".4g"), str(q.get("trained_ranges", 0))))
    return rows


def format_int8(report: ReportLike) -> str:
    """Console table of :func:`int8_rows` ("" when no variant was recovered quantisation-aware)."""
    return _titled_table("INT8 of the same quantisation-aware weights: ranges calibrated afresh vs trained (a float "
                         "recovery + post-training INT8 is what run gives without --recover-int8)", INT8_HEADERS,
                         int8_rows(report))


def _recovery_line(label: str, rec: dict[str, Any] | None) -> list[str]:
    """``zero-shot … → recovered …`` on the recovery's validation split (a seeded part of the training data the
    method calibrated on but the recovery did not train on); the run's held-out numbers are in the recovery table.
    Also the feature points that were skipped (the exported model is the recovered one)."""
    if not rec:
        return []
    before, after = rec.get("before", {}), rec.get("after", {})
    keys = [k for k in ("accuracy", "agreement", "kl", "mse", "mse_to_original") if k in before and k in after]
    pairs = "; ".join(f"{k} {before[k]:.4g} → {after[k]:.4g}" for k in keys) or "-"
    where = ("training data (too few samples to hold out)" if rec.get("held_out_is_training_data")
             else f"its validation split ({rec.get('held_out_samples', 0)} samples of the training data)")
    flags = ((", stopped early" if rec.get("stopped_early") else "")
             + (", INTERRUPTED" if rec.get("interrupted") else ""))
    skipped = rec.get("feature_points_skipped") or {}
    notes = [f"- **{label}** recovery matched no features at {n}: {why}" for n, why in skipped.items()]
    return [f"- **{label}** recovery: zero-shot → recovered on {where}: {pairs} ({rec.get('epochs', 0)} epochs, "
            f"{rec.get('steps', 0)} steps, {rec.get('wall_s', 0.0):.1f} s{flags}); the exported model is the "
            "recovered one", *notes]


def _budget_and_bounds(label: str, comp: CompressionReport | Mapping[str, Any]) -> list[str]:
    """Report lines: the whole-model budget asked for and reached, and the typed error bounds (of a report or its
    JSON)."""
    if not isinstance(comp, CompressionReport):
        comp = CompressionReport.from_json(comp)
    out = []
    budget = comp.predicted.budget
    if budget:
        flag = "--" + budget["kind"].replace("_", "-")
        out.append(f"- **{label}** budget {flag} {budget['requested']:g}: whole-model ratio reached "
                   f"{_fmt(budget.get('achieved'), '.4f')}")
    bounds = comp.bounds
    if bounds:
        shown = (f"{k}={v:.4g}" if v is not None else f"{k}=none (no bound holds for this variant)"
                 for k, v in bounds.items())
        out.append(f"- **{label}** error bounds: " + ", ".join(shown))
    return out


def spectra_layers(report: ReportLike) -> list[tuple[str, str, dict[str, list[float]]]]:
    """(case, layer, {test: eigenvalues}) for every layer in a compression report's typed ``spectra`` field."""
    report = run_report(report)
    out = []
    for case in report.cases:
        for v in case.variants:
            comp = variant_compression(v)
            for layer, spectra in (comp.spectra if comp else {}).items():
                if spectra:
                    out.append((case.name, f"{v.label}: {layer}", spectra))
    return out
