"""``minreal demo``: the embedded demo on scikit-learn's digits: train, compress, export, quantise,
benchmark."""

from __future__ import annotations

from pathlib import Path

import click

from minreal.app.cli_help import MODEL_DATA, GroupedCommand, GroupedOption
from minreal.app.cli_options import common, out_option, overwrite_option
from minreal.app.commands._shared import finish_run
from minreal.app.console import Console
from minreal.app.options import split_names

__all__ = ["demo_cmd"]


def _demo_keys_help() -> str:
    """``--only`` help: the digits models and the registered methods that ship a demo case."""
    from minreal.compress import get_method, method_names

    own = [n for n in method_names() if get_method(n).demo_case is not None]
    return (f"Comma-separated demo cases: digits-mlp, digits-cnn, or a method name ({', '.join(own)}) for that "
            "method's own case.")


@click.command("demo", cls=GroupedCommand)
@out_option("the run directory.", "runs/demo", directory=True)
@overwrite_option
@click.option("--only", cls=GroupedOption, group=MODEL_DATA, brief=True, help=_demo_keys_help())
@click.option("--full", is_flag=True, cls=GroupedOption, group=MODEL_DATA, brief=True,
              help="Longer training and the full 2 s timing protocol.")
@common
def demo_cmd(out: str, overwrite: bool, only: str | None, full: bool, quiet: bool, as_json: bool) -> None:
    """Embedded demo on scikit-learn's digits: train, compress, export, quantise, benchmark."""
    from dataclasses import replace

    from minreal.app.demo import DEMO_PIPELINE, demo_cases
    from minreal.app.digest import CaseProgress
    from minreal.app.pipeline import fill_run_dir
    from minreal.app.rundir import claim_run_dir
    from minreal.app.screen import SCREEN_COLUMNS
    from minreal.app.settings import PipelineConfig

    con = Console(quiet, as_json, brief=True)
    with claim_run_dir(Path(out), overwrite) as claim:  # locked until the run directory is committed
        con.progress("training demo models (seeded)")
        try:
            cases = demo_cases(quick=not full, only=split_names(only or ""))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--only") from None
        cfg = PipelineConfig() if full else DEMO_PIPELINE
        report = fill_run_dir(cases, claim, replace(cfg), CaseProgress(con.progress, len(cases)))
    finish_run(con, report, out, digest=True, columns=SCREEN_COLUMNS)
