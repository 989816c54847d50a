"""What a tune leaves in its directory: ``report.json``, ``report.md``, ``front.png``, the chosen files
(``chosen.onnx``, ``chosen.pt2``, ``chosen.ort``), and the console table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from minreal.compress.core.data import Dataset
from minreal.export.int8 import target_format
from minreal.export.json_safe import to_jsonable
from minreal.export.verify import feeds_of
from minreal.runtime_bench.atomic import atomic_path

from .config import Constraint, TuneConfig
from .model import Candidate, Progress, TuneReport

__all__ = ["write_tune_dir", "plot_tune", "candidate_headers", "candidate_rows", "format_tune", "render_tune_markdown",
           "int8_format_line", "ort_line", "CANDIDATE_HEADERS", "ORT_KB_HEADER", "write_chosen", "write_chosen_ort"]

CANDIDATE_HEADERS = ("model", "kind", "precision", "MAC ratio", "recovery", "KB", "gzip KB", "accuracy", "agreement",
                     "MSE", "loss", "meets", "screen p50 ms", "confirmed p50 ms", "front", "chosen")
ORT_KB_HEADER = ".ort KB"
"""The column after ``gzip KB`` of a tune whose files were converted to judge ``--max-size`` on their ``.ort`` size
(``--format onnx,ort`` with ``--max-size``); absent otherwise."""
_AFTER = CANDIDATE_HEADERS.index("gzip KB") + 1


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _has_ort_sizes(report: TuneReport) -> bool:
    return any(c.ort_bytes is not None for c in report.candidates)


def candidate_headers(report: TuneReport) -> tuple[str, ...]:
    """:data:`CANDIDATE_HEADERS`, with :data:`ORT_KB_HEADER` after ``gzip KB`` where files have an ``.ort`` size."""
    if not _has_ort_sizes(report):
        return CANDIDATE_HEADERS
    return (*CANDIDATE_HEADERS[:_AFTER], ORT_KB_HEADER, *CANDIDATE_HEADERS[_AFTER:])


def candidate_rows(report: TuneReport) -> list[tuple[str, ...]]:
    """One row per deployable file, in the report's order, under :func:`candidate_headers`; latencies of the first
    (provider, batch) cell."""
    cells = [f"{p}/b{b}" for p in report.config["providers"] for b in report.config["batch_sizes"]]
    cell, on_front = cells[0], {lb for labels in report.front.values() for lb in labels}
    ort = _has_ort_sizes(report)
    rows = []
    for c in report.candidates:
        acc = c.quality.get("accuracy")
        row = (c.label, c.kind, c.precision, f"{c.mac_ratio:.3f}", str(c.recover_epochs),
               f"{c.onnx_bytes / 1024:.1f}", _fmt(c.gzip_bytes / 1024 if c.gzip_bytes else None, ".1f"),
               _fmt(None if acc is None else 100 * acc, ".2f"),
               _fmt(c.quality.get("top1_agreement"), ".4f"), _fmt(c.quality.get("mse"), ".4g"),
               _fmt(c.loss, ".3g"), "yes" if c.feasible else "no", _fmt(c.screen_ms.get(cell), ".4g"),
               _fmt(c.confirm_ms.get(cell), ".4g"), "*" if c.label in on_front else "",
               "<==" if c.label == report.chosen else "")
        if ort:
            kb = _fmt(None if c.ort_bytes is None else c.ort_bytes / 1024, ".1f")
            row = (*row[:_AFTER], kb, *row[_AFTER:])
        rows.append(row)
    return rows


def _text_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    from minreal.app.report import _text_table as table

    return table(headers, rows)


def int8_format_line(report: TuneReport) -> str:
    """``INT8 files: arm64 (S8S8: symmetric int8 activations, ...)``: the format of the tune's INT8 files (its
    ``quant_target``, ``cpu`` already resolved; a note says when accuracy control fell back to cpu-avx2); ``""``
    without INT8."""
    if not report.config.get("int8"):
        return ""
    target = report.config["quant_target"]
    return f"INT8 files: {target} ({target_format(target)})"


def ort_line(report: TuneReport) -> str:
    """``ORT format: wrote chosen.ort (...)``: the chosen file's ORT-format copy, its configuration and parity
    (``--format onnx,ort``), or that nothing was chosen and so nothing converted; ``""`` without ``--format ort``."""
    from minreal.export.ort_format import ort_summary

    if report.chosen_ort:
        gz = report.chosen_ort.get("gzip_bytes")
        return f"ORT format: {ort_summary(report.chosen_ort)}" + (f"; gzip {gz / 1024:.1f} KB" if gz else "")
    if report.config.get("ort"):
        return "ORT format: no model was chosen, so nothing was converted"
    return ""


def format_tune(report: TuneReport) -> str:
    """Console view: the candidates table, the INT8 format, the fronts and the verdict."""
    first = f"{report.config['providers'][0]}/b{report.config['batch_sizes'][0]}"
    lines = [f"tune: {report.constraint}; latencies on {first} (loss: pp of accuracy, 1 - agreement, or MSE "
             "increase vs the original)", _text_table(candidate_headers(report), candidate_rows(report))]
    if line := int8_format_line(report):
        lines.append(line)
    lines += [f"front {cell}: {' < '.join(labels) or '-'}" for cell, labels in report.front.items()]
    lines.append(f"verdict: {report.verdict}")
    if line := ort_line(report):
        lines.append(line)
    return "\n".join(lines)


def render_tune_markdown(report: TuneReport) -> str:
    """``report.md`` of a tune."""
    out = ["# minreal tune report", "", f"Created {report.created_utc} UTC; constraint: {report.constraint}; "
           f"objective: {report.config['objective']}; {report.wall_s:.0f} s.", "", f"**Verdict:** {report.verdict}", "",
           "| " + " | ".join(candidate_headers(report)) + " |", "|" + "---|" * len(candidate_headers(report))]
    out += ["| " + " | ".join(r) + " |" for r in candidate_rows(report)]
    if line := int8_format_line(report):
        out += ["", line]
    out += _ort_section(report)
    out += ["", "## Pareto fronts (screened latency vs quality, candidates that meet the constraint)", ""]
    out += [f"- {cell}: {' < '.join(labels) or '-'}" for cell, labels in report.front.items()]
    out += ["", "## Searches (MAC-ratio bisection on held-out quality in torch)", ""]
    for s in report.searches:
        if s["recover_epochs"]:
            continue
        probes = ", ".join(f"{p['budget']:g}{'✓' if p['ok'] else '✗'}" for p in s["probes"])
        extra = ("" if s["monotone"] else "; not monotone, so the whole grid was evaluated") + \
            (f"; abandoned: {s['abandoned']}" if s.get("abandoned") else "")
        out.append(f"- **{s['method']}**, zero-shot: {probes or '-'}; smallest feasible "
                   f"{_fmt(s['smallest_feasible'], 'g')}{extra}")
    out += _halving_lines(report.halving)
    if report.phases_s:
        out += ["", "## Wall time by phase (s)", "",
                ", ".join(f"{k} {v:.1f}" for k, v in report.phases_s.items()) + f"; total {report.wall_s:.1f}",
                "", "(prepare, realise, recover, measure and export are summed over candidates; the others are the "
                "tune's own steps)"]
    out += ["", "## Counts", "", ", ".join(f"{k} {v}" for k, v in report.counts.items())]
    out += [f"- note: {n}" for n in report.notes]
    return "\n".join(out) + "\n"


def _ort_section(report: TuneReport) -> list[str]:
    """report.md lines on ``chosen.ort`` (``--format onnx,ort``): the file, its parity and the minimal build's
    option; none without ``--format ort``."""
    line = ort_line(report)
    if not line:
        return []
    build = ("" if not report.chosen_ort else f" A minimal build of ONNX Runtime that runs it: `./build.sh "
             f"--minimal_build --include_ops_by_config {report.chosen_ort['config_path']}`.")
    return ["", "## ORT format (the chosen model)", "", line + "." + build]


def _halving_lines(halving: dict[str, Any] | None) -> list[str]:
    """The recovered candidates' race: per rung, each candidate's share of the recovery, loss and fate."""
    if not halving:
        return []
    eta = halving["eta"]
    out = ["", f"## Recovery by successive halving (eta {eta}: a candidate that meets the constraint is done; of "
           f"the others, 1/{eta} go on with {eta} times the recovery)", ""]
    screened = halving.get("screened") or []
    if screened:
        out.append("- structure screen (each method's smallest budget: p50 of its fastest file over the fastest "
                   "baseline that meets the constraint, by cell; a method faster in some cell races): "
                   + "; ".join(f"{e['method']}@{e['budget']:g} "
                               + (", ".join(f"{c} {r:.2f}x" for c, r in e["ratio"].items()) if e["ratio"]
                                  else "not timed")
                               + ("" if e["raced"] else " (not raced)") for e in screened))
    for i, rung in enumerate(halving["rungs"]):
        if not rung:
            continue
        share = rung[0]["fraction"]
        entries = "; ".join(f"{e['method']}@{e['budget']:g} loss {_fmt(e['loss'], '.3g')} {e['outcome']}" for e in rung)
        out.append(f"- rung {i + 1} ({share:.2g} of the cap, {rung[0]['samples']} samples): {entries}")
    extended = halving.get("extended") or []
    if extended:
        out.append("- by extension (the smallest budget of its method met the constraint before the full cap): "
                   + "; ".join(f"{m}@{b:g} entered rung {rung + 1}" for m, b, rung in extended))
    return out


def plot_tune(report: TuneReport, path: Path) -> Any:
    """``front.png``: one panel per (provider, batch) with the screened latency of every file that meets the
    constraint (one protocol for all, so the drawn front is the one the tune confirmed), the baselines marked and
    the chosen model ringed (chosen on the confirmed latencies of the front)."""
    from minreal.app.plots import PlotPoint, plot_front

    name = Constraint(**report.config["constraint"]).metric
    metric = {"accuracy": "accuracy", "agreement": "top1_agreement", "mse": "mse"}[name]
    points = []
    for c in report.candidates:
        value = c.quality.get(metric)
        for cell in report.front:
            ms = c.screen_ms.get(cell)
            if ms is None or value is None or not (c.feasible or c.kind == "baseline"):
                continue
            provider, batch = cell.split("/b")
            role = ("chosen" if c.label == report.chosen else "baseline-fp32" if c.label == "original" else
                    "baseline-int8" if c.label == "original.int8" else
                    "baseline-other" if c.kind == "baseline" else "candidate")
            points.append(PlotPoint("tune", c.label, provider, int(batch), ms, value,
                                    name, role))
    return plot_front(points, path, f"minreal tune: {report.constraint} (screened p50; chosen on the confirmed run)")


def write_tune_dir(report: TuneReport, folder: Path) -> None:
    """``report.json`` (paths relative to ``folder``), ``report.md`` and ``front.png`` into ``folder``."""
    data = to_jsonable(report)
    for c in data["candidates"]:
        for key in ("onnx", "pt2"):
            if c.get(key):
                c[key] = str(Path(c[key]).resolve().relative_to(Path(folder).resolve()))
    with atomic_path(folder / "report.json") as tmp:
        tmp.write_text(json.dumps(data, indent=2))
    with atomic_path(folder / "report.md") as tmp:
        tmp.write_text(render_tune_markdown(report))
    plot_tune(report, folder / "front.png")


def write_chosen(c: Candidate, folder: Path) -> None:
    """``chosen.onnx`` and, for an fp32 file with a program, ``chosen.pt2``: copies of the chosen file's."""
    shutil.copyfile(c.onnx, folder / "chosen.onnx")
    pt2 = c.pt2 if c.precision == "fp32" else None
    if pt2:
        shutil.copyfile(pt2, folder / "chosen.pt2")


def write_chosen_ort(chosen: Candidate | None, folder: Path, held_out: Dataset, cfg: TuneConfig,
                     notes: list[str], say: Progress) -> dict[str, Any] | None:
    """``chosen.ort`` and ``chosen.required_operators.config`` (``--format onnx,ort``), checked against ``chosen.onnx``
    on held-out rows at the parity batch sizes, converted for the platform of the tune's INT8 target
    (:func:`minreal.export.ort_format.ort_for_target`: ``arm`` for arm64, none otherwise), fp32 or INT8. Nothing chosen:
    nothing converted, and a note says so. With ``--max-size`` the chosen file's ``.ort`` size was judged already
    (:func:`.measure.ort_sizes`); a note says if this conversion's size differs."""
    from minreal.export.ort_format import ort_copy
    from minreal.export.variant import parity_inputs
    from minreal.runtime_bench.model_info import gzip_bytes

    if chosen is None:
        notes.append("--format onnx,ort: no model was chosen, so nothing was converted to ORT format")
        return None
    say("[tune] converting chosen.onnx to ORT format (chosen.ort) and checking it against chosen.onnx")
    feeds = [feeds_of(x) for x in parity_inputs(held_out.x, cfg.dynamic_axes or None)]
    record = ort_copy(folder / "chosen.onnx", feeds, cfg.ort, quant_target=cfg.quant_target)
    if chosen.ort_bytes is not None and record["bytes"] != chosen.ort_bytes:  # same file, same settings: the
        # converter is not known to vary, but --max-size judged the scratch copy, so a difference is told
        fits = "within" if cfg.fits(record["bytes"]) else "WARNING: over"
        note = (f"chosen.ort is {record['bytes']} bytes, not the {chosen.ort_bytes} bytes of the conversion --max-size "
                f"judged ({fits} --max-size {cfg.max_size_kb:g} KB)")
        notes.append(note)
        say(f"[tune] {note}")
    return {**record, "gzip_bytes": gzip_bytes([folder / record["path"]])}
