"""``minreal latency-table``: latencies measured on a provider, per factorisable layer (``--kind rank``), per
channel-group width (``--kind width``) or per residual block removed (``--kind depth``), for the latency-aware
budgets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from minreal.app.cli_help import BENCHMARK, GroupedCommand, GroupedOption
from minreal.app.cli_options import (
    batch_option,
    common,
    data_option,
    input_shape_option,
    int8_option,
    out_option,
    weights_option,
)
from minreal.app.commands._shared import prepare_outputs
from minreal.app.console import Console
from minreal.app.options import known_providers, providers_option, split_ints
from minreal.facts import PROVIDERS

__all__ = ["latency_table_cmd"]


def _table_option(*decls: str, **kwargs: Any) -> Any:
    """An option of latency-table alone, in the Benchmark section of ``--help``."""
    return click.option(*decls, cls=GroupedOption, group=BENCHMARK, **kwargs)


@click.command("latency-table", cls=GroupedCommand)
@click.argument("model")
@out_option("the JSON table.", required=True)
@_table_option("--kind", type=click.Choice(["rank", "width", "depth"]), default="rank", show_default=True, brief=True,
               help="rank: per-layer factorised pairs (factorize --layer-latency-ratio or --latency-ratio); width: "
                    "the whole model with each channel group segment narrowed (--latency-ratio of the width "
                    "methods); depth: the whole model with each residual block removed (depth --latency-ratio).")
@data_option("Data for the example input.")
@input_shape_option("", several=False)
@batch_option("the latencies are measured at.", "1", several=False)
@providers_option(f"The one provider to measure on: {', '.join(PROVIDERS)} (a table holds one provider's "
                  "latencies; run once per provider).")
@_table_option("--ranks-per-layer", type=int, default=6, show_default=True,
               help="Ranks measured per layer (--kind rank).")
@_table_option("--width-multiple", type=click.IntRange(min=1), default=None,
               help="Widths measured in steps of this many channels (--kind width); default the provider's fast "
                    "multiple, as the width methods use it (cpu 16, GPU 8).")
@_table_option("--width-min", type=click.IntRange(min=0), default=None,
               help="No width measured below this many channels (--kind width); default the provider's, as the "
                    "width methods use it (cpu 16, GPU 0). A table serves allocations whose --width-min is at least "
                    "its own.")
@int8_option("time each variant's INT8 file (static QDQ in this CPU's format, calibrated on the example batch) "
             "for a model that will run in INT8 (--kind width or depth, cpu provider): int8 kernels favour other "
             "widths.")
@weights_option
@common
def latency_table_cmd(model: str, out: str, kind: str, data: str | None, input_shape: str | None, batch: int,
                      providers: str, ranks_per_layer: int, width_multiple: int | None, width_min: int | None,
                      int8: bool, weights: str | None, quiet: bool, as_json: bool) -> None:
    """Measure latencies on a provider: per factorisable layer for `compress -m factorize --latency-ratio`
    (--kind rank), per channel-group width for the width methods' --latency-ratio (--kind width), or the whole model
    without each residual block for depth's --latency-ratio (--kind depth)."""
    provider = _one_provider(providers)
    if int8 and (kind == "rank" or provider != "cpu"):
        raise click.UsageError("--int8 measures a width or depth table on the cpu provider: pass --kind width (or "
                               "depth) --providers cpu")
    import torch

    from minreal.app.callables import SpecError
    from minreal.app.data import load_dataset
    from minreal.app.models import check_input_shape, load_model
    from minreal.export.latency_table import build_depth_latency_table, build_latency_table, build_width_latency_table

    con = Console(quiet, as_json)
    prepare_outputs([out], model, weights, data)
    net = load_model(model, weights=weights)
    if data:
        x = load_dataset(data).x[:batch]
    elif input_shape:
        x = torch.randn(batch, *split_ints(input_shape, "--input-shape"))
    else:
        raise SpecError("latency-table needs an example input: pass --data SPEC or --input-shape C,H,W")
    check_input_shape(net, x, model)
    if kind == "width":
        from minreal.compress.core.options import WIDTH_MIN_BY_PROVIDER, WIDTH_MULTIPLE_BY_PROVIDER

        width_multiple = width_multiple or WIDTH_MULTIPLE_BY_PROVIDER.get(provider, 8)
        width_min = WIDTH_MIN_BY_PROVIDER.get(provider, 0) if width_min is None else width_min
        precision = "int8" if int8 else "fp32"
        con.progress(f"timing {model} with each channel-group segment narrowed on {provider} (whole-model exports, "
                     f"{precision})")
        table = build_width_latency_table(net, x, provider, width_multiple, out_path=Path(out),
                                          progress=con.progress, precision=precision, minimum=width_min)
        widths = sum(len(e["widths"]) - 1 for e in table["segments"].values())
        con.table(f"wrote {out} ({len(table['segments'])} segments, {widths} narrower widths on {provider}; "
                  f"whole model {table['model_ms']:.3f} ms at batch {table['batch']})")
    elif kind == "depth":
        precision = "int8" if int8 else "fp32"
        con.progress(f"timing {model} with each residual block removed on {provider} (whole-model exports, "
                     f"{precision})")
        table = build_depth_latency_table(net, x, provider, out_path=Path(out), progress=con.progress,
                                          precision=precision)
        con.table(f"wrote {out} ({len(table['blocks'])} residual blocks on {provider}; whole model "
                  f"{table['model_ms']:.3f} ms at batch {table['batch']})")
    else:
        con.progress(f"timing the factorisable layers of {model} on {provider}")
        table = build_latency_table(net, x, provider, ranks_per_layer, out_path=Path(out))
        con.table(f"wrote {out} ({len(table['layers'])} layers on {provider})")
    con.result(table)


def _one_provider(value: str) -> str:
    """The single provider of ``--providers``; several are a usage error (a table holds one provider's latencies)."""
    names = known_providers(value)
    if len(names) != 1:
        raise click.BadParameter(f"latency-table measures on one provider, got {', '.join(names)}: run it once per "
                                 "provider, each with its own --out", param_hint="--providers")
    return names[0]
