"""What several commands share beyond their options: input files and outputs, loading a model with its data,
the data check's warning, dynamic axes, the torchrun refusal and a run directory's summary."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import click

from minreal.app.console import Console, shown_live

__all__ = ["case_dynamic_axes", "finish_run", "input_files", "load_inputs", "prepare_outputs", "refuse_torchrun",
           "warn_data_check"]

def input_files(*specs: str | None) -> list[Path]:
    """Files named by input specs (a path, or the file of a ``file.py:factory`` spec)."""
    return [Path(p) for spec in filter(None, specs) for p in {spec, spec.rsplit(":", 1)[0]}]


def prepare_outputs(outputs: list[str | Path | None], *inputs: str | None) -> None:
    """Refuse an output that is one of the inputs or another output; create each output's folder or say why
    it cannot be. Folders created here and still empty when the command ends (it failed) are removed."""
    from minreal.app.callables import SpecError
    from minreal.export.atomic import ensure_distinct, make_dirs, remove_empty_dirs

    outs = [Path(out) for out in filter(None, outputs)]
    _ensure_distinct_outputs(outs)
    created: list[Path] = []
    click.get_current_context().call_on_close(lambda: remove_empty_dirs(created))
    for out in outs:
        for path in input_files(*inputs):
            ensure_distinct(path, out)
        try:
            created += make_dirs(out.parent)
        except OSError as exc:
            raise SpecError(f"cannot create the folder of output {out}: {exc.strerror or exc}") from None
        if not os.access(out.parent, os.W_OK):
            raise SpecError(f"output {out}: folder {out.parent} is not writable")


def _ensure_distinct_outputs(outs: list[Path]) -> None:
    """Two outputs of one command may not be the same file (the second would silently replace the first)."""
    from minreal.export.errors import SameFileError

    seen: dict[Path, Path] = {}
    for out in outs:
        first = seen.setdefault(out.resolve(), out)
        if first is not out:
            raise SameFileError(f"outputs {first} and {out} are the same file; give each output its own path")


def load_inputs(model: str, weights: str | None, trust_pickle: bool, data: str, eval_data: str | None,
                holdout: float | None = None, preprocess: Any = None,
                allow_mismatch: bool = False) -> tuple[Any, Any, Any]:
    """The model (packed for its inputs) and its checked calibration and held-out data (``None`` when nothing is
    held out); ``allow_mismatch`` (``--allow-data-mismatch``) lets labels outside the model's outputs through with a
    warning."""
    from minreal.app.data import load_data
    from minreal.app.models import checked_dataset, load_model, packed_model

    net = load_model(model, weights=weights, trust_pickle=trust_pickle)
    loaded = load_data(data, eval_spec=eval_data, preprocess=preprocess,
                       **({} if holdout is None else {"eval_fraction": holdout}))
    net = packed_model(net, loaded.calib.x, model)
    calib = checked_dataset(net, loaded.calib, model, data, allow_mismatch)
    held = None if loaded.evaluation is None else checked_dataset(net, loaded.evaluation, model, eval_data or data,
                                                                  allow_mismatch)
    return net, calib, held


def warn_data_check(check: Any) -> None:
    """A loud line on stderr when the original scores near chance on the labelled data."""
    if check.near_chance:
        allowed = " (--allow-data-mismatch)" if check.allowed else ""
        click.echo(f"WARNING: data mismatch{allowed}: {check.message()}", err=True)


def case_dynamic_axes(given: dict[str, dict[int, str]], calib: Any, held: Any) -> dict[str, dict[int, str]]:
    """``--dynamic-axes`` plus the axes along which calibration and held-out inputs differ in length."""
    from minreal.app.shapes import infer_dynamic_axes, merge_axes

    inferred = {} if held is None else infer_dynamic_axes(calib, held)
    if inferred:
        logging.getLogger(__name__).info("dynamic axes inferred from differing data lengths: %s", inferred)
    return merge_axes(inferred, given)


def refuse_torchrun(command: str) -> None:
    """``run``/``tune`` export and time in one process: under torchrun every rank would do it all again."""
    from minreal.compress.core.distributed import launched_by_torchrun

    if launched_by_torchrun():
        raise click.UsageError(f"{command} does not run under torchrun (every rank would export and time): "
                               "compress under torchrun with `minreal compress`, then pass its .pt2 to "
                               f"`minreal {command}` in one process; tune scales out with --executor ray")


def finish_run(con: Console, report: Any, out: str, digest: bool = False, columns: int | None = None) -> None:
    """Show a run directory's report: the compact table, recovery and INT8 tables, each case's warnings. With
    ``digest`` (the demo), warnings grouped per case and kind and one line per case saying what won and why; when
    all would not fit :data:`~minreal.app.digest.SCREEN_LINES`, the compact table keeps only the models those lines
    name, and the recovery and INT8 tables are left to report.md. With ``columns`` too, every line fits that many
    columns: the table is :func:`~minreal.app.screen.screen_table`, the recovery and INT8 tables (wider) are left to
    report.md, and warnings and verdicts take shorter wordings where the full ones do not fit."""
    from minreal.app.case_warnings import split_level
    from minreal.app.report import format_compact, format_int8, format_recovery, ort_fp16_note, ort_line
    from minreal.app.screen import clip, first_fitting

    tables = [t for t in (format_recovery(report), format_int8(report)) if t]
    ort = [clip(line, columns) for line in filter(None, [*map(ort_line, report.cases), ort_fp16_note(report)])]
    compact, warnings, verdicts = format_compact(report), [], []
    if digest:
        compact, tables, warnings, verdicts = _digest(report, tables, len(ort), columns)
    con.table(compact)
    for table in tables:
        con.table("\n" + table)
    if digest:
        for line in warnings:
            click.echo(line, err=True)
        if verdicts:
            con.table("\n" + "\n".join(verdicts))
    else:
        for case in report.cases:
            for level, text in map(split_level, case.warnings):
                if not shown_live(text):  # a log record the console printed as it came is not printed twice
                    click.echo(f"{level} [{case.name}] {text}", err=True)
    for line in ort:
        con.table("\n" + line)
    where = f"\nrun directory: {out}"
    con.table(f"{where} (full table in report.md; report.json, plot.png, ONNX files per case)" if columns is None else
              first_fitting([f"{where} (all models and warnings in report.md; report.json, plot.png, ONNX files)",
                             f"{where} (all models and warnings in report.md)"], columns + 1))  # + its blank line
    con.result(report)


def _digest(report: Any, tables: list[str], ort_lines: int,
            columns: int | None) -> tuple[str, list[str], list[str], list[str]]:
    """The demo's end of run: the compact table and the other tables (cut to fit a screen), the grouped warnings
    and the verdict lines (within ``columns``, when given: see :func:`finish_run`)."""
    from minreal.app.digest import SCREEN_LINES, VERDICT_LEGEND, WarningDigest, verdict_models, winner_lines
    from minreal.app.report import format_compact
    from minreal.app.screen import clip, screen_table

    warnings = WarningDigest()
    for case in report.cases:
        warnings.add(case.name, case.warnings)
    verdicts = winner_lines(report, columns)
    if columns is not None and verdicts:
        verdicts = [clip(VERDICT_LEGEND, columns), *verdicts]
    if columns is not None:
        tables = []  # the recovery and INT8 tables are wider than a screen: report.md has them

    def table(keep: Any = None) -> str:
        return format_compact(report, keep) if columns is None else screen_table(report, keep, columns)

    compact = table()
    fixed = len(report.cases) + len(warnings.lines()) + len(verdicts) + 2 * ort_lines + 4  # progress, blank lines
    if compact.count("\n") + 1 + sum(t.count("\n") + 2 for t in tables) + fixed > SCREEN_LINES:
        names = verdict_models(report)
        compact, tables = table(lambda case, model: (case, model) in names), []
        if columns is None:
            head, _, body = compact.partition("\n")
            compact = f"{head}: the models the verdicts below name (every model in report.md)\n{body}"
    return compact, tables, warnings.lines(columns), verdicts
