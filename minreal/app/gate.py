"""Release gate over a bench report or a run directory's report.json (one check per case)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import minreal.runtime_bench as rb
from minreal.app.run_report import RunReport

__all__ = ["check_reports", "bench_reports", "tune_bench"]


def bench_reports(path: Path, label: str = "report") -> dict[str, dict[str, Any]]:
    """Bench reports in ``path`` by name: the report itself, or each case of a run report; relative model paths that
    name files beside the report (in the case's folder, ``<run>/<case>/``, for a run report) are made to point there,
    so the paired gate finds the files whatever the working directory. ``label`` names the file in errors
    (``report``, ``baseline``)."""
    from minreal.runtime_bench.check_paired import with_model_folder

    folder = Path(path).parent
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise rb.ReportSchemaError(f"{label} {path} does not exist") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise rb.ReportSchemaError(f"{label} {path} is not readable JSON: {exc}") from None
    if isinstance(data, dict) and data.get("kind") == "tune":
        bench = tune_bench(data, path)
        return {"tune": with_model_folder(bench, folder) if bench else data}
    if isinstance(data, dict) and "cases" in data:  # a run report, read as one; the gate reads no compression report
        cases = RunReport.from_json(data, str(path), compression=False).cases
        if not cases:
            raise rb.ReportSchemaError(f"{label} {path} is a run report with no cases: nothing to check; regenerate it "
                                       "with minreal run")
        if missing := [c.name for c in cases if not c.bench]:  # CaseResult reads a missing or null bench as {}
            raise rb.ReportSchemaError(f"{label} {path}: case(s) {', '.join(missing)} have no benchmark (bench); "
                                       "regenerate the report with minreal run")
        return {c.name: with_model_folder(c.bench, folder / c.name) for c in cases}
    if isinstance(data, dict) and "method" in data and "macs_before" in data:  # a compression report
        raise rb.ReportSchemaError(f"{label} {path} is a compression report (minreal compress --report), which "
                                   "measures no latency; check reads the reports of minreal bench, run and tune")
    return {Path(path).stem: with_model_folder(rb.load_report(path), folder)}


CHOSEN = "chosen"


def tune_bench(data: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The confirmation benchmark of a tune report cut to the original and the chosen model, the latter renamed
    ``chosen`` (so gates and ``--baseline`` compare tunes whatever they chose); None when the tune chose nothing.
    With ``chosen.ort`` (``--format onnx,ort``) the chosen model has its size as ``ort_size_bytes``, which the size
    gates judge too."""
    chosen = data.get("chosen")
    if not chosen:
        return None
    src = data["confirm"]
    pick = {"original": "original", chosen: CHOSEN} if chosen != "original" else {"original": "original"}
    bench = dict(src)
    bench["models"] = [{**m, "name": pick[m["name"]]} for m in src["models"] if m["name"] in pick]
    for key in ("latency", "ratios", "metrics", "placement"):
        bench[key] = [{**r, "model": pick[r["model"]]} for r in src.get(key, []) if r["model"] in pick]
    if chosen == "original":  # the original judged against itself: ratio 1 by definition, same metrics
        bench["models"] += [{**m, "name": CHOSEN} for m in bench["models"]]
        bench["latency"] += [{**r, "model": CHOSEN} for r in bench["latency"]]
        bench["metrics"] += [{**r, "model": CHOSEN} for r in bench["metrics"]]
        bench["placement"] += [{**r, "model": CHOSEN} for r in bench["placement"]]
        bench["ratios"] = [{"model": CHOSEN, "reference": "original", "provider": r["provider"],
                            "batch_size": r["batch_size"], "statistic": "p50_ms", "median": 1.0, "min": 1.0, "max": 1.0,
                            "per_process": [1.0]} for r in bench["latency"] if r["model"] == "original"]
    if ort := data.get("chosen_ort"):
        bench["models"] = [{**m, "ort_size_bytes": ort["bytes"]} if m["name"] == CHOSEN else m
                           for m in bench["models"]]
    return bench


def _nothing_chosen(data: dict[str, Any]) -> rb.CheckResult:
    """A failed gate for a tune that chose no model (its verdict says why)."""
    crit = rb.Criterion("chosen_model", CHOSEN, None, None, float("nan"), float("nan"), False,
                        note=f"the tune chose no model: {data.get('verdict', 'no verdict')}")
    return rb.CheckResult((crit,), False)


def check_reports(path: Path, baseline: Path | None, max_latency_ratio: float | None,
                  max_accuracy_drop: float | None, min_agreement: float | None,
                  max_regression: float | None, allow_new_models: bool = False, min_on_provider: float | None = None,
                  allow_hardware_mismatch: bool = False, max_int8_drop: float | None = None,
                  max_size_kb: float | None = None, max_size_ratio: float | None = None,
                  plan: rb.DecisionPlan | None = None, progress: rb.Progress | None = None,
                  allow_heuristic: bool = True) -> list[tuple[str, rb.CheckResult]]:
    """Apply the thresholds to every bench report in ``path`` (baseline matched by case name).

    A case (or a model of a case) absent from ``baseline`` fails unless ``allow_new_models``; a case of a run report
    ``baseline`` of several cases that ``path`` lacks fails (checked before any measurement); see
    :func:`minreal.runtime_bench.check_report` for ``min_on_provider``, ``allow_hardware_mismatch``, ``plan``
    (latency decided on paired fresh processes re-measured now) and ``allow_heuristic``. With ``plan``, alpha is
    split over the re-measured cells of all cases together (:func:`minreal.runtime_bench.check.gate_plan`): it bounds
    the whole gate's false alarms and misses over them.
    """
    from minreal.runtime_bench.check import gate_plan, prepare_check

    reports = bench_reports(path)
    base = bench_reports(baseline, "baseline") if baseline else {}
    notes: list[str] = []
    if baseline and len(base) == 1 and len(reports) == 1:
        (then, old), now = next(iter(base.items())), next(iter(reports))
        if then != now and then != Path(baseline).stem:  # a run's case, not a bench report named by its file
            notes.append(f"the baseline's one case {then!r} is compared with the report's one case {now!r}")
        base = {now: old}
    # a baseline of several cases is a run's: each case it has and the report lacks was dropped (a bench or tune
    # report is one entry, named by its file, not a case)
    dropped = [(name, _dropped_case(name, baseline)) for name in base if len(base) > 1 and name not in reports]
    prepared: list[tuple[str, Any]] = []
    for name, rep in reports.items():
        # a tune that chose nothing: its report is passed on as it is
        if isinstance(rep, dict) and rep.get("kind") == "tune":
            prepared.append((name, _nothing_chosen(rep)))
            continue
        if baseline and name not in base and not allow_new_models:
            raise rb.CheckError(f"baseline {baseline} has no case named {name!r}; pass --allow-new-models "
                                "to accept new cases")
        prepared.append((name, prepare_check(rep, max_latency_ratio, max_accuracy_drop, min_agreement,
                                             base.get(name, _without_latency(rep)) if baseline else None,
                                             max_regression, allow_new_models, min_on_provider,
                                             allow_hardware_mismatch, max_int8_drop, max_size_kb, max_size_ratio,
                                             plan is not None, allow_heuristic)))
    cells = sum(p.paired_cells for _, p in prepared if not isinstance(p, rb.CheckResult))
    gated = gate_plan(plan, cells) if plan is not None else None
    results = dropped + [(name, p if isinstance(p, rb.CheckResult) else p.run(gated, progress)) for name, p in prepared]
    if notes:
        results = [(name, replace(r, notes=(*notes, *r.notes))) for name, r in results]
    return results


def _dropped_case(name: str, baseline: Path | None) -> rb.CheckResult:
    """A failed gate for a case of the baseline that the report no longer has (as a dropped cell fails)."""
    crit = rb.Criterion("case_missing", name, None, None, float("nan"), float("nan"), False,
                        note=f"case {name!r} is in the baseline {baseline} but not in the report; update the baseline "
                             "if it was dropped on purpose")
    return rb.CheckResult((crit,), False)


def _without_latency(report: dict[str, Any]) -> dict[str, Any]:
    """A baseline for a case the real baseline lacks: no latencies, so every cell counts as new."""
    return {**report, "latency": [], "ratios": []}
