"""``minreal check``: the release gate over a bench, run or tune report (exit 0 when every criterion
holds, 1 when one fails, 3 when a paired latency decision is undecided and nothing failed)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from minreal.app.cli_help import CRITERIA, GroupedCommand, GroupedOption
from minreal.app.cli_options import common, max_accuracy_drop_option, max_size_option, min_agreement_option
from minreal.app.console import Console
from minreal.app.errors import FAIL_EXIT, UNDECIDED_EXIT

__all__ = ["check_cmd"]


def _check_option(*decls: str, **kwargs: Any) -> Any:
    """A criterion of check alone, in the Criteria section of ``--help``."""
    return click.option(*decls, cls=GroupedOption, group=CRITERIA, brief=True, **kwargs)


@click.command("check", cls=GroupedCommand)
@click.argument("report", type=click.Path(dir_okay=False))
@_check_option("--max-latency-ratio", type=click.FloatRange(min=0, min_open=True),
               help="Highest allowed latency ratio vs the first model.")
@max_accuracy_drop_option
@min_agreement_option
@_check_option("--baseline", type=click.Path(dir_okay=False), help="Earlier report to compare latencies with.")
@_check_option("--max-regression", type=click.FloatRange(min=-100, min_open=True),
               help="Highest allowed latency regression vs --baseline, percent; a cell fails only when it is also "
                    "beyond the measured noise (the two runs' per-process p50 ranges do not overlap).")
@_check_option("--allow-new-models", is_flag=True,
               help="Let (model, provider, batch) cells absent from --baseline pass (they fail otherwise).")
@_check_option("--min-on-provider", type=float,
               help="Lowest allowed share (0-1) of each model's nodes that ran on its requested provider (read from "
                    "ONNX Runtime's profile); a failure names the nodes that fell back.")
@_check_option("--allow-hardware-mismatch", is_flag=True,
               help="Let --baseline come from another CPU or GPU model (a warning; it fails otherwise).")
@_check_option("--max-int8-drop", type=float,
               help="Highest allowed accuracy drop of each INT8 file against its own fp32 source (NAME.int8 vs "
                    "NAME), percentage points: the loss quantisation alone causes.")
@_check_option("--paired", is_flag=True,
               help="Decide the latency criteria (--max-latency-ratio, --max-regression) at a stated error rate: re-"
                    "measure each candidate against its reference (the report's first model; the --baseline's file of "
                    "the model) in paired, interleaved fresh processes (a pair: one process timing both models on "
                    "one shared thread pool, which model first alternating) until a sign test decides, the cap or "
                    "the time budget; undecided exits 3 with what would decide it.")
@_check_option("--alpha", type=click.FloatRange(0, 0.5, min_open=True, max_open=True), default=0.01,
               show_default=True, help="With --paired: bound on the whole gate's false-alarm rate (and on passing a "
                                       "regression), split over its paired cells.")
@_check_option("--max-pairs", type=click.IntRange(min=1), default=60, show_default=True,
               help="With --paired: most pairs (one process each) per model and cell.")
@_check_option("--gate-seconds", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
               help="With --paired: time budget per model and cell, seconds.")
@_check_option("--pair-seconds", type=click.FloatRange(min=0, min_open=True), default=0.25, show_default=True,
               help="With --paired: measurement window per model in each process, seconds.")
@_check_option("--allow-heuristic", is_flag=True,
               help="With --paired: judge a baseline cell that cannot be re-measured (the baseline's model file gone "
                    "or changed) on medians, with no stated error rate, instead of leaving it undecided (exit 3).")
@max_size_option("of every model but the first (of the one model of a one-model report), judged as NAME and "
                 "NAME.ort.")
@_check_option("--max-size-ratio", type=click.FloatRange(min=0, min_open=True),
               help="Largest allowed file size of every model, and of its .ort file, relative to the first model's "
                    ".onnx file.")
@common
def check_cmd(report: str, max_latency_ratio: float | None, max_accuracy_drop: float | None,
              min_agreement: float | None, baseline: str | None, max_regression: float | None,
              allow_new_models: bool, min_on_provider: float | None, allow_hardware_mismatch: bool,
              max_int8_drop: float | None, max_size_kb: float | None, max_size_ratio: float | None, paired: bool,
              alpha: float, max_pairs: int, gate_seconds: float, pair_seconds: float, allow_heuristic: bool,
              quiet: bool, as_json: bool) -> None:
    """Release gate: exit 0 when every criterion holds for REPORT, 1 when one fails, 3 when (with --paired) a latency
    decision is undecided and nothing failed.

    REPORT is a `minreal bench` JSON, a run directory's report.json (every case is checked) or a tune directory's
    report.json (the chosen model, as `chosen`, against the original; a tune that chose nothing fails).
    """
    from minreal.app.gate import check_reports

    con = Console(quiet, as_json)
    if all(v is None for v in (max_latency_ratio, max_accuracy_drop, min_agreement, max_regression, min_on_provider,
                                max_int8_drop, max_size_kb, max_size_ratio)):
        raise click.UsageError("give at least one criterion (--max-latency-ratio, --max-accuracy-drop, "
                               "--min-agreement, --max-regression, --min-on-provider, --max-int8-drop, --max-size, "
                               "--max-size-ratio); a gate with none would always pass")
    import minreal.runtime_bench as rb
    from minreal.runtime_bench.check import brief_criterion
    from minreal.runtime_bench.decision import least_cap

    _warn_unused(click.get_current_context(), paired, max_latency_ratio is not None or max_regression is not None)
    plan = rb.DecisionPlan(alpha=alpha, min_pairs=min(12, max_pairs), max_pairs=max_pairs, time_budget_s=gate_seconds,
                           pair_seconds=pair_seconds) if paired else None
    if plan is not None and plan.least_pairs() > max_pairs:
        raise click.UsageError(f"--max-pairs {max_pairs} cannot decide at --alpha {alpha:g}: at least "
                               f"{least_cap(alpha)} pairs are needed")
    with malformed_reports(report, baseline):  # the verdict's text is made of the reports' fields too
        results = check_reports(Path(report), Path(baseline) if baseline else None, max_latency_ratio,
                                max_accuracy_drop, min_agreement, max_regression, allow_new_models, min_on_provider,
                                allow_hardware_mismatch, max_int8_drop, max_size_kb, max_size_ratio, plan, con.progress,
                                allow_heuristic or not paired)
        tables = [f"[{name}]\n{rb.format_check(res)}" for name, res in results]
        failed = [f"{n}: {brief_criterion(c)}" for n, r in results for c in r.criteria if not c.passed]
    passed = all(r.passed for _, r in results)
    undecided = not passed and all(r.passed or r.undecided for _, r in results)
    for table in tables:
        con.table(table)
    rates = next((r.error_rates for _, r in results if r.error_rates), None)
    if rates:  # the split is the gate's; the cells judged on medians are counted per case
        rates = {**rates, "heuristic_cells": sum((r.error_rates or {}).get("heuristic_cells", 0) for _, r in results)}
    con.result({"passed": passed, "undecided": undecided, "error_rates": rates, "reports": {n: r for n, r in results}})
    if not passed:
        click.echo(("UNDECIDED " if undecided else "FAILED ") + "; ".join(failed), err=True)
        sys.exit(UNDECIDED_EXIT if undecided else FAIL_EXIT)


_PAIRED_ONLY = ("alpha", "max_pairs", "gate_seconds", "pair_seconds", "allow_heuristic")


def _warn_unused(ctx: click.Context, paired: bool, latency: bool) -> None:
    """One warning line on stderr for paired-gate flags that judge nothing: without a latency criterion, or (all but
    --paired itself) without --paired."""
    given = [name for name in ("paired", *_PAIRED_ONLY)
             if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)]
    flags = ", ".join("--" + name.replace("_", "-") for name in given)
    if given and not latency:
        click.echo(f"warning: {flags} ignored: no latency criterion (--max-latency-ratio, --max-regression) to decide",
                   err=True)
    elif not paired and (unused := [g for g in given if g != "paired"]):
        names = ", ".join("--" + name.replace("_", "-") for name in unused)
        click.echo(f"warning: {names} ignored without --paired", err=True)


@contextlib.contextmanager
def malformed_reports(report: str, baseline: str | None) -> Iterator[None]:
    """A report or baseline whose JSON lacks a field or holds one of another type (what the schema checks do not
    catch) is refused in one line naming the files, as a usage error, not an internal one."""
    from minreal.app.errors import usage_errors
    from minreal.compress.core.report import ReportVersionError
    from minreal.facts import error_line
    from minreal.runtime_bench import ReportSchemaError

    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        if isinstance(exc, (*usage_errors(), ReportVersionError)):  # a newer report says "upgrade minreal"
            raise
        files = f"report {report}" + (f" or baseline {baseline} (the field is in one of them)" if baseline else "")
        raise ReportSchemaError(f"{files} is malformed ({error_line(exc, with_type=True, max_chars=200)}); "
                                "regenerate it with minreal bench, run or tune") from exc
