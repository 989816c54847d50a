"""A run's results sized for one screen (the demo's console): every line at most :data:`SCREEN_COLUMNS` wide, the
table with short column names, units in its title and numbers rounded to what a reader compares. The full-width
tables stay in ``report.md`` and every number in ``report.json``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from minreal.app.report import cell_label, cell_order
from minreal.app.run_report import CaseResult, ReportLike, run_report
from minreal.export.variant import FP16_LABEL_SUFFIX
from minreal.facts import int8_source

__all__ = ["SCREEN_COLUMNS", "cell_header", "clip", "clip_label", "first_fitting", "screen_table", "width"]

SCREEN_COLUMNS = 100
"""What a brief console (the demo's) keeps every line within, whether or not stdout is a terminal (:func:`width`)."""


def width(line: str) -> int:
    """A line's width as the bytes of its UTF-8: never less than the characters a terminal shows, and what byte-wise
    tools (``awk '{print length($0)}'`` in most locales) count, so a line within it fits either way (``µ``, ``×``
    and ``…`` count 2 or 3)."""
    return len(line.encode("utf-8"))


def clip(line: str, columns: int | None) -> str:
    """``line`` cut to ``columns`` (:func:`width`), its end ``…`` when cut (``None``: as it is)."""
    if columns is None or width(line) <= columns:
        return line
    cut = line[:columns]
    while cut and width(cut) + width("…") > columns:
        cut = cut[:-1]
    return cut + "…"


def first_fitting(candidates: Iterable[str], columns: int | None) -> str:
    """The first of ``candidates`` (longest wording first) that fits ``columns``, else the last one clipped."""
    last = ""
    for last in candidates:
        if columns is None or width(last) <= columns:
            return last
    return clip(last, columns)


def clip_label(label: str, columns: int) -> str:
    """A model's label cut to ``columns`` characters (not :func:`width`: a table aligns characters) in its middle,
    where labels share the least (``ssm t…50%``), its precision suffix kept (``ssm…50%.int8``; ``.int8``,
    ``.ptq.int8``, ``.fp16``)."""
    if len(label) <= columns:
        return label
    fp16 = label.endswith(FP16_LABEL_SUFFIX)
    source = int8_source(label) or (label.removesuffix(FP16_LABEL_SUFFIX) if fp16 else label)
    keep = columns - len(label) + len(source) - 1  # characters of the source kept around the "…"
    if keep < 2:
        return label[: columns - 1] + "…"
    return f"{source[: keep - keep // 2]}…{source[len(source) - keep // 2:]}{label[len(source):]}"


def _thousands(n: int) -> str:
    """``26.1k``, ``217k``, ``4.8k``, ``950``: a parameter count to three significant digits."""
    return str(n) if n < 1000 else f"{n / 1000:.3g}k" if n < 999_500 else f"{n / 1e6:.3g}M"


def _millis(ms: float | None) -> str:
    """A p50 latency in ms to about three significant digits, at most four decimals: ``0.0079``, ``0.315``, ``9.96``,
    ``51.4``, ``581``; rounded before the decimals are chosen (``99.97`` is ``100``, ``9.996`` is ``10.0``)."""
    if ms is None:
        return "-"
    if ms <= 0:
        return "0"
    ms = float(f"{ms:.3g}")
    return f"{ms:.{min(4, max(0, 2 - math.floor(math.log10(ms))))}f}"


def cell_header(label: str) -> str:
    """``b32`` for batch 32; ``b32 s64`` for batch 32 at ``seq=64`` (each shape dimension by its first letter)."""
    batch, _, shape = label.partition(" ")
    dims = [f"{dim[:1]}{value}" for dim, _, value in (part.partition("=") for part in shape.split())]
    return " ".join([f"b{batch}", *dims])


def _cell_headers(cells: Iterable[str]) -> list[str]:
    """The latency columns' headers, the statistic and unit on the first: ``p50 ms b1``, ``b32`` (the table's title
    names them too, for a table too narrow for them)."""
    return [f"p50 ms {h}" if i == 0 else h for i, h in enumerate(map(cell_header, cells))]


def _quality(m: Mapping[str, Any]) -> tuple[str, str]:
    """(accuracy in %, MSE) as table cells."""
    acc, mse = m.get("accuracy"), m.get("mse")
    return ("-" if acc is None else f"{100 * acc:.2f}", "-" if mse is None else f"{mse:.2g}")


def _case_rows(case: CaseResult, provider: str,
               keep: Callable[[str, str], bool] | None) -> tuple[tuple[str, ...], list[list[str]]]:
    """A case's timed cells on ``provider`` and one row per timed model (those ``keep`` accepts)."""
    lat = [r for r in case.bench.get("latency") or () if r["provider"] == provider]
    cells = tuple(sorted({cell_label(r) for r in lat}, key=cell_order))
    p50 = {(r["model"], cell_label(r)): r["stats"]["p50_ms"] for r in lat}
    metrics = {m["model"]: m for m in case.bench.get("metrics") or ()}
    variants = {v.label: v for v in case.variants}
    base_macs = max(case.variants[0].macs, 1) if case.variants else 1
    rows = []
    for model in dict.fromkeys(r["model"] for r in lat):
        if model not in variants or (keep is not None and not keep(case.name, model)):
            continue
        v = variants[model]
        rows.append([case.name, model, _thousands(v.params), f"{100 * v.macs / base_macs:.0f}",
                     f"{v.onnx_bytes / 1024:.0f}", *(_millis(p50.get((model, c))) for c in cells),
                     *_quality(metrics.get(model, {}))])
    return cells, rows


def _aligned(headers: list[str], rows: list[list[str]], columns: int | None, short: list[str]) -> list[str]:
    """``headers`` and ``rows`` as text, names left-aligned and numbers right-aligned, the quality columns no row
    fills left out. Where a line does not fit ``columns``: the ``short`` headers instead, then names cut in their
    middle (:func:`clip_label`), the model's to 12 characters, then the case's to 8, then the model's to its header."""
    empty = {i for i in (len(headers) - 2, len(headers) - 1) if all(r[i] == "-" for r in rows)}
    table = [[c for i, c in enumerate(r) if i not in empty] for r in [headers, *rows]]
    widths: list[int] = []

    def render() -> list[str]:
        return ["  ".join(clip_label(c, w).ljust(w) if i < 2 else c.rjust(w)
                          for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in table]

    for head in (headers, short):
        table[0] = [c for i, c in enumerate(head) if i not in empty]
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        lines = render()
        if columns is None or max(map(width, lines)) <= columns:
            return lines
    for column, floor in ((1, 12), (0, 8), (1, len(headers[1]))):
        while columns is not None and (over := max(map(width, lines)) - columns) > 0 and widths[column] > floor:
            widths[column] = max(floor, widths[column] - over)
            lines = render()
    return [clip(line, columns) for line in lines]


def _title(provider: str, tables: Iterable[tuple[str, ...]], columns: int | None) -> str:
    """The tables' one title line: the provider and the units (a shape dimension's letter, when there is one)."""
    dims = sorted({dim for cells in tables for c in cells for dim, _, _ in
                   (part.partition("=") for part in c.partition(" ")[2].split())})
    shapes = "".join(f", {dim[:1]}: {dim}" for dim in dims)
    return clip(f"provider {provider}; p50 latency in ms at batch size b{shapes}; MACs in % of the original's; "
                "accuracy in %", columns)


def screen_table(report: ReportLike, keep: Callable[[str, str], bool] | None = None,
                 columns: int | None = SCREEN_COLUMNS) -> str:
    """One row per (case, model) timed on the run's first provider (only the pairs ``keep`` accepts, when given):
    parameters, MACs in % of the original's, file KB, p50 latency in ms per timed cell (the unit in the first one's
    header, ``p50 ms b1``), held-out accuracy in % and
    MSE; a title line with the units. Cases timed at different cells get a table each; every line fits
    ``columns``."""
    report = run_report(report)
    lat = [r for case in report.cases for r in case.bench.get("latency") or ()]
    provider = lat[0]["provider"] if lat else "cpu"
    tables: dict[tuple[str, ...], list[list[str]]] = {}
    for case in report.cases:
        cells, rows = _case_rows(case, provider, keep)
        if rows:
            tables.setdefault(cells, []).extend(rows)
    head = ["case", "model", "params", "MACs %", "KB"]
    texts = ["\n".join(_aligned([*head, *_cell_headers(cells), "acc %", "MSE"], rows, columns,
                                 [*head, *map(cell_header, cells), "acc %", "MSE"])) for cells, rows in tables.items()]
    return _title(provider, tables, columns) + "".join(f"\n{t}" if i == 0 else f"\n\n{t}" for i, t in enumerate(texts))
