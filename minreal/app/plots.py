"""Quality/latency plots of a run or a tuning: one panel per (case, provider, batch size) with the models, the
baselines, the chosen model and the Pareto front.

The maths (:func:`pareto_front`, :func:`axis_scale`) is pure; :func:`plot_front` draws given points;
:func:`report_points` reads them off a run report; :func:`plot_accuracy_latency` is the run's ``plot.png``, and
:func:`plot_spectra` its ``spectra.png`` (the per-layer spectra a method reports, e.g. C-balanced's tests A, B, C).
Matplotlib is imported only where a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from minreal.app.report import spectra_layers
from minreal.app.run_report import ReportLike, run_report

__all__ = ["PlotPoint", "PanelInfo", "PlotInfo", "ROLES", "QUALITY_NAMES", "better_direction", "dominates",
           "pareto_front", "axis_scale", "report_points", "plot_front", "plot_accuracy_latency",
           "plot_spectra"]

Role = Literal["baseline-fp32", "baseline-int8", "baseline-other", "candidate", "chosen"]
ROLES: tuple[str, ...] = get_args(Role)
QUALITY_NAMES: tuple[str, ...] = ("accuracy", "mse", "agreement")

_AXIS_TITLES = {"accuracy": "accuracy % (higher is better)", "mse": "MSE (lower is better)",
                "agreement": "top-1 agreement with original (higher is better)"}
_BASELINE_STYLE = {"baseline-fp32": ("*", 260), "baseline-int8": ("s", 110), "baseline-other": ("D", 90)}
_CANDIDATE_MARKERS = ("o", "^", "v", "P", "X", "h")
_DPI = 110
_PANEL_WIDTH_IN, _PANEL_HEIGHT_IN, _LEGEND_ROW_IN = 5.2, 3.6, 0.2
_MAX_COLUMNS = 3
_LEGEND_TWO_COLUMN_CHARS = 26


@dataclass(frozen=True)
class PlotPoint:
    """One measured model in one panel: its p50 latency and its quality on the held-out data."""

    case: str
    label: str
    provider: str
    batch: int
    latency_ms: float
    quality: float
    quality_name: str
    """``accuracy`` (fraction), ``mse`` or ``agreement`` (top-1 agreement with the original, fraction)."""
    role: Role = "candidate"


@dataclass(frozen=True)
class PanelInfo:
    """What one panel shows, for tests and callers (no OCR needed)."""

    case: str
    provider: str
    batch: int
    quality_name: str
    legend: tuple[str, ...]
    """Model labels in legend order (baselines first), then ``Pareto front``."""
    front: tuple[str, ...]
    """Labels on the Pareto front, fastest first."""
    xscale: str
    yscale: str
    chosen: tuple[str, ...] = ()
    """Labels set in bold (and marked "(chosen)") in the legend."""


@dataclass(frozen=True)
class PlotInfo:
    """The written figure: its path, its size in pixels (width, height) and its panels."""

    path: Path
    size_px: tuple[int, int]
    panels: tuple[PanelInfo, ...]


def better_direction(quality_name: str) -> Literal["higher", "lower"]:
    """``lower`` for MSE, ``higher`` for accuracy and agreement."""
    if quality_name not in QUALITY_NAMES:
        raise ValueError(f"unknown quality {quality_name!r}; use one of {', '.join(QUALITY_NAMES)}")
    return "lower" if quality_name == "mse" else "higher"


def dominates(a: PlotPoint, b: PlotPoint, better: Literal["higher", "lower"]) -> bool:
    """``a`` is no slower and no worse than ``b``, and strictly faster or strictly better (Pareto dominance)."""
    sign = 1.0 if better == "higher" else -1.0
    qa, qb = sign * a.quality, sign * b.quality
    return a.latency_ms <= b.latency_ms and qa >= qb and (a.latency_ms < b.latency_ms or qa > qb)


def pareto_front(points: Sequence[PlotPoint], better: Literal["higher", "lower"]) -> list[PlotPoint]:
    """The points no other point dominates (lower latency and better quality), fastest first.

    Points with equal latency and quality dominate neither each other: all of them are on the front. Points
    whose latency or quality is not finite are left out.
    """
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    finite = [p for p in points if math.isfinite(p.latency_ms) and math.isfinite(p.quality)]
    front = [p for p in finite if not any(dominates(q, p, better) for q in finite)]
    sign = -1.0 if better == "higher" else 1.0
    return sorted(front, key=lambda p: (p.latency_ms, sign * p.quality))


def axis_scale(values: Iterable[float], decades: float = 1.0) -> str:
    """``log`` when the positive values span at least ``decades`` decades (max/min >= 10**decades), else
    ``linear``; ``symlog`` when they do but some values are zero or negative."""
    vals = [v for v in values if math.isfinite(v)]
    positive = [v for v in vals if v > 0]
    if len(positive) < 2 or max(positive) / min(positive) < 10.0 ** decades:
        return "linear"
    return "log" if len(positive) == len(vals) else "symlog"


def _role(label: str) -> Role:
    """The baselines of a run: the original in fp32, its INT8 copy and its other copies (FP16)."""
    if label == "original":
        return "baseline-fp32"
    if label == "original.int8":
        return "baseline-int8"
    return "baseline-other" if label.startswith("original.") else "candidate"


def _quality_name(metrics: Iterable[Mapping[str, Any]]) -> str | None:
    """The case's quality measure: accuracy if labelled classes, else MSE against targets, else agreement."""
    rows = list(metrics)
    for key, name in (("accuracy", "accuracy"), ("mse", "mse"), ("top1_agreement", "agreement")):
        if any(m.get(key) is not None for m in rows):
            return name
    return None


def report_points(report: ReportLike) -> list[PlotPoint]:
    """Every (case, model, provider, batch size) of a run report (its JSON read at the boundary,
    :func:`~minreal.app.run_report.run_report`) with its p50 latency and quality; models without a value of the
    case's quality measure are left out. Roles: baselines by label, else candidate."""
    key_of = {"accuracy": "accuracy", "mse": "mse", "agreement": "top1_agreement"}
    points = []
    for case in run_report(report).cases:
        bench = case.bench
        metrics = {m["model"]: m for m in bench.get("metrics", [])}
        name = _quality_name(metrics.values())
        if name is None:
            continue
        for lat in bench.get("latency", []):
            value = metrics.get(lat["model"], {}).get(key_of[name])
            if value is not None and lat["stats"].get("p50_ms") is not None:
                points.append(PlotPoint(case.name, lat["model"], lat["provider"], int(lat["batch_size"]),
                                        float(lat["stats"]["p50_ms"]), float(value), name, _role(lat["model"])))
    return points


def _panels(points: Sequence[PlotPoint]) -> list[list[PlotPoint]]:
    """Points grouped by (case, provider, batch size), in order of first appearance, batches ascending."""
    groups: dict[tuple[str, str, int], list[PlotPoint]] = {}
    for p in points:
        groups.setdefault((p.case, p.provider, p.batch), []).append(p)
    order = {k: i for i, k in enumerate(dict.fromkeys((k[0], k[1]) for k in groups))}
    return [groups[k] for k in sorted(groups, key=lambda k: (order[(k[0], k[1])], k[2]))]


def _grid(panels: Sequence[Sequence[PlotPoint]]) -> tuple[int, int, list[int]]:
    """(rows, columns, flat slot of each panel): at most three columns, every case starting a new row."""
    per_case: dict[str, int] = {}
    for pts in panels:
        per_case[pts[0].case] = per_case.get(pts[0].case, 0) + 1
    cols = min(_MAX_COLUMNS, max(per_case.values(), default=1))
    slots: list[int] = []
    row, seen = -1, dict.fromkeys(per_case, 0)
    for pts in panels:
        i = seen[pts[0].case]
        if i % cols == 0:
            row += 1
        slots.append(row * cols + i % cols)
        seen[pts[0].case] = i + 1
    return max(row + 1, 1), cols, slots


def _family(label: str) -> str:
    """The fp32 model a label is a copy of: ``x`` for ``x``, ``x.int8``, ``x.ptq.int8`` and ``x.fp16``."""
    for suffix in (".int8", ".ptq", ".fp16"):
        label = label.removesuffix(suffix)
    return label


def _styles(points: Sequence[PlotPoint]) -> dict[str, tuple[str, Any, float]]:
    """(marker, colour, size) per label: baselines black by role; a candidate and its copies (``x`` and
    ``x.int8``, ``x.ptq.int8``) share a colour and differ by marker, the same in every panel."""
    from matplotlib import colormaps

    families: dict[str, list[str]] = {}
    for p in points:
        if p.role.startswith("baseline"):
            continue
        family = families.setdefault(_family(p.label), [])
        if p.label not in family:
            family.append(p.label)
    cmap = colormaps["tab10" if len(families) <= 10 else "tab20"]
    styles: dict[str, tuple[str, Any, float]] = {}
    for i, labels in enumerate(families.values()):
        for j, label in enumerate(labels):
            styles[label] = (_CANDIDATE_MARKERS[j % len(_CANDIDATE_MARKERS)], cmap(i % cmap.N), 70.0)
    for p in points:
        if p.role.startswith("baseline"):
            marker, size = _BASELINE_STYLE[p.role]
            styles[p.label] = (marker, "black", float(size))
    return styles


def _legend_shape(labels: Iterable[str]) -> tuple[int, int]:
    """(columns, rows) of a panel's legend: two columns unless a label is too long to share the width."""
    labels = [*labels, "Pareto front"]
    cols = 1 if max(len(s) for s in labels) > _LEGEND_TWO_COLUMN_CHARS else 2
    return cols, math.ceil(len(labels) / cols)


def _set_scale(ax: Any, axis: str, values: Sequence[float]) -> str:
    """Apply :func:`axis_scale` to the ``x`` or ``y`` axis; return the scale."""
    scale = axis_scale(values)
    setter = ax.set_xscale if axis == "x" else ax.set_yscale
    if scale == "symlog":
        setter("symlog", linthresh=min(v for v in values if v > 0))
    else:
        setter(scale)
    return scale


def _scatter(ax: Any, pts: Sequence[PlotPoint], styles: Mapping[str, tuple[str, Any, float]], scale: float,
             front: Sequence[PlotPoint]) -> None:
    """The front as a dashed step line under the points; the chosen points ringed."""
    ax.step([p.latency_ms for p in front], [scale * p.quality for p in front], where="post", color="0.45",
            linestyle="--", linewidth=1.3, zorder=1, label="Pareto front")
    for p in pts:
        marker, colour, size = styles[p.label]
        ax.scatter(p.latency_ms, scale * p.quality, marker=marker, color=colour, s=size, zorder=3,
                   edgecolors="white" if marker != "*" else "black", linewidths=0.6, label=p.label)
        if p.role == "chosen":
            ax.scatter(p.latency_ms, scale * p.quality, marker="o", s=420, facecolors="none", edgecolors="crimson",
                       linewidths=2.2, zorder=4)


def _legend(ax: Any, pts: Sequence[PlotPoint]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Legend below the axes, baselines first and the front last; the chosen labels in bold. Returns (labels,
    bold labels) as read back from the legend."""
    handles, labels = ax.get_legend_handles_labels()
    rank = {p.label: (not p.role.startswith("baseline"), i) for i, p in enumerate(pts)}
    order = sorted(range(len(labels)), key=lambda i: rank.get(labels[i], (True, len(pts))))
    cols, _ = _legend_shape(dict.fromkeys(p.label for p in pts))
    legend = ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper center",
                       bbox_to_anchor=(0.5, -0.17), ncol=cols, fontsize=8.5, frameon=False, markerscale=0.8)
    chosen, texts = {p.label for p in pts if p.role == "chosen"}, legend.get_texts()
    shown = tuple(t.get_text() for t in texts)
    for text in texts:
        if text.get_text() in chosen:
            text.set_fontweight("bold")
            text.set_text(f"{text.get_text()} (chosen)")
    return shown, tuple(label for label, t in zip(shown, texts) if t.get_fontweight() == "bold")


def _draw_panel(ax: Any, pts: Sequence[PlotPoint], styles: Mapping[str, tuple[str, Any, float]]) -> PanelInfo:
    """One (case, provider, batch size) panel: points, front, scales, titles, grid and legend."""
    first = pts[0]
    scale = 100.0 if first.quality_name == "accuracy" else 1.0
    front = pareto_front(pts, better_direction(first.quality_name))
    _scatter(ax, pts, styles, scale, front)
    xscale = _set_scale(ax, "x", [p.latency_ms for p in pts])
    yscale = _set_scale(ax, "y", [scale * p.quality for p in pts])
    ax.set_title(f"{first.case} · {first.provider} · batch {first.batch}", fontsize=11)
    ax.set_xlabel("p50 latency (ms, lower is better)", fontsize=10)
    ax.set_ylabel(_AXIS_TITLES[first.quality_name], fontsize=10)
    ax.tick_params(labelsize=9)
    ax.margins(0.08)
    ax.grid(alpha=0.35, which="major")
    ax.grid(alpha=0.12, which="minor")
    labels, bold = _legend(ax, pts)
    return PanelInfo(first.case, first.provider, first.batch, first.quality_name, labels,
                     tuple(p.label for p in front), xscale, yscale, bold)


def _check(points: Sequence[PlotPoint]) -> None:
    """Known roles and quality measures, one measure per panel."""
    for p in points:
        if p.role not in ROLES:
            raise ValueError(f"point {p.label!r} has role {p.role!r}; use one of {', '.join(ROLES)}")
        better_direction(p.quality_name)
    for pts in _panels(points):
        if len({p.quality_name for p in pts}) > 1:
            raise ValueError(f"panel {pts[0].case}/{pts[0].provider}/batch {pts[0].batch} mixes quality measures "
                             f"{sorted({p.quality_name for p in pts})}; give one measure per case")


def plot_front(points: Sequence[PlotPoint], path: str | Path, title: str | None = None) -> PlotInfo:
    """PNG at ``path``: one panel per (case, provider, batch size), at most three per row, each with its models
    (legend below the panel), the baselines in black (star: original fp32, square: original INT8), the chosen
    model ringed and in bold, the Pareto front as a dashed step line, and a log axis where values span a
    decade or more. The figure grows with the number of panels.

    Raises
    ------
    ValueError
        a point has an unknown role or quality measure, or a panel mixes measures.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minreal.runtime_bench.atomic import atomic_path

    _check(points)
    panels = _panels(points)
    rows, cols, slots = _grid(panels)
    legend_rows = max((_legend_shape(dict.fromkeys(p.label for p in pts))[1] for pts in panels), default=0)
    size = (_PANEL_WIDTH_IN * cols, (_PANEL_HEIGHT_IN + _LEGEND_ROW_IN * legend_rows) * rows + (0.4 if title else 0))
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, layout="constrained")
    styles = _styles(points)
    infos = [_draw_panel(axes.flat[slot], pts, styles) for slot, pts in zip(slots, panels)]
    for slot in set(range(rows * cols)) - set(slots):
        axes.flat[slot].set_axis_off()
    if not panels:
        axes[0][0].text(0.5, 0.5, "no model has both a latency and a quality measurement", ha="center",
                        va="center", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=13)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=_DPI)
    width, height = fig.get_size_inches() * _DPI
    plt.close(fig)
    return PlotInfo(Path(path), (round(width), round(height)), tuple(infos))


def plot_accuracy_latency(report: ReportLike, path: str | Path) -> PlotInfo:
    """The run's ``plot.png``: quality vs p50 latency of every model, one panel per (case, provider, batch
    size); see :func:`plot_front`."""
    return plot_front(report_points(report), path, "quality vs latency (p50) per case, provider and batch size")


def plot_spectra(report: ReportLike, path: str | Path) -> bool:
    """PNG of the per-layer spectra (e.g. C-balanced tests A, B, C), one panel per layer; False if none."""
    layers = spectra_layers(report)
    if not layers:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from minreal.runtime_bench.atomic import atomic_path

    fig, axes = plt.subplots(1, len(layers), figsize=(3.6 * len(layers), 3.2), squeeze=False)
    for ax, (case, name, spectra) in zip(axes[0], layers):
        for test, values in spectra.items():
            lam = np.clip(np.asarray(values, dtype=float), 1e-30, None)
            ax.semilogy(lam / lam.max(), label=test)
        ax.set_title(f"{case}\n{name}", fontsize=8)
        ax.set_xlabel("index")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("eigenvalue / largest")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return True
