"""Quality/latency plots: the Pareto front's maths, the axis-scale rule, and a rendered run figure checked
through its returned info and the PNG's size (no OCR)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image

from minreal.app.plots import PlotPoint, axis_scale, pareto_front, plot_accuracy_latency, plot_front, report_points


def _pt(label: str, latency: float, quality: float, name: str = "accuracy") -> PlotPoint:
    return PlotPoint("c", label, "cpu", 1, latency, quality, name)


def test_front_excludes_dominated_points_fastest_first() -> None:
    pts = [_pt("slow-good", 3.0, 0.99), _pt("fast-bad", 1.0, 0.90), _pt("mid", 2.0, 0.95),
           _pt("dominated", 2.5, 0.94)]
    assert [p.label for p in pareto_front(pts, "higher")] == ["fast-bad", "mid", "slow-good"]


def test_front_ties() -> None:
    """Equal points dominate neither each other; equal latency keeps only the better quality, equal quality
    keeps only the faster."""
    pts = [_pt("a", 1.0, 0.9), _pt("a-twin", 1.0, 0.9), _pt("same-latency-worse", 1.0, 0.8),
           _pt("same-quality-slower", 2.0, 0.9), _pt("best", 3.0, 0.95)]
    assert {p.label for p in pareto_front(pts, "higher")} == {"a", "a-twin", "best"}


def test_front_lower_is_better_and_non_finite_left_out() -> None:
    pts = [_pt("fast", 1.0, 1e-2, "mse"), _pt("slow", 2.0, 1e-4, "mse"), _pt("worse", 2.0, 1e-3, "mse"),
           _pt("nan", 0.5, float("nan"), "mse")]
    assert [p.label for p in pareto_front(pts, "lower")] == ["fast", "slow"]
    assert [p.label for p in pareto_front(pts, "higher")] == ["fast"]
    with pytest.raises(ValueError, match="higher"):
        pareto_front(pts, "up")  # type: ignore[arg-type]


def test_axis_scale_needs_a_decade() -> None:
    assert axis_scale([0.9, 0.95, 0.99]) == "linear"
    assert axis_scale([1.0, 9.99]) == "linear"
    assert axis_scale([1e-4, 1e-3, 1e-2]) == "log"
    assert axis_scale([1.0, 10.0]) == "log"
    assert axis_scale([0.0, 1e-3, 1e-1]) == "symlog"
    assert axis_scale([5.0]) == "linear"


def _bench(models: dict[str, tuple[float, float]], key: str) -> dict:
    """A case's bench section: {model: (p50 ms at batch 1, quality)}; batch 8 runs 5× slower."""
    latency = [{"model": m, "provider": "cpu", "batch_size": b, "stats": {"p50_ms": ms * (1 if b == 1 else 5)}}
               for b in (1, 8) for m, (ms, _) in models.items()]
    metrics = [{"model": m, "accuracy": None, "mse": None, "top1_agreement": 1.0, key: q}
               for m, (_, q) in models.items()]
    return {"latency": latency, "metrics": metrics, "config": {"batch_sizes": [1, 8]}}


_CLS = {"original": (2.0, 0.97), "original.int8": (1.2, 0.965), "lowrank": (1.0, 0.96),
        "lowrank.int8": (0.7, 0.95), "dominated": (1.5, 0.90)}
_REG = {"original": (1.0, 2e-5), "original.int8": (0.8, 3e-5), "fde": (0.5, 1e-4), "magnitude": (0.4, 5e-2)}


def _report() -> dict:
    return {"cases": [{"name": "cls", "bench": _bench(_CLS, "accuracy")},
                      {"name": "reg", "bench": _bench(_REG, "mse")}]}


def test_report_points_roles_and_measures() -> None:
    pts = report_points(_report())
    assert len(pts) == 2 * (len(_CLS) + len(_REG))
    roles = {p.label: p.role for p in pts}
    assert roles["original"] == "baseline-fp32" and roles["original.int8"] == "baseline-int8"
    assert roles["lowrank.int8"] == "candidate"
    assert {p.quality_name for p in pts if p.case == "reg"} == {"mse"}
    assert {p.quality_name for p in pts if p.case == "cls"} == {"accuracy"}


def test_run_plot_panels_legends_scales_and_size(tmp_path: Path) -> None:
    info = plot_accuracy_latency(_report(), tmp_path / "plot.png")
    assert [(p.case, p.batch) for p in info.panels] == [("cls", 1), ("cls", 8), ("reg", 1), ("reg", 8)]
    with Image.open(tmp_path / "plot.png") as im:
        assert im.size == info.size_px
    assert info.size_px[0] == round(2 * 5.2 * 110)  # two columns: each case's two batch sizes side by side
    one = plot_front([p for p in report_points(_report()) if p.case == "cls" and p.batch == 1], tmp_path / "1.png")
    assert info.size_px[1] > 1.8 * one.size_px[1]  # the figure grows with the rows of panels
    for panel in info.panels:
        models = _CLS if panel.case == "cls" else _REG
        assert set(models) <= set(panel.legend) and panel.legend[-1] == "Pareto front"
        assert panel.legend[:2] == ("original", "original.int8")  # baselines first
        assert panel.xscale == "linear"
        assert panel.yscale == ("log" if panel.case == "reg" else "linear")
    cls = info.panels[0]
    assert "dominated" not in cls.front and cls.front == ("lowrank.int8", "lowrank", "original.int8", "original")
    assert info.panels[2].front == ("magnitude", "fde", "original.int8", "original")


def test_chosen_model_is_bold_in_its_legend(tmp_path: Path) -> None:
    pts = [replace(p, role="chosen") if p.label == "lowrank" else p for p in report_points(_report())]
    info = plot_front(pts, tmp_path / "tune.png", title="tune")
    assert all(p.chosen == (("lowrank",) if p.case == "cls" else ()) for p in info.panels)
    assert (tmp_path / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_points_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="role"):
        plot_front([replace(_pt("x", 1.0, 0.9), role="best")], tmp_path / "x.png")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mixes"):
        plot_front([_pt("x", 1.0, 0.9), _pt("y", 1.0, 0.1, "mse")], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_no_measurements_still_writes_a_figure(tmp_path: Path) -> None:
    info = plot_accuracy_latency({"cases": []}, tmp_path / "plot.png")
    assert info.panels == () and (tmp_path / "plot.png").exists()
