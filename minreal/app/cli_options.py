"""The options several commands take, each declared once: its flag, type and help; a command adds only what the
option is for in that command (``use``), and its default where the commands' defaults differ.

The option groups with readers that turn their values into a config (recovery, pipeline, ORT format, image folders,
providers) are in :mod:`minreal.app.options`; both modules declare their options with
:class:`~minreal.app.cli_help.GroupedOption`, which names the ``--help`` section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from minreal.app.cli_help import BENCHMARK, CRITERIA, EXPORT, MODEL_DATA, OUTPUT, GroupedOption

__all__ = ["DATA_SPECS", "axis_values_decl", "batch_option", "common", "data_option", "dynamic_axes_option",
           "eval_data_option", "fp16_option", "input_shape_option", "int8_option", "max_accuracy_drop_option",
           "max_size_option", "method_option", "min_agreement_option", "min_seconds_option", "no_int8_option",
           "out_option", "overwrite_option", "plan_option", "quant_mode_option", "repeats_option",
           "trust_pickle_option", "weights_option"]

Decorator = Callable[[Callable], Callable]

#: The forms a ``--data`` value takes, said once.
DATA_SPECS = ("SPEC: digits, digits-flat, digits-seq, digits32 (scikit-learn's digits), file.npz/.npy, an image "
              "folder, or module:callable.")


def _option(*decls: str, group: str, **kwargs: Any) -> Decorator:
    return click.option(*decls, cls=GroupedOption, group=group, **kwargs)


def common(fn: Callable) -> Callable:
    """``--quiet`` and ``--json`` on every subcommand."""
    fn = _option("--json", "as_json", is_flag=True, group=OUTPUT, help="Print the result as JSON on stdout.")(fn)
    return _option("--quiet", "-q", is_flag=True, group=OUTPUT, help="No progress messages.")(fn)


def data_option(use: str, required: bool = False) -> Decorator:
    """``--data``; ``use`` says what the command does with it."""
    return _option("--data", required=required, metavar="SPEC", group=MODEL_DATA, brief=True,
                   help=f"{use} {DATA_SPECS}")


def eval_data_option(fn: Callable) -> Callable:
    """``--eval-data``: held-out data (``run``, ``tune``)."""
    return _option("--eval-data", metavar="SPEC", group=MODEL_DATA,
                   help="Held-out data every model is judged on (default: a seeded split of --data); the same forms "
                        "as --data.")(fn)


def weights_option(fn: Callable) -> Callable:
    """``--weights``: a state dict for the model."""
    return _option("--weights", metavar="FILE", group=MODEL_DATA,
                   help="Local weights file (state dict) for a torchvision name or factory.")(fn)


def trust_pickle_option(fn: Callable) -> Callable:
    """``--trust-pickle``: allow a pickled module."""
    return _option("--trust-pickle", is_flag=True, group=MODEL_DATA,
                   help="Allow loading a pickled full nn.Module (unsafe).")(fn)


def method_option(choice: click.Choice, use: str, once: bool = False, once_hint: str = "") -> Decorator:
    """``--method``/``-m``: repeatable, or (``once``) one method, a second being a usage error."""
    return _option("--method", "-m", "method", type=choice, multiple=True, once=once, once_hint=once_hint,
                   required=once, group=MODEL_DATA, brief=True, help=f"A registered compression method {use}")


def plan_option(use: str) -> Decorator:
    """``--plan``: a TOML plan file of variants."""
    return _option("--plan", "plan", type=click.Path(dir_okay=False), metavar="FILE", group=MODEL_DATA,
                   help=f"TOML plan file of [[variant]] tables, each a method or a chain (method = [\"fde\", "
                        f"\"factorize\"]) with its own options: {use}")


def out_option(what: str, default: str | None = None, directory: bool = False, required: bool = False) -> Decorator:
    """``--out``: where the command writes (a file, or a ``directory``)."""
    kind = click.Path(file_okay=False) if directory else click.Path(dir_okay=False)
    return _option("--out", "out", type=kind, default=default, required=required, show_default=default is not None,
                   group=OUTPUT, brief=True, help=f"Where to write {what}")


def overwrite_option(fn: Callable) -> Callable:
    """``--overwrite``: replace an existing ``--out`` directory."""
    return _option("--overwrite", is_flag=True, group=OUTPUT,
                   help="Replace an existing --out directory (by default it must not exist).")(fn)


def batch_option(use: str, default: str, several: bool = True) -> Decorator:
    """``--batch``: comma-separated batch sizes (read with :func:`minreal.app.options.split_ints`), or one."""
    return _option("--batch", "batch", default=default, show_default=True, metavar="N,N..." if several else "N",
                   type=str if several else click.IntRange(min=1), group=BENCHMARK, brief=True,
                   help=("Comma-separated batch sizes" if several else "Batch size") + f" {use}")


def min_seconds_option(use: str, default: float | None = None, checked: bool = True) -> Decorator:
    """``--min-seconds``: a timing window, range-checked by click unless the command's config checks it
    (``checked=False``: ``bench``'s :class:`~minreal.runtime_bench.config.BenchConfig`, which names the flag)."""
    return _option("--min-seconds", type=click.FloatRange(min=0) if checked else float, default=default,
                   show_default=default is not None,
                   metavar="S", group=BENCHMARK, help=f"Minimum measuring time per model, in seconds, {use}")


def repeats_option(use: str, default: int | None = None, checked: bool = True) -> Decorator:
    """``--repeats``: fresh processes per provider and batch, range-checked as ``--min-seconds`` is."""
    return _option("--repeats", type=click.IntRange(min=1) if checked else int, default=default,
                   show_default=default is not None,
                   metavar="N", group=BENCHMARK, help=f"Fresh processes per (provider, batch), {use}")


def axis_values_decl(use: str) -> Decorator:
    """``--axis-values`` (read with :func:`minreal.app.options.axis_values_option`)."""
    return _option("--axis-values", "axis_values", multiple=True, metavar="AXIS=N,N", group=BENCHMARK,
                   help=f"Lengths a dynamic axis is timed at, repeatable: seq=32,128; each length is its own latency "
                        f"row. {use}")


def dynamic_axes_option(use: str = "") -> Decorator:
    """``--dynamic-axes``: the dynamic axes of one input."""
    return _option("--dynamic-axes", "dynamic_axes", multiple=True, metavar="INPUT:AXES", group=EXPORT,
                   help="Dynamic axes of one input, in order ('_' = fixed), repeatable: input_ids:batch,seq (an "
                        f"unnamed input is called 'input'). {use}".rstrip())


def input_shape_option(use: str, several: bool = True) -> Decorator:
    """``--input-shape``: a random example input instead of ``--data``."""
    return _option("--input-shape", "input_shape", multiple=several, metavar="SHAPE", group=MODEL_DATA,
                   help=f"Per-sample input shape, e.g. 3,224,224, for a random example input (no --data). {use}"
                   .rstrip())


def int8_option(use: str) -> Decorator:
    """``--int8``: an INT8 file too."""
    return _option("--int8", is_flag=True, group=EXPORT, help=f"INT8 too: {use}")


def no_int8_option(use: str) -> Decorator:
    """``--no-int8``: no INT8 copies."""
    return _option("--no-int8", is_flag=True, group=EXPORT, help=f"No INT8 quantisation: {use}")


def fp16_option(use: str) -> Decorator:
    """``--fp16``: FP16 copies too."""
    return _option("--fp16", is_flag=True, group=EXPORT, help=f"FP16 copies too: {use}")


def quant_mode_option(default: str) -> Decorator:
    """``--quant-mode``: static or dynamic INT8."""
    from minreal.export.settings import QUANT_MODES

    return _option("--quant-mode", type=click.Choice(QUANT_MODES), default=default, show_default=True, group=EXPORT,
                   help="INT8 quantisation: static, calibrated QDQ; dynamic, weights only, activations quantised at "
                        "run time.")


def max_accuracy_drop_option(fn: Callable) -> Callable:
    """``--max-accuracy-drop``: a quality criterion (``tune``, ``check``)."""
    return _option("--max-accuracy-drop", type=float, metavar="PP", group=CRITERIA, brief=True,
                   help="Largest allowed accuracy drop against the reference model (tune: the original; check: the "
                        "first model), in percentage points (0.5 = half a point).")(fn)


def min_agreement_option(fn: Callable) -> Callable:
    """``--min-agreement``: a quality criterion (``tune``, ``check``)."""
    return _option("--min-agreement", type=click.FloatRange(0.0, 1.0), metavar="FRACTION", group=CRITERIA, brief=True,
                   help="Lowest allowed top-1 agreement with the reference model (tune: the original; check: the "
                        "first model), 0-1.")(fn)


def max_size_option(use: str) -> Decorator:
    """``--max-size``: a file-size limit in KB (``tune``, ``check``)."""
    return _option("--max-size", "max_size_kb", type=click.FloatRange(min=0, min_open=True), metavar="KB",
                   group=CRITERIA, help=f"Largest allowed file in KB (KiB, 1024 bytes; graph and external data on "
                                      f"disk), and of its .ort file where there is one (--format onnx,ort): {use}")
