"""``minreal tune``: search methods and budgets for the fastest deployable model within a quality budget,
measured on the target runtime (local worker processes or a Ray cluster)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from minreal.app.cli_help import BENCHMARK, CRITERIA, OUTPUT, RECOVERY, SEARCH, GroupedCommand, GroupedOption
from minreal.app.cli_options import (
    batch_option,
    common,
    data_option,
    dynamic_axes_option,
    eval_data_option,
    max_accuracy_drop_option,
    max_size_option,
    method_option,
    min_agreement_option,
    min_seconds_option,
    no_int8_option,
    out_option,
    overwrite_option,
    plan_option,
    repeats_option,
    trust_pickle_option,
    weights_option,
)
from minreal.app.commands._shared import (
    case_dynamic_axes,
    input_files,
    load_inputs,
    refuse_torchrun,
    warn_data_check,
)
from minreal.app.console import Console
from minreal.app.errors import FAIL_EXIT
from minreal.app.options import (
    image_options,
    image_preprocess,
    method_choice,
    mismatch_option,
    ort_config,
    ort_options,
    providers_option,
    quant_target_for,
    quant_target_option,
    require_providers,
    shape_options,
    split_ints,
    split_names,
)
from minreal.app.tune.config import DEFAULT_GRID, SCREEN, Constraint, TuneConfig, TuneError, parse_duration  # no torch

__all__ = ["tune_cmd"]

EXECUTOR = "Executor (where candidates run)"


def _tune_option(*decls: str, group: str = SEARCH, **kwargs: Any) -> Any:
    """An option of tune alone, in its ``--help`` section (``group``)."""
    return click.option(*decls, cls=GroupedOption, group=group, **kwargs)


@click.command("tune", cls=GroupedCommand)
@click.argument("model")
@data_option("Calibration/training data (methods and recovery see only this).", required=True)
@eval_data_option
@weights_option
@trust_pickle_option
@out_option("the tune directory.", "runs/tune", directory=True)
@overwrite_option
@providers_option()
@batch_option("to time; the first (provider, batch) decides the choice.",
              ",".join(map(str, TuneConfig.bench.batch_sizes)))
@max_accuracy_drop_option
@min_agreement_option
@_tune_option("--max-mse-increase", type=float, metavar="VALUE", group=CRITERIA,
              help="Largest allowed MSE increase against the original (regressors).")
@max_size_option("a constraint beside the quality one, on every deployable file including the original's.")
@_tune_option("--objective", type=click.Choice(["latency", "size"]), default=TuneConfig.objective,
              show_default=True,
              help="What the chosen model minimises among those that meet the constraint.")
@_tune_option("--time-budget", metavar="DURATION",
              help="Start no candidate after this (e.g. 90s, 20m); checked before every one.")
@_tune_option("--stats-samples", type=click.IntRange(min=0), default=TuneConfig.stats_samples, show_default=True,
              metavar="N",
              help="Calibration samples the methods' statistics see (a seeded subsample; 0: all). Recovery and the "
                   "judgement use all the data.")
@_tune_option("--dry-run", is_flag=True, group=OUTPUT,
              help="Print the search plan and its estimated time (from a short probe of the model) and stop.")
@method_option(method_choice(searchable=True), "to search, repeat for several: one with a MAC budget and a "
               "budget-free prepare phase (default: all of them, or none when --plan is given; others, e.g. a chain or "
               "cbalanced, go in a plan file).")
@plan_option("its variants are candidates as they are.")
@_tune_option("--grid", metavar="R,R...", help="Comma-separated MAC ratios to search (default "
              f"{DEFAULT_GRID[0]:g},{DEFAULT_GRID[1]:g},...,{DEFAULT_GRID[-1]:g}).")
@_tune_option("--recover-epochs-max", "recover_epochs", type=click.IntRange(min=0),
              default=TuneConfig.recover_epochs, show_default=True,
              metavar="N", group=RECOVERY, brief=True,
              help="Recovery cap: every method is bisected without recovery, then the budgets just below each "
                   "boundary race with up to this many epochs of recovery (successive halving: 1/9, 1/3, all of it).")
@no_int8_option("fp32 candidates only (the original's INT8 is then no baseline).")
@_tune_option("--no-qat", is_flag=True, group=RECOVERY, help="No quantisation-aware recovery candidates.")
@quant_target_option
@ort_options
@_tune_option("--screen-seconds", type=click.FloatRange(min=0), default=None, metavar="S", group=BENCHMARK,
              help="Timing window per model of the screening pass (short protocol, one process).")
@min_seconds_option("of the confirmation (release protocol).")
@repeats_option("in the confirmation.")
@_tune_option("--cache-dir", type=click.Path(file_okay=False), group=EXECUTOR,
              help="Candidate cache (default: $XDG_CACHE_HOME/minreal/tune or ~/.cache/minreal/tune). With "
                   "--executor ray it must be shared storage every node mounts at the same path.")
@_tune_option("--workers", type=click.IntRange(min=0), default=TuneConfig.workers, show_default=True, group=EXECUTOR,
              help="Local worker processes evaluating candidates (--executor local); 0 evaluates them in this "
                   "process.")
@_tune_option("--executor", "executor_kind", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              group=EXECUTOR,
              help="Where candidates run: local processes, or Ray tasks on a cluster (pip install 'minreal[ray]'; "
                   "minreal on every node; --cache-dir and relative input paths on shared storage).")
@_tune_option("--address", group=EXECUTOR,
              help="Ray cluster to join with --executor ray: auto (default) or the head's HOST:PORT.")
@_tune_option("--bench-resource", metavar="NAME", group=EXECUTOR,
              help="Ray custom resource of the target-hardware nodes: benchmarks run only on such a node, started "
                   "with `ray start --resources '{\"NAME\": 1}'` (default minreal_bench; --executor ray).")
@dynamic_axes_option()
@image_options
@mismatch_option
@common
def tune_cmd(model: str, data: str, eval_data: str | None, weights: str | None, trust_pickle: bool, out: str,
             overwrite: bool, providers: str, batch: str, max_accuracy_drop: float | None, min_agreement: float | None,
             max_mse_increase: float | None, max_size_kb: float | None, objective: str, time_budget: str | None,
             method: tuple[str, ...],
             plan: str | None, grid: str | None, recover_epochs: int, no_int8: bool, no_qat: bool,
             quant_target: str | None,
             screen_seconds: float | None, min_seconds: float | None, repeats: int | None, cache_dir: str | None,
             workers: int, executor_kind: str, address: str | None, bench_resource: str | None,
             dynamic_axes: tuple[str, ...], stats_samples: int, dry_run: bool, quiet: bool, as_json: bool,
             **opts: Any) -> None:
    """Find the fastest deployable model within a quality budget, measured on the target runtime, against the
    original in fp32 and INT8. Writes report.json/.md, front.png and chosen.onnx (chosen.pt2; with --format onnx,ort
    also chosen.ort and chosen.required_operators.config) into --out."""
    import dataclasses

    batch_sizes = split_ints(batch, "--batch")  # option errors before the heavy imports below
    twice = sorted({m for m in method if method.count(m) > 1})
    if twice:
        raise click.UsageError(f"-m {twice[0]} given twice: tune searches each method's budgets itself")
    grid_values = tuple(_split_floats(grid, "--grid")) if grid else None

    from minreal.export.settings import VariantConfig
    from minreal.runtime_bench.config import BenchConfig

    con = Console(quiet, as_json)
    preprocess, allow_mismatch = image_preprocess(opts), opts.pop("allow_data_mismatch")
    ort = ort_config(opts)
    screen = {"min_seconds": screen_seconds} if screen_seconds is not None else {}
    confirm = {k: v for k, v in (("min_seconds", min_seconds), ("repeats", repeats)) if v is not None}
    bench = BenchConfig(providers=split_names(providers), batch_sizes=batch_sizes, **confirm)
    try:  # the options' errors are usage errors, told before any heavy import
        cfg = TuneConfig(Constraint(max_accuracy_drop, min_agreement, max_mse_increase), bench,
                         objective=objective, methods=tuple(method),
                         grid=TuneConfig.grid if grid_values is None else grid_values,
                         recover_epochs=recover_epochs, max_size_kb=max_size_kb, int8=not no_int8, qat=not no_qat,
                         variant=VariantConfig(quant_target=quant_target_for(quant_target, split_names(providers))),
                         time_budget_s=parse_duration(time_budget) if time_budget else None,
                         screen=dataclasses.replace(SCREEN, **screen),
                         workers=workers, dynamic_axes=shape_options((), dynamic_axes)[1] if dynamic_axes else {},
                         stats_samples=stats_samples, ort=ort)
    except TuneError as exc:
        raise click.UsageError(str(exc)) from None
    refuse_torchrun("tune")
    from minreal.app.mismatch import check_data, require_match
    from minreal.app.rundir import claim_run_dir, commit_run_dir
    from minreal.app.shapes import check_shape_names
    from minreal.app.tune import SpecSource, tune
    from minreal.app.tune.output import format_tune, write_tune_dir

    if plan:
        from minreal.app.method_options import provider_defaults
        from minreal.app.plan import load_plan

        cfg = dataclasses.replace(cfg, plan=tuple(load_plan(plan, provider_defaults(cfg.bench.providers))))
    require_providers(cfg.bench.providers, False)
    remote = executor_kind == "ray"
    cache = Path(cache_dir) if cache_dir else _default_cache()
    cache = cache.resolve() if remote else cache  # the same folder for workers whatever their working directory
    _check_executor_options(executor_kind, address, bench_resource)  # before any work: Ray may be absent
    if dry_run:
        _tune_dry_run(con, model, weights, trust_pickle, data, eval_data, preprocess, cfg)
        return
    with claim_run_dir(Path(out), overwrite, input_files(model, weights, data, eval_data, plan)) as claim:
        net, calib, held = load_inputs(model, weights, trust_pickle, data, eval_data, preprocess=preprocess,
                                       allow_mismatch=allow_mismatch)
        check = require_match(check_data(net, {"evaluation": held, "calibration": calib}), allow_mismatch)
        warn_data_check(check)
        source = (SpecSource(model, data, eval_data, weights, trust_pickle, preprocess, allow_mismatch)
                  if workers or remote else None)
        cfg = dataclasses.replace(cfg, dynamic_axes=case_dynamic_axes(cfg.dynamic_axes, calib.x,
                                                                      held.x if held else None))
        check_shape_names(calib.x, cfg.dynamic_axes)  # a typo is a usage error, before the baselines
        executor = _tune_executor(executor_kind, workers, address, bench_resource)
        report = tune(net, calib, held, cfg, claim.staging, cache, source, executor, con.progress)
        executor.close()
        report.reference["data_check"] = asdict(check)
        report.notes += [f"--allow-data-mismatch: {check.message()}"] if check.allowed else []
        write_tune_dir(report, claim.staging)
        commit_run_dir(claim)
    con.table(format_tune(report))
    files = "report.md, report.json, front.png" + (", chosen.onnx" if report.chosen else "")
    if report.chosen_ort:
        files += f", {report.chosen_ort['path']}, {report.chosen_ort['config_path']}"
    con.table(f"\ntune directory: {out} ({files}; candidate cache {cache})")
    con.result(json.loads((Path(out) / "report.json").read_text()))  # paths relative to the tune directory
    if not report.chosen:  # nothing to ship, not even the original: a script running `tune && ship` must stop
        click.echo(f"minreal: {report.verdict} (the report is in {out})", err=True)
        sys.exit(FAIL_EXIT)


def _tune_dry_run(con: Any, model: str, weights: str | None, trust_pickle: bool, data: str, eval_data: str | None,
                  preprocess: Any, cfg: Any) -> None:
    """`tune --dry-run`: the plan and its estimated time; nothing is written."""
    from minreal.app.tune.dryrun import estimate_plan, probe_model
    from minreal.app.tune.search import default_methods, with_chains

    net, calib, held = load_inputs(model, weights, trust_pickle, data, eval_data, preprocess=preprocess)
    methods = with_chains(cfg.methods or (() if cfg.plan else default_methods()))
    est = estimate_plan(cfg, methods, len(calib), len(held) if held is not None else 0, probe_model(net, calib))
    con.table("\n".join(["tune plan (dry run: nothing is compressed or written)", *[f"- {line}" for line in est.lines],
                         "estimated time: " + ", ".join(f"{k} {v:.0f} s" for k, v in est.seconds.items())
                         + f"; total about {est.total / 60:.1f} min"]))
    con.result({"dry_run": True, "plan": est.lines, "estimated_s": {k: round(v, 1) for k, v in est.seconds.items()},
                "estimated_total_s": round(est.total, 1)})


def _check_executor_options(kind: str, address: str | None, bench_resource: str | None) -> None:
    """Refuse options of the other executor, and --executor ray without Ray installed."""
    from minreal.app.tune.executor import require_ray

    if kind == "local" and (address or bench_resource):
        raise click.UsageError("--address and --bench-resource are options of --executor ray")
    if kind == "ray":
        if click.get_current_context().get_parameter_source("workers") is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--workers is for --executor local; with --executor ray the cluster's CPUs decide "
                                   "how many candidates run at once")
        require_ray()


def _tune_executor(kind: str, workers: int, address: str | None, bench_resource: str | None) -> Any:
    """The executor of `minreal tune`: local processes (``--workers``; 0: this process) or a Ray cluster."""
    from minreal.app.tune import InlineExecutor, ProcessExecutor
    from minreal.app.tune.executor import BENCH_RESOURCE, RayExecutor

    if kind == "ray":
        return RayExecutor(address or "auto", bench_resource or BENCH_RESOURCE)
    return ProcessExecutor(workers) if workers else InlineExecutor()


def _default_cache() -> Path:
    """``$XDG_CACHE_HOME/minreal/tune``, or ``~/.cache/minreal/tune``."""
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "minreal" / "tune"


def _split_floats(text: str, flag: str) -> list[float]:
    """The numbers of a comma-separated option value (``--grid 0.9,0.5``); otherwise a usage error."""
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}", param_hint=flag) from None
