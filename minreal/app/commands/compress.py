"""``minreal compress``: one method on one model, saved as a torch.export program with its report (under
torchrun, every rank shares the statistics and the recovery; rank 0 writes)."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from minreal.app.cli_help import MODEL_DATA, OUTPUT, GroupedOption, MethodCommand
from minreal.app.cli_options import (
    common,
    data_option,
    dynamic_axes_option,
    method_option,
    out_option,
    trust_pickle_option,
    weights_option,
)
from minreal.app.commands._shared import load_inputs, prepare_outputs, warn_data_check
from minreal.app.console import Console
from minreal.app.options import (
    image_options,
    image_preprocess,
    known_providers,
    method_choice,
    method_options,
    providers_option,
    quant_target_for,
    recovery_config,
    recovery_options,
    shape_options,
)
from minreal.app.settings import HOLDOUT_FRACTION
from minreal.compress.core.report import CompressionReport
from minreal.facts import PROVIDERS

__all__ = ["compress_cmd"]


@click.command("compress", cls=MethodCommand)
@click.argument("model")
@method_option(method_choice(), "to apply, given once (`minreal run` compares several).", once=True,
               once_hint="use `minreal run -m A -m B` to compare several, or a plan file's chain to run them in "
                     "sequence")
@data_option("Calibration (and, for methods that train, training) data.", required=True)
@weights_option
@trust_pickle_option
@out_option("the compressed model as a torch.export program (.pt2).", "compressed.pt2")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), cls=GroupedOption, group=OUTPUT,
              help="Write the report as JSON.")
@providers_option(f"Comma-separated: {', '.join(PROVIDERS)}; the providers the model is for, as in run. They set "
                  "the defaults of --rank-multiple (cpu 16, GPU 8), --width-multiple (cpu 16, GPU 8) and --width-min "
                  "(cpu 16, GPU 0), the coarsest of several.")
@click.option("--data-holdout", "holdout", type=click.FloatRange(0.0, 1.0, max_open=True), default=HOLDOUT_FRACTION,
              show_default=True, metavar="FRACTION", cls=GroupedOption, group=MODEL_DATA,
              help="Share of --data held out (seeded) to measure the compressed model on (report: "
                   "measured.held_out); 0 calibrates on all of --data and makes no held-out measurement.")
@dynamic_axes_option("The .pt2 program keeps them.")
@click.option("--distributed", is_flag=True, cls=GroupedOption, group=MODEL_DATA,
              help="Share the statistics passes and the recovery across the ranks of a torchrun launch (gloo on "
                   "CPU, NCCL on GPU; automatic under torchrun); rank 0 writes the outputs.")
@image_options
@recovery_options
@method_options
@common
def compress_cmd(model: str, method: str, data: str, weights: str | None, trust_pickle: bool, out: str,
                 report_path: str | None, providers: str, holdout: float, dynamic_axes: tuple[str, ...],
                 distributed: bool, quiet: bool, as_json: bool,
                 **opts: Any) -> None:
    """Compress MODEL with one method and save it as a torch.export program.

    Under torchrun (or with --distributed) every rank runs this command: the statistics passes and the
    recovery share the calibration data by rank, and rank 0 alone writes the program and the report.
    """

    from minreal.compress.core.distributed import is_writer, launched_by_torchrun, process_group

    names = known_providers(providers)
    if distributed and not launched_by_torchrun():
        raise click.UsageError("--distributed needs the torch.distributed environment (RANK, WORLD_SIZE, "
                               "MASTER_ADDR, MASTER_PORT): start with torchrun --nproc-per-node N -m "
                               "minreal.app.cli compress ...")
    # the model stays on the CPU (statistics and recovery run there), so the collectives do too: gloo
    group = process_group(backend="gloo") if launched_by_torchrun() else contextlib.nullcontext()
    with group:
        writer = is_writer()
        _compress(model, method, data, weights, trust_pickle, out, report_path, names, holdout,
                  dynamic_axes, Console(quiet or not writer, as_json and writer), writer, opts)


def _compress(model: str, method: str, data: str, weights: str | None, trust_pickle: bool, out: str,
              report_path: str | None, providers: tuple[str, ...], holdout: float, dynamic_axes: tuple[str, ...],
              con: Console, writer: bool, opts: dict[str, Any]) -> None:
    """The work of :func:`compress_cmd` on one rank; ``writer`` (rank 0, or a single process) writes the outputs."""
    from minreal.app.field_flags import fields_spelled
    from minreal.app.method_options import build_config, provider_defaults
    from minreal.app.mismatch import check_data
    from minreal.app.shapes import check_shape_names
    from minreal.compress import compress
    from minreal.export.json_safe import write_json
    from minreal.export.record import Laps
    from minreal.export.serialize import save_program

    laps = Laps()
    axes = shape_options((), dynamic_axes)[1]  # a bad --dynamic-axes stops here, not after the compression
    if writer:  # folders the outputs need are made (and removed again on failure) by the writing rank alone
        prepare_outputs([out, report_path], model, weights, data)
    if Path(out).suffix.lower() != ".pt2":  # a program saved under another suffix no command could read back
        raise click.BadParameter(f"{out!r}: compress writes a torch.export program, so the path ends in .pt2 "
                                 "(`minreal export` makes the .onnx from it)", param_hint="--out")
    preprocess = image_preprocess(opts)
    recovery = recovery_config(opts, quant_target_for(None, providers))
    config = build_config(method, opts, provider_defaults(providers))
    net, calib, held = load_inputs(model, weights, trust_pickle, data, None, holdout, preprocess)
    check_shape_names(calib.x, axes)  # a typo is a usage error, before the compression
    check = check_data(net, {"evaluation": held, "calibration": calib})  # compress warns; run and tune stop
    if writer:
        warn_data_check(check)
    laps.lap("load")
    held = held if held is not None and len(held) else None
    con.progress(_calib_line(len(calib), held, holdout))
    con.progress(f"compressing {model} with {method}")
    # a graph fixed at the data's shape that is to run at other lengths is checked there, before any recovery
    small, report = compress(net, calib, method, config, recovery, held, measure=held is None, dynamic_axes=axes)
    laps.lap("compress")
    _record_held_out(report, net, small, calib, held, holdout)
    laps.lap("held_out")
    report.measured.data_check = asdict(check)
    if not writer:  # another rank of a torchrun launch: rank 0 writes
        return
    save_program(small, calib.x[:2], Path(out), dynamic_axes=axes)
    laps.lap("save")
    _record_laps(report, laps.timings, con)
    if report_path:
        write_json(report, Path(report_path))
    con.table(f"params {report.params_before} -> {report.params_after} ({report.param_ratio:.3f}), "
              f"MACs {report.macs_before} -> {report.macs_after} ({report.mac_ratio:.3f}); saved {out}")
    if missed := report.predicted.get("budget_missed"):  # stated, never missed in silence
        click.echo(f"WARNING: {fields_spelled(missed, (report.predicted.budget['kind'],))}", err=True)
    if overshot := report.predicted.get("budget_overshot"):  # nor overshot in silence
        click.echo(f"note: {fields_spelled(overshot, (report.predicted.budget['kind'],))}", err=True)
    from minreal.compress.core.width.tracing import AXES_NOTE, AXES_WARNING, DECISIONS_NOTE  # torch is loaded

    for note in report.notes:  # a graph fixed at the data's shape is said where the user sees it
        if note.startswith((DECISIONS_NOTE, AXES_NOTE, AXES_WARNING)):
            click.echo(f"{'WARNING' if note.startswith(AXES_WARNING) else 'note'}: {note}", err=True)
    if report.measured.held_out_recovered:
        zero, rec = report.measured.held_out_zero_shot, report.measured.held_out_recovered
        con.table("held out: " + "; ".join(f"{k} zero-shot {zero[k]:.4g} -> recovered {rec[k]:.4g}"
                                           for k in rec if k in zero))
    con.result(report)


def _record_laps(report: CompressionReport, laps: dict[str, float], con: Any) -> None:
    """The command's own phases in ``report.timings_s`` as ``command:<phase>`` (loading the model and data, the
    compression, the held-out measurement, saving the program: together the command's wall time after its imports),
    beside the method's phases, and one progress line with both."""
    report.timings_s.update({f"command:{phase}": seconds for phase, seconds in laps.items()})
    method = {k: v for k, v in report.timings_s.items()
              if k in ("prepare", "realise", "axes_check", "costs", "measure", "recover")}
    inner = f" ({', '.join(f'{k} {v:.1f} s' for k, v in method.items())})" if method else ""
    con.progress("wall time by phase: " + ", ".join(
        f"{phase.replace('_', '-')} {seconds:.1f} s{inner if phase == 'compress' else ''}"
        for phase, seconds in laps.items()))


def _calib_line(calib_samples: int, held: Any, holdout: float) -> str:
    """Progress line saying how --data was used (nothing is held out silently)."""
    if held is None:
        return f"calibrating on all {calib_samples} samples of --data (--data-holdout 0: no held-out measurement)"
    return (f"calibrating on {calib_samples} samples of --data; {len(held)} ({holdout:.0%}, --data-holdout) "
            "held out to measure the compressed model")


def _record_held_out(report: CompressionReport, net: Any, small: Any, calib: Any, held: Any, holdout: float) -> None:
    """``report.measured.held_out``: the compressed model against the original on the held-out samples,
    or None (with a note) when ``--data-holdout 0`` held nothing out."""
    from minreal.compress.core.evaluate import compare_outputs

    if held is None:
        report.measured.held_out = None
        why = "--data-holdout 0" if not holdout else f"--data-holdout {holdout:g} of them rounds to no sample"
        report.notes.append(f"no held-out measurement ({why}): all {len(calib)} samples of --data were calibration "
                            "data, and the models are compared on them")
        return
    report.measured.held_out = {"samples": len(held), **compare_outputs(net, small, held)}
    report.notes.append(f"{len(held)} samples ({holdout:.0%} of --data, seeded) held out for measured.held_out; "
                        f"calibrated on the other {len(calib)}, on which the models are not compared again")
