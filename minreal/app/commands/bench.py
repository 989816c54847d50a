"""``minreal bench``: ONNX models side by side on ONNX Runtime, ratios against the first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from minreal.app.cli_help import BENCHMARK, GroupedCommand, GroupedOption
from minreal.app.cli_options import (
    axis_values_decl,
    batch_option,
    common,
    data_option,
    min_seconds_option,
    out_option,
    repeats_option,
)
from minreal.app.commands._shared import prepare_outputs
from minreal.app.console import Console
from minreal.app.options import (
    axis_values_option,
    image_options,
    image_preprocess,
    provider_options,
    provider_settings,
    providers_option,
    require_providers,
    skip_unavailable_option,
    split_ints,
    split_names,
)
from minreal.app.settings import RUN_BENCH
from minreal.runtime_bench.config import BenchConfig

__all__ = ["bench_cmd"]


def _bench_option(*decls: str, **kwargs: Any) -> Any:
    """An option of bench alone, in the Benchmark section of ``--help``."""
    return click.option(*decls, cls=GroupedOption, group=BENCHMARK, brief=True, **kwargs)


@click.command("bench", cls=GroupedCommand)
@click.argument("models", nargs=-1, required=True, type=click.Path(dir_okay=False))
@providers_option()
@batch_option("to time.", ",".join(map(str, RUN_BENCH.batch_sizes)))
@data_option("Evaluation data (labels give accuracy); random inputs without it.")
@_bench_option("--warmup", type=int, default=BenchConfig.warmup, show_default=True,
               help="Discarded warm-up runs per model.")
@_bench_option("--min-runs", type=int, default=BenchConfig.min_runs, show_default=True,
               help="Minimum measured runs.")
@min_seconds_option("in one process.", BenchConfig.min_seconds, checked=False)  # BenchConfig checks them
@repeats_option("each timing the models in turn.", BenchConfig.repeats, checked=False)
@_bench_option("--threads", type=int, help="Intra-op threads (default: physical cores).")
@_bench_option("--worker-timeout", "worker_timeout", type=float, default=BenchConfig.worker_timeout_s,
               show_default=True, metavar="SECONDS",
               help="Wall-clock limit of one measuring process (a provider and batch size: its files' warm-up and "
                    "measured runs; a large model on a slow machine may need more).")
@out_option("the report JSON; a Markdown copy is written next to it.", "bench.json")
@axis_values_decl("Symbolic axes by their ONNX dimension name; with --data, inputs are cut to each length.")
@provider_options
@skip_unavailable_option
@image_options
@common
def bench_cmd(models: tuple[str, ...], providers: str, batch: str, data: str | None, warmup: int,
              min_runs: int, min_seconds: float, repeats: int, threads: int | None, worker_timeout: float, out: str,
              axis_values: tuple[str, ...], provider_option: tuple[str, ...], provider_config: str | None,
              io_binding: bool, skip_unavailable_providers: bool, quiet: bool, as_json: bool, **opts: Any) -> None:
    """Benchmark ONNX MODELS side by side (ratios vs the first) with ONNX Runtime."""
    import minreal.runtime_bench as rb

    con = Console(quiet, as_json)
    preprocess = image_preprocess(opts)
    from minreal.app.data import require_image_folder

    require_image_folder(preprocess, data)
    settings = provider_settings(provider_option, provider_config, split_names(providers))
    if io_binding and not set(split_names(providers)) - {"cpu"}:
        click.echo("WARNING: --io-binding applies to GPU providers (cuda, tensorrt); --providers has none", err=True)
    require_providers(split_names(providers), skip_unavailable_providers)  # fail fast, before any loading
    prepare_outputs([out, Path(out).with_suffix(".md")], *models, data)
    x = y = None
    if data:
        from minreal.app.data import load_dataset
        from minreal.export.verify import feeds_of

        # the user's evaluation data, all of it (named inputs keyed by graph input)
        held = load_dataset(data, preprocess=preprocess)
        x = feeds_of(held.x)
        y = None if held.y is None else held.y.numpy()
    cfg = rb.BenchConfig(providers=split_names(providers), batch_sizes=split_ints(batch, "--batch"),
                         warmup=warmup, min_runs=min_runs, min_seconds=min_seconds, repeats=repeats,
                         intra_op_threads=threads, worker_timeout_s=worker_timeout,
                         axis_values=axis_values_option(axis_values),
                         provider_settings=settings, io_binding=io_binding)
    entries = [rb.ModelEntry(name, Path(m)) for name, m in zip(_model_names(models), models)]
    report = rb.run_benchmark(entries, cfg, x, y, progress=con.progress,
                              fail_on_unavailable=not skip_unavailable_providers)
    rb.write_json(report, Path(out))
    rb.write_markdown(report, Path(out).with_suffix(".md"))
    con.table(rb.format_table(report))
    con.result(report)


def _model_names(models: tuple[str, ...]) -> list[str]:
    """Each file's name in the report: its stem (``m.int8.onnx`` -> ``m.int8``), or, where two files share a stem,
    the path as given without its suffix (``small`` and ``e/small``), or with it where that is shared too (``m.onnx``
    and ``m.ort``); the same file twice is a usage error."""
    seen: dict[Path, int] = {}
    for i, m in enumerate(models):
        if (first := seen.setdefault(Path(m).resolve(), i)) != i:
            raise click.BadParameter(f"{m} is given twice (as {models[first]} too); give each model once",
                                     param_hint="MODELS")
    stems = [Path(m).stem for m in models]
    names = [str(Path(m).with_suffix("")) if stems.count(stem) > 1 else stem for m, stem in zip(models, stems)]
    return [m if names.count(name) > 1 else name for m, name in zip(models, names)]  # m.onnx, m.ort: as given
