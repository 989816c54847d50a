"""``minreal run``: the one-shot pipeline: compress a model with one or more methods, export, simplify,
verify, quantise and benchmark every variant into one run directory."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from minreal.app.cli_help import MethodCommand
from minreal.app.cli_options import (
    axis_values_decl,
    common,
    data_option,
    dynamic_axes_option,
    eval_data_option,
    method_option,
    plan_option,
    trust_pickle_option,
    weights_option,
)
from minreal.app.commands._shared import case_dynamic_axes, finish_run, input_files, load_inputs, refuse_torchrun
from minreal.app.console import Console
from minreal.app.options import (
    axis_values_option,
    fixed_shapes_option,
    fixed_shapes_spec,
    image_options,
    image_preprocess,
    method_choice,
    method_options,
    mismatch_option,
    ort_config,
    ort_options,
    pipeline_config,
    pipeline_options,
    provider_options,
    provider_settings,
    qat_recovery_option,
    quant_target_for,
    recovery_config,
    recovery_options,
    require_providers,
    shape_options,
    skip_unavailable_option,
    split_names,
)
from minreal.app.settings import PipelineConfig

__all__ = ["run_cmd"]


@click.command("run", cls=MethodCommand)
@click.argument("model")
@method_option(method_choice(), "to compare, repeat for several; each takes the method options given here.")
@plan_option("its variants join the -m ones.")
@data_option("Calibration/training data.", required=True)
@eval_data_option
@weights_option
@trust_pickle_option
@dynamic_axes_option("Axes whose length differs between --data and --eval-data are dynamic anyway.")
@axis_values_decl("Default: the held-out data's length and half of it.")
@mismatch_option
@pipeline_options
@provider_options
@fixed_shapes_option
@ort_options
@skip_unavailable_option
@image_options
@recovery_options
@qat_recovery_option
@method_options
@common
def run_cmd(model: str, method: tuple[str, ...], plan: str | None, data: str, eval_data: str | None,
            weights: str | None, trust_pickle: bool, dynamic_axes: tuple[str, ...], axis_values: tuple[str, ...],
            out: str, overwrite: bool, batch: str, providers: str,
            no_int8: bool, fp16: bool, quant_target: str, quant_mode: str, min_seconds: float | None,
            repeats: int | None, provider_option: tuple[str, ...], provider_config: str | None, io_binding: bool,
            skip_unavailable_providers: bool, quiet: bool, as_json: bool, **opts: Any) -> None:
    """One-shot pipeline: compress MODEL → export → simplify → verify → INT8 / FP16 → benchmark."""
    con = Console(quiet, as_json)
    quant_target = quant_target_for(quant_target, split_names(providers))
    preprocess, allow_mismatch = image_preprocess(opts), opts.pop("allow_data_mismatch")
    fixed_shapes = fixed_shapes_spec(opts.pop("fixed_shapes"))
    ort = ort_config(opts)
    recovery = recovery_config(opts, quant_target)
    if recovery is not None and recovery.int8 and (no_int8 or quant_mode != "static"):
        raise click.UsageError("--recover-int8 trains ranges for static INT8: drop --no-int8 / --quant-mode dynamic")
    if not method and not plan:
        raise click.UsageError("give --method/-m (repeat for several) or --plan FILE")
    twice = sorted({m for m in method if method.count(m) > 1})
    if twice:
        raise click.UsageError(f"-m {twice[0]} given twice: a variant per method here; several settings of one "
                               "method go in a plan file (--plan), each with its own label")
    if plan and not method and any(v not in (None, ()) for v in opts.values()):
        raise click.UsageError("method options on the command line apply to -m variants; put the options of "
                               "--plan variants in the plan file")
    cfg = pipeline_config(PipelineConfig(skip_unavailable_providers=skip_unavailable_providers, recovery=recovery,
                                         allow_data_mismatch=allow_mismatch),
                          batch, providers, no_int8, quant_target, quant_mode, min_seconds, repeats, fp16)
    from minreal.app.method_options import build_configs, provider_defaults
    from minreal.app.pipeline import fill_run_dir
    from minreal.app.plan import load_plan
    from minreal.app.rundir import claim_run_dir
    from minreal.compress.core.run_case import RunCase, VariantSpec  # torch: after the option checks above

    refuse_torchrun("run")
    cfg = _with_fixed_shapes(cfg, fixed_shapes)
    cfg = cfg.with_bench(provider_settings=provider_settings(provider_option, provider_config, cfg.bench.providers),
                         io_binding=io_binding)
    require_providers(cfg.bench.providers, skip_unavailable_providers)  # fail fast, before any loading
    _, axes = shape_options((), dynamic_axes)
    cfg = dataclasses.replace(cfg.with_bench(axis_values=axis_values_option(axis_values)), ort=ort)
    defaults = provider_defaults(cfg.bench.providers)
    configs = build_configs(method, opts, defaults)  # each option reaches the methods that declare it
    runs = [VariantSpec(m, m, config) for m, config in zip(method, configs)]
    runs += load_plan(plan, defaults) if plan else []
    # --out is locked from its existence check to the commit: a concurrent run to it exits 1
    with claim_run_dir(Path(out), overwrite, input_files(model, weights, data, eval_data, plan)) as claim:
        net, calib, held = load_inputs(model, weights, trust_pickle, data, eval_data, preprocess=preprocess,
                                       allow_mismatch=allow_mismatch)
        case_axes = case_dynamic_axes(axes, calib.x, None if held is None else held.x)
        from minreal.app.shapes import check_shape_names

        check_shape_names(calib.x, case_axes, cfg.variant.fixed_shapes)  # a typo is a usage error, before any work
        case = RunCase(Path(model.split(":")[-1]).stem or "model", net, calib, held, runs, dynamic_axes=case_axes)
        report = fill_run_dir([case], claim, cfg, con.progress)
    finish_run(con, report, out)


def _with_fixed_shapes(cfg: Any, spec: Any) -> Any:
    """``cfg`` (a :class:`PipelineConfig`) with ``--fixed-shapes``. A fixed-batch file runs at that batch only: it
    becomes the batch size timed when ``--batch`` was not given, and a ``--batch`` asking for another is an error."""
    from dataclasses import replace

    fixed = spec.batch() if spec is not None else None
    if fixed is not None and set(cfg.bench.batch_sizes) != {fixed}:
        if click.get_current_context().get_parameter_source("batch") is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError(f"--batch {','.join(map(str, cfg.bench.batch_sizes))} conflicts with --fixed-shapes "
                                   f"(batch {fixed}): a fixed-batch model runs only at batch {fixed}; pass --batch "
                                   f"{fixed} or leave --batch out")
        cfg = cfg.with_bench(batch_sizes=(fixed,))
    return cfg if spec is None else replace(cfg, variant=replace(cfg.variant, fixed_shapes=spec))
