"""The ``minreal`` command: a thin click shell over the Python API (compress, export, runtime_bench)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import click

from minreal.app.settings import HOLDOUT_FRACTION, PipelineConfig
from minreal.export.settings import QUANT_MODES, QUANT_TARGETS, VariantConfig
from minreal.facts import PROVIDERS
from minreal.runtime_bench.config import BenchConfig

__all__ = ["cli", "console", "main", "run"]

#: OpenMP threads sleep when idle unless the user says otherwise: busy-waiting threads stall torch's many small CPU
#: operations whenever another process shares the cores (the statistics pass of a ResNet-20: 40 s against 2 s on a
#: 2-core machine running a second job). Read once, when torch loads, which the command line defers until needed.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

USAGE_EXIT, FAIL_EXIT = 2, 1
TERM_EXIT = 128 + int(signal.SIGTERM)  # 143: what a shell reports for a process ended by SIGTERM
#: ``--quant-target``'s help, the same in every command.
QUANT_TARGET_HELP = ("INT8 format. cpu-vnni: uint8 activations, 8-bit weights (x86 with VNNI/AMX, ARM); cpu-avx2: "
                     "7-bit weights, which cannot saturate ONNX Runtime's int16 step on x86 without VNNI; cpu: the "
                     "one of the two this machine needs; tensorrt: symmetric int8, what TensorRT builds.")


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so the same cleanup runs as for Ctrl-C (KeyboardInterrupt)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


from minreal.facts import DETAIL_KEY, PROGRESS_KEY  # noqa: E402  (compress and runtime_bench log with this key)

LIBRARY_LOGGERS = ("minreal.compress", "minreal.runtime_bench", "minreal.export")


class ProgressBars(logging.Handler):
    """Draws the library's progress log records as tqdm bars on stderr (one bar per task); where stderr is not a
    terminal (a log file, CI), one line per task at most every :data:`LINE_EVERY_S` seconds and at its end, with
    the elapsed time."""

    LINE_EVERY_S = 10.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(logging.INFO)
        self.bars: dict[str, Any] = {}
        self.clock = clock
        self.lines: dict[str, tuple[float, float, int]] = {}  # task -> (started, last line, done)

    def emit(self, record: logging.LogRecord) -> None:
        info = getattr(record, PROGRESS_KEY, None)
        if info is None:
            return
        detail = getattr(record, DETAIL_KEY, "")
        if not sys.stderr.isatty():
            self._line(*info, detail)
            return
        from tqdm import tqdm

        task, done, total = info
        if detail:
            tqdm.write(f"· {task}: {done}/{total}: {detail}", file=sys.stderr)
        bar = self.bars.get(task)
        if bar is None or done <= bar.n:
            if bar is not None:
                bar.close()
            bar = self.bars[task] = tqdm(total=total, desc=task, leave=False, file=sys.stderr, disable=None)
        bar.update(done - bar.n)
        if done >= total:
            self.bars.pop(task).close()

    def _line(self, task: str, done: int, total: int, detail: str = "") -> None:
        """``· task: done/total (elapsed s)``, throttled per task; the last one, and one with a detail (an epoch's
        losses), always."""
        now = self.clock()
        started, last, before = self.lines.get(task, (now, -math.inf, -1))
        if done < before:  # the task began again (e.g. after an error): its own clock
            started, last = now, -math.inf
        if done < total and not detail and now - last < self.LINE_EVERY_S:
            self.lines[task] = (started, last, done)
            return
        click.echo(f"· {task}: {done}/{total}: {detail}" if detail
                   else f"· {task}: {done}/{total} ({now - started:.0f} s)",
                   err=True)
        if done >= total:
            self.lines.pop(task, None)
        else:
            self.lines[task] = (started, now, done)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()
        self.lines.clear()
        super().close()


class Console:
    """Where the CLI talks: progress and tables on stderr/stdout, or one JSON document with ``--json``."""

    def __init__(self, quiet: bool, as_json: bool) -> None:
        self.quiet, self.as_json = quiet, as_json
        root = logging.getLogger()
        for old in [h for h in root.handlers if isinstance(h, ProgressBars)]:
            root.removeHandler(old)
            old.close()
        if not quiet:
            root.addHandler(ProgressBars())
            for name in LIBRARY_LOGGERS:
                logging.getLogger(name).setLevel(logging.INFO)

    def progress(self, msg: str) -> None:
        if not self.quiet:
            click.echo(f"· {msg}", err=True)

    def table(self, text: str) -> None:
        if not self.as_json:  # --quiet silences progress only; results are still shown
            click.echo(text)

    def result(self, obj: Any) -> None:
        if self.as_json:
            click.echo(json.dumps(_plain(obj), indent=2))


def _plain(obj: Any) -> Any:
    from minreal.export.json_safe import to_jsonable  # one JSON conversion for the whole tool

    return to_jsonable(asdict(obj) if is_dataclass(obj) and not isinstance(obj, type) else obj)


def common(fn: Callable) -> Callable:
    """``--quiet`` and ``--json`` on every subcommand."""
    fn = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")(fn)
    return click.option("--quiet", "-q", is_flag=True, help="No progress messages.")(fn)


class GroupedOption(click.Option):
    """A click option that names the ``--help`` section it belongs to."""

    def __init__(self, *args: Any, group: str = "", method_option: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group
        self.method_option = method_option  # declared by a method's config (minreal methods NAME lists it)


HELP_ALL = "minreal_help_all"


def _help_all(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL] = True
        click.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


class MethodCommand(click.Command):
    """A command whose ``--help`` lists its own options, then the budget and options every method shares; each
    method's own options are accepted but listed by ``minreal methods NAME`` (one screen of help, not a hundred
    lines)."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        extra = click.Option(["--help-all"], is_flag=True, expose_value=False, is_eager=True, callback=_help_all,
                             help="Show every option with its help, grouped, and exit.")
        return [*super().get_params(ctx), extra]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from minreal.compress.core.options import BUDGET_FIELDS, BUDGET_HELPERS

        budget = {"--" + f.replace("_", "-") for f in (*BUDGET_FIELDS, *(h for hs in BUDGET_HELPERS.values()
                                                                             for h in hs))}
        sections: dict[str, list[tuple[str, str]]] = {}
        hidden, full = 0, ctx.meta.get(HELP_ALL, False)
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            own = getattr(param, "method_option", False) and not set(param.opts) & budget
            if own and not full:
                hidden += 1
                continue
            title = "Budget (the methods that can meet it)" if getattr(param, "method_option", False) and not own \
                else getattr(param, "group", "") or "Options"
            sections.setdefault(title, []).append(record)
        for title, rows in sections.items():
            with formatter.section(title):
                if full or title == "Options" or title.startswith("Budget"):
                    formatter.write_dl(rows)
                else:  # a group of its own (recovery, image folders): its flags; --help-all gives their help
                    flags = " ".join(re.findall(r"--[\w-]+", flag)[0] for flag, _ in rows)
                    width = max(40, (formatter.width or 80) - formatter.current_indent)
                    formatter.write_text("\b\n" + "\n".join(textwrap.wrap(flags, width, break_on_hyphens=False)))
        if not full:
            with formatter.section("More"):
                formatter.write_text("--help-all: every option with its help.")
        if full:
            return
        with formatter.section("Method options"):
            formatter.write_text(f"Each method also takes options of its own ({hidden} in all); `minreal methods "
                                 "NAME` lists one method's options, budgets and defaults, e.g. `minreal methods "
                                 "fde`. Given once for several -m methods, an option reaches the methods that "
                                 "have it.")


def method_options(fn: Callable) -> Callable:
    """One option per config field of the registered methods (see minreal.app.method_options); ``--help`` lists
    those every method shares and says how to see a method's own (``minreal methods NAME``)."""
    from minreal.app.method_options import method_option_specs

    for spec in reversed(method_option_specs()):
        helptext = spec.help
        if spec.kind is bool:
            opt = click.option(f"{spec.flag}/--no-{spec.flag[2:]}", spec.field, default=None, help=helptext,
                               cls=GroupedOption, group=spec.group,
                               method_option=True)
        else:
            kind = click.Choice(spec.choices) if spec.choices else spec.kind
            opt = click.option(spec.flag, spec.field, type=kind, default=None, multiple=spec.multiple,
                               help=helptext + (" Repeat for several values." if spec.multiple else ""),
                               cls=GroupedOption, group=spec.group,
                               method_option=True)
        fn = opt(fn)
    return fn


def _method_choice() -> click.Choice:
    from minreal.compress import method_names

    return click.Choice(method_names())


def _split_ints(value: str, name: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint=name) from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"expected positive integers, got {value!r}", param_hint=name)
    return out


def _split_names(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _fixed_shapes_option(fn: Callable) -> Callable:
    """``--fixed-shapes``, read back by :func:`_fixed_shapes`."""
    return click.option(
        "--fixed-shapes", "fixed_shapes", metavar="DIM=N|INPUT=AxB,...",
        help="Fix symbolic dimensions in the written ONNX files for edge runtimes (NNAPI runs no node fed by a "
             "dynamic shape): DIM=N fixes a dimension by name (batch=1; the exporter names axis 0 'batch'), "
             "INPUT=AxBxC gives a graph input its whole shape (input_ids=1x128); comma-separated. Parity is checked "
             "on the dynamic graph, then the fixed file against it at its shape. A fixed batch is the only batch "
             "size a file runs at.")(fn)


def _fixed_shapes(text: str | None) -> Any:
    """The :class:`~minreal.export.mobile.ShapeSpec` of ``--fixed-shapes`` (``None`` when not given)."""
    if not text:
        return None
    from minreal.export.mobile import parse_fixed_shapes

    try:
        return parse_fixed_shapes(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--fixed-shapes") from None


def _with_fixed_shapes(cfg: Any, spec: Any) -> Any:
    """``cfg`` (a :class:`PipelineConfig`) with ``--fixed-shapes``. A fixed-batch file runs at that batch only: it
    becomes the batch size timed when ``--batch`` was not given, and a ``--batch`` asking for another is an error."""
    from dataclasses import replace

    fixed = spec.batch() if spec is not None else None
    if fixed is not None and set(cfg.batch_sizes) != {fixed}:
        if click.get_current_context().get_parameter_source("batch") is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError(f"--batch {','.join(map(str, cfg.batch_sizes))} conflicts with --fixed-shapes "
                                   f"(batch {fixed}): a fixed-batch model runs only at batch {fixed}; pass --batch "
                                   f"{fixed} or leave --batch out")
        cfg = replace(cfg, batch_sizes=(fixed,))
    return cfg if spec is None else replace(cfg, fixed_shapes=spec)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="minreal")
def cli() -> None:
    """minreal: compress PyTorch models by structure, export to ONNX, benchmark with ONNX Runtime.

    Models: a torchvision name or resnet20_cifar (with --weights), path/file.py:factory,
    package.module:factory, a .pt2 torch.export program. Data: digits, digits-flat, digits-seq, digits32,
    file.npz/.npy, an image folder, or module:callable.
    """


@cli.command("methods")
@click.argument("name", required=False)
@common
def methods_cmd(name: str | None, quiet: bool, as_json: bool) -> None:
    """List the registered compression methods, or one method's options, budgets and defaults (NAME)."""
    from minreal.app.method_options import method_option_specs
    from minreal.compress import get_method, method_names

    con = Console(quiet, as_json)
    if name is not None and name not in method_names():
        raise click.UsageError(f"unknown method {name!r}; choose from {', '.join(method_names())}")
    specs = method_option_specs()
    if name is not None:
        con.table(_method_page(name, specs))
        con.result(_method_record(name, specs))
        return
    rows = {n: {"summary": get_method(n).summary, "two_phase": get_method(n).two_phase,
                "options": [s.flag for s in specs if n in s.methods]} for n in method_names()}
    phase = {True: "prepares once, realises each budget cheaply", False: "all its work depends on the budget"}
    con.table("\n".join(f"{n:<12} {r['summary']} ({phase[r['two_phase']]})\n{'':<12} {' '.join(r['options'])}"
                        for n, r in rows.items()) + "\n\n`minreal methods NAME`: one method's options and defaults.")
    con.result(rows)


def _method_record(name: str, specs: list[Any]) -> dict[str, Any]:
    """One method's summary, budgets and options (flag, default, help, choices), as ``methods NAME --json``."""
    from minreal.compress import get_method

    method = get_method(name)
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else None
                for f in dataclasses.fields(method.config_cls)}
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(method.config_cls)}
    options = [{"flag": s.flag, "default": _plain(defaults.get(s.field)), "help": helps.get(s.field, s.help),
                "choices": list(s.choices) if s.choices else None} for s in specs if name in s.methods]
    return {"name": name, "summary": method.summary, "budgets": list(method.budgets),
            "two_phase": method.two_phase, "options": options}


def _method_page(name: str, specs: list[Any]) -> str:
    record = _method_record(name, specs)
    budgets = ", ".join("--" + b.replace("_", "-") for b in record["budgets"]) or "none (its own options set the size)"
    lines = [f"{name}: {record['summary']}", f"budgets: {budgets}",
             "prepares once and realises each budget cheaply" if record["two_phase"] else
             "all its work depends on the budget", "", "options (default):"]
    for o in record["options"]:
        lines.append(f"  {o['flag']} ({o['default']!r})"
                     + (f" one of {', '.join(o['choices'])}" if o["choices"] else ""))
        lines += ["      " + ln for ln in textwrap.wrap(o["help"], 100)]
    return "\n".join(lines)


def _input_files(*specs: str | None) -> list[Path]:
    """Files named by input specs (a path, or the file of a ``file.py:factory`` spec)."""
    return [Path(p) for spec in filter(None, specs) for p in {spec, spec.rsplit(":", 1)[0]}]


def _prepare_outputs(outputs: list[str | Path | None], *inputs: str | None) -> None:
    """Refuse an output that is one of the inputs or another output; create each output's folder or say why
    it cannot be. Folders created here and still empty when the command ends (it failed) are removed."""
    from minreal.app.callables import SpecError
    from minreal.export.atomic import ensure_distinct, make_dirs, remove_empty_dirs

    outs = [Path(out) for out in filter(None, outputs)]
    _ensure_distinct_outputs(outs)
    created: list[Path] = []
    click.get_current_context().call_on_close(lambda: remove_empty_dirs(created))
    for out in outs:
        for path in _input_files(*inputs):
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


def _load_inputs(model: str, weights: str | None, trust_pickle: bool, data: str, eval_data: str | None,
                 holdout: float | None = None, preprocess: Any = None) -> tuple[Any, Any, Any]:
    from minreal.app.data import load_data
    from minreal.app.models import checked_dataset, load_model, packed_model

    net = load_model(model, weights=weights, trust_pickle=trust_pickle)
    loaded = load_data(data, eval_spec=eval_data, preprocess=preprocess,
                       **({} if holdout is None else {"eval_fraction": holdout}))
    net = packed_model(net, loaded.calib.x, model)
    calib = checked_dataset(net, loaded.calib, model, data)
    held = None if loaded.evaluation is None else checked_dataset(net, loaded.evaluation, model, eval_data or data)
    return net, calib, held


def _calib_line(calib_samples: int, held: Any, holdout: float) -> str:
    """Progress line saying how --calib was used (nothing is held out silently)."""
    if held is None:
        return f"calibrating on all {calib_samples} samples of --calib (--calib-holdout 0: no held-out measurement)"
    return (f"calibrating on {calib_samples} samples of --calib; {len(held)} ({holdout:.0%}, --calib-holdout) "
            "held out to measure the compressed model")


def _record_held_out(report: Any, net: Any, small: Any, calib: Any, held: Any, holdout: float) -> None:
    """``report.measured["held_out"]``: the compressed model against the original on the held-out samples,
    or None (with a note) when ``--calib-holdout 0`` held nothing out."""
    from minreal.compress.core.evaluate import compare_outputs

    if held is None:
        report.measured["held_out"] = None
        why = "--calib-holdout 0" if not holdout else f"--calib-holdout {holdout:g} of them rounds to no sample"
        report.notes.append(f"no held-out measurement ({why}): all {len(calib)} samples of --calib were calibration "
                            "data, and the models are compared on them")
        return
    report.measured["held_out"] = {"samples": len(held), **compare_outputs(net, small, held)}
    report.notes.append(f"{len(held)} samples ({holdout:.0%} of --calib, seeded) held out for measured.held_out; "
                        f"calibrated on the other {len(calib)}, on which the models are not compared again")


IMAGE_GROUP = "Image folders (data given as a folder of images)"


def _image_options(fn: Callable) -> Callable:
    """``--image-size``, ``--mean``, ``--std``, ``--preprocess``: how an image folder becomes inputs (see
    :class:`minreal.app.preprocess.ImagePreprocess`); read back by :func:`_image_preprocess`."""
    for opt in reversed([
        click.option("--image-size", "image_size", metavar="N|HxW", cls=GroupedOption, group=IMAGE_GROUP,
                     help="Centre crop (height x width) after resizing the short side to its larger side; default "
                          "224, ImageNet's. A model trained on 32x32 images (CIFAR) needs 32."),
        click.option("--mean", "image_mean", metavar="R,G,B", cls=GroupedOption, group=IMAGE_GROUP,
                     help="Per-channel mean the model was trained with, on [0, 1] pixels (default ImageNet's "
                          "0.485,0.456,0.406)."),
        click.option("--std", "image_std", metavar="R,G,B", cls=GroupedOption, group=IMAGE_GROUP,
                     help="Per-channel standard deviation, positive (default ImageNet's 0.229,0.224,0.225)."),
        click.option("--preprocess", "image_preprocess", metavar="WEIGHTS_ENTRY", cls=GroupedOption,
                     group=IMAGE_GROUP,
                     help="Resize, crop, mean and std of a torchvision weights entry's transforms(), e.g. "
                          "ResNet18_Weights.IMAGENET1K_V1 (nothing is downloaded); not with "
                          "--image-size/--mean/--std."),
    ]):
        fn = opt(fn)
    return fn


def _image_preprocess(opts: dict[str, Any]) -> Any:
    """Pop the image options from ``opts`` (the command's keyword arguments) and return the
    :class:`~minreal.app.preprocess.ImagePreprocess` they ask for, or None when none was given (the defaults)."""
    from minreal.app.preprocess import preprocess_from_options

    return preprocess_from_options(opts.pop("image_size"), opts.pop("image_mean"), opts.pop("image_std"),
                                   opts.pop("image_preprocess"))


def _mismatch_option(fn: Callable) -> Callable:
    return click.option("--allow-data-mismatch", is_flag=True,
                        help="Go on, with a warning recorded in the report, when the original model scores near "
                             "chance on the labelled data (which otherwise stops the command: the data most likely "
                             "does not match the model's preprocessing or labels).")(fn)


def _warn_data_check(check: Any) -> None:
    """A loud line on stderr when the original scores near chance on the labelled data."""
    if check.near_chance:
        allowed = " (--allow-data-mismatch)" if check.allowed else ""
        click.echo(f"WARNING: data mismatch{allowed}: {check.message()}", err=True)


RECOVERY_GROUP = "Recovery (after any method)"


def _recovery_options(fn: Callable) -> Callable:
    """``--recover-*``: distillation from the original after the method (see
    :class:`minreal.compress.core.recover.RecoveryConfig`), off by default; read back by :func:`_recovery_config`."""
    from minreal.compress.core.recover_options import TASKS, RecoveryConfig

    base = RecoveryConfig()
    for opt in reversed([
        click.option("--recover-epochs", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
                     cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Epochs of distillation from the original on the data after compressing; 0: none."),
        click.option("--recover-steps", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
                     cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Budget in optimiser steps instead of epochs (not with --recover-epochs)."),
        click.option("--recover-alpha", type=click.FloatRange(0.0, 1.0), default=base.alpha, show_default=True,
                     cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Weight of the label loss (when the data has labels); 0: pure distillation, 1: labels "
                          "alone."),
        click.option("--recover-lr", type=click.FloatRange(min=0.0, min_open=True), default=base.lr,
                     show_default=True, cls=GroupedOption, group=RECOVERY_GROUP,
                     help="AdamW learning rate of the recovery (cosine schedule with warm-up)."),
        click.option("--recover-temperature", type=click.FloatRange(min=0.0, min_open=True), default=base.temperature,
                     show_default=True, cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Softmax temperature of the distillation loss (classifiers)."),
        click.option("--recover-batch-size", type=click.IntRange(min=1), default=base.batch_size, show_default=True,
                     cls=GroupedOption, group=RECOVERY_GROUP, help="Training batch size of the recovery."),
        click.option("--recover-patience", type=click.IntRange(min=1), default=base.patience, show_default=True,
                     cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Stop after this many epochs without improvement on the recovery's validation split."),
        click.option("--recover-features", multiple=True, metavar="auto|MODULE", cls=GroupedOption,
                     group=RECOVERY_GROUP,
                     help="Also match intermediate features: 'auto' (the layers the method changed) or module names "
                          "(repeat); points whose output shape changed are skipped and reported."),
        click.option("--recover-feature-weight", type=click.FloatRange(min=0.0), default=base.feature_weight,
                     show_default=True, cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Weight of the feature-matching term against the output loss."),
        click.option("--recover-task", type=click.Choice(list(TASKS)), default=base.task, show_default=True,
                     cls=GroupedOption, group=RECOVERY_GROUP,
                     help="auto: integer labels mean classification, float labels regression; without labels, "
                          "outputs (batch, k>1) are taken for logits. Give regression for an unlabelled "
                          "multi-output regressor."),
        click.option("--recover-weight-decay", type=click.FloatRange(min=0.0), default=base.weight_decay,
                     show_default=True, cls=GroupedOption, group=RECOVERY_GROUP, help="AdamW weight decay."),
        click.option("--recover-warmup", type=click.FloatRange(0.0, 1.0, max_open=True), default=base.warmup,
                     show_default=True, cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Share of the steps with a linear learning-rate warm-up."),
        click.option("--recover-val-fraction", type=click.FloatRange(0.0, 1.0, max_open=True),
                     default=base.val_fraction, show_default=True, cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Share of the data held out (seeded) as the recovery's validation split (early stopping)."),
        click.option("--recover-seed", type=int, default=base.seed, show_default=True, cls=GroupedOption,
                     group=RECOVERY_GROUP, help="Seed of the split, the batch order and the training."),
        click.option("--recover-freeze-bn", "recover_freeze_batchnorm", flag_value=True, default=None,
                     cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Keep BatchNorm statistics frozen while training (re-estimated exactly after each "
                          "epoch), as a torchrun recovery always does: give it to one process to get the "
                          "distributed result; default in one process: batch statistics."),
        click.option("--recover-int8", is_flag=True, cls=GroupedOption, group=RECOVERY_GROUP,
                     help="Quantisation-aware recovery: train with weights and layer inputs fake-quantised in the "
                          "target's INT8 format (run: --quant-target; compress: --target-provider), learning the "
                          "activation ranges; run's INT8 export then uses the trained ranges, beside a post-training "
                          "INT8 (.ptq.int8) of the same weights."),
    ]):
        fn = opt(fn)
    return fn


def _recovery_config(opts: dict[str, Any], int8_target: str) -> Any:
    """Pop the ``recover_*`` options from ``opts`` (the command's keyword arguments) and return the
    :class:`~minreal.compress.core.recover.RecoveryConfig` they ask for, or None when recovery is off;
    ``--recover-int8`` fake-quantises in ``int8_target``'s INT8 format."""
    from minreal.compress.core.recover_options import RecoveryConfig

    given = {k[len("recover_"):]: opts.pop(k) for k in [k for k in opts if k.startswith("recover_")]}
    int8 = given.pop("int8", False)
    if not given.get("epochs") and not given.get("steps"):
        if int8:
            raise click.UsageError("--recover-int8 needs a recovery budget: give --recover-epochs or --recover-steps")
        return None
    given["features"] = tuple(given.get("features") or ())
    if int8:
        from minreal.export.quantize import (
            resolve_target,  # onnx and onnxruntime: only for a quantisation-aware recovery
        )

        given["int8"] = resolve_target(int8_target)
    return RecoveryConfig(**given)


@cli.command("compress", cls=MethodCommand)
@click.argument("model")
@click.option("--method", "-m", type=_method_choice(), required=True, help="Registered compression method.")
@click.option("--calib", "data", required=True, help="Calibration (and, for methods that train, training) data.")
@click.option("--weights", help="Local weights file (state dict) for a torchvision name or factory.")
@click.option("--trust-pickle", is_flag=True, help="Allow loading a pickled full nn.Module (unsafe).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default="compressed.pt2", show_default=True,
              help="Compressed model as a torch.export program (.pt2).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the report as JSON.")
@click.option("--target-provider", type=click.Choice(list(PROVIDERS)), default=BenchConfig.providers[0],
              show_default=True, help="Provider the model is for; sets the defaults of --rank-multiple (cpu 16, "
                   "GPU 8), --width-multiple (cpu 16, GPU 8) and --width-min (cpu 16, GPU 0).")
@click.option("--calib-holdout", "holdout", type=click.FloatRange(0.0, 1.0, max_open=True), default=HOLDOUT_FRACTION,
              show_default=True, metavar="FRACTION",
              help="Share of --calib held out (seeded) to measure the compressed model on (report: "
                   "measured.held_out); 0 calibrates on all of --calib and makes no held-out measurement.")
@click.option("--dynamic-axes", "dynamic_axes", multiple=True,
              help="Dynamic axes of one input kept by the .pt2 program, in order ('_' = fixed), repeatable: "
                   "input_ids:batch,seq.")
@click.option("--distributed", is_flag=True,
              help="Share the statistics passes and the recovery across the ranks of a torchrun launch (gloo on "
                   "CPU, NCCL on GPU; automatic under torchrun); rank 0 writes the outputs.")
@_image_options
@_recovery_options
@method_options
@common
def compress_cmd(model: str, method: str, data: str, weights: str | None, trust_pickle: bool, out: str,
                 report_path: str | None, target_provider: str, holdout: float, dynamic_axes: tuple[str, ...],
                 distributed: bool, quiet: bool, as_json: bool,
                 **opts: Any) -> None:
    """Compress MODEL with one method and save it as a torch.export program.

    Under ``torchrun`` (or with ``--distributed``) every rank runs this command: the statistics passes and the
    recovery share the calibration data by rank, and rank 0 alone writes the program and the report.
    """

    from minreal.compress.core.distributed import is_writer, launched_by_torchrun, process_group

    if distributed and not launched_by_torchrun():
        raise click.UsageError("--distributed needs the torch.distributed environment (RANK, WORLD_SIZE, "
                               "MASTER_ADDR, MASTER_PORT): start with torchrun --nproc-per-node N -m "
                               "minreal.app.cli compress ...")
    # the model stays on the CPU (statistics and recovery run there), so the collectives do too: gloo
    group = process_group(backend="gloo") if launched_by_torchrun() else contextlib.nullcontext()
    with group:
        writer = is_writer()
        _compress(model, method, data, weights, trust_pickle, out, report_path, target_provider, holdout,
                  dynamic_axes, Console(quiet or not writer, as_json and writer), writer, opts)


def _compress(model: str, method: str, data: str, weights: str | None, trust_pickle: bool, out: str,
              report_path: str | None, target_provider: str, holdout: float, dynamic_axes: tuple[str, ...],
              con: Console, writer: bool, opts: dict[str, Any]) -> None:
    from minreal.app.method_options import build_config, provider_defaults
    from minreal.app.mismatch import check_data
    from minreal.compress import compress
    from minreal.export.json_safe import write_json
    from minreal.export.serialize import save_program

    if writer:  # folders the outputs need are made (and removed again on failure) by the writing rank alone
        _prepare_outputs([out, report_path], model, weights, data)
    preprocess = _image_preprocess(opts)
    recovery = _recovery_config(opts, target_provider)
    if recovery is not None and recovery.int8:
        raise click.UsageError("compress --recover-int8 would train INT8 ranges that no later command can use; "
                               "use `minreal run ... --recover-int8`, whose INT8 export writes them")
    config = build_config(method, opts, provider_defaults((target_provider,)))
    net, calib, held = _load_inputs(model, weights, trust_pickle, data, None, holdout, preprocess)
    check = check_data(net, {"evaluation": held, "calibration": calib})  # compress warns; run and tune stop
    if writer:
        _warn_data_check(check)
    held = held if held is not None and len(held) else None
    con.progress(_calib_line(len(calib), held, holdout))
    con.progress(f"compressing {model} with {method}")
    small, report = compress(net, calib, method, config, recovery, held, measure=held is None)
    _record_held_out(report, net, small, calib, held, holdout)
    report.measured["data_check"] = asdict(check)
    if not writer:  # another rank of a torchrun launch: rank 0 writes
        return
    save_program(small, calib.x[:2], Path(out), dynamic_axes=_shape_options((), dynamic_axes)[1])
    if report_path:
        write_json(report, Path(report_path))
    con.table(f"params {report.params_before} -> {report.params_after} ({report.param_ratio:.3f}), "
              f"MACs {report.macs_before} -> {report.macs_after} ({report.mac_ratio:.3f}); saved {out}")
    if "held_out_recovered" in report.measured:
        zero, rec = report.measured["held_out_zero_shot"], report.measured["held_out_recovered"]
        con.table("held out: " + "; ".join(f"{k} zero-shot {zero[k]:.4g} -> recovered {rec[k]:.4g}"
                                           for k in rec if k in zero))
    con.result(report)


@cli.command("export")
@click.argument("model")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Destination .onnx file.")
@click.option("--data", help="Data for the example input, parity check and INT8 calibration.")
@click.option("--input-shape", "input_shape", multiple=True,
              help="Per-sample input shape, e.g. 3,224,224 (random example; no --data); for several inputs, each "
                   "named with batch and dtype, repeatable: input_ids:1x128:int64.")
@click.option("--dynamic-axes", "dynamic_axes", multiple=True,
              help="Dynamic axes of one input, in order ('_' = fixed), repeatable: input_ids:batch,seq. The batch "
                   "is always dynamic.")
@click.option("--weights", help="Local weights file (state dict) for a torchvision name or factory.")
@click.option("--trust-pickle", is_flag=True, help="Allow loading a pickled full nn.Module (unsafe).")
@click.option("--opset", type=int, default=VariantConfig.opset, show_default=True, help="ONNX opset (>= 17).")
@click.option("--rtol", type=float, default=VariantConfig.rtol, show_default=True, help="Parity relative tolerance.")
@click.option("--atol", type=float, default=VariantConfig.atol, show_default=True, help="Parity absolute tolerance.")
@click.option("--int8", is_flag=True, help="Also write OUT with suffix .int8.onnx (static QDQ by default).")
@click.option("--quant-target", type=click.Choice(QUANT_TARGETS), default=VariantConfig.quant_target,
              show_default=True, help=QUANT_TARGET_HELP)
@click.option("--quant-mode", type=click.Choice(QUANT_MODES), default=VariantConfig.quant_mode, show_default=True)
@click.option("--allow-random-calibration", is_flag=True, help="Calibrate INT8 on random data (not advised).")
@click.option("--int8-keep-roundtrips", is_flag=True,
              help="Keep ONNX Runtime's Q/DQ placement around ops the CPU runs in float (by default such nodes are "
                   "left in float when that removes Q/DQ pairs; one more quantisation pass).")
@click.option("--fp16", is_flag=True, help="Also write OUT with suffix .fp16.onnx (fp32 inputs/outputs), checked "
                                           "against OUT at float16 tolerances.")
@click.option("--fp16-io", is_flag=True, help="With --fp16: float16 inputs and outputs instead.")
@_fixed_shapes_option
@_image_options
@common
def export_cmd(model: str, out: str, data: str | None, input_shape: tuple[str, ...], dynamic_axes: tuple[str, ...],
               weights: str | None, trust_pickle: bool, opset: int,
               rtol: float, atol: float, int8: bool, quant_target: str, quant_mode: str,
               allow_random_calibration: bool, int8_keep_roundtrips: bool, fp16: bool, fp16_io: bool,
               fixed_shapes: str | None, quiet: bool, as_json: bool, **image: Any) -> None:
    """Export MODEL to ONNX (dynamic batch), simplify, verify parity, optionally quantise to INT8 and write FP16."""
    from minreal.app.single import ExportOptions, export_single
    from minreal.export.fp16 import Fp16Config, fp16_path
    from minreal.export.mobile import mobile_verdict

    if fp16_io and not fp16:
        raise click.UsageError("--fp16-io applies to the FP16 copy: add --fp16")
    if fp16 and fixed_shapes:
        raise click.UsageError("--fp16 checks parity at two batch sizes, which a --fixed-shapes file cannot take; "
                               "drop one of them")
    con = Console(quiet, as_json)
    opts = ExportOptions(VariantConfig(opset=opset, rtol=rtol, atol=atol, quant_target=quant_target,
                                       quant_mode=quant_mode, allow_random_calibration=allow_random_calibration,
                                       fixed_shapes=_fixed_shapes(fixed_shapes),
                                       drop_roundtrips=not int8_keep_roundtrips),
                         int8=int8, fp16=Fp16Config(keep_io_types=not fp16_io) if fp16 else None,
                         preprocess=_image_preprocess(image))
    shape, axes = _shape_options(input_shape, dynamic_axes)
    _prepare_outputs([out, Path(out).with_name(Path(out).stem + ".int8.onnx") if int8 else None,
                      fp16_path(out) if fp16 else None], model, weights, data)
    result = export_single(model, Path(out), data, weights, trust_pickle, opts, con.progress, shape, axes)
    con.table(f"wrote {out} ({result.onnx_bytes} bytes, exporter {result.export['exporter']}); parity ok")
    if result.fp16:
        con.table(f"wrote {fp16_path(out)} ({result.fp16['size_fp16_bytes']} bytes); FP16 parity "
                  f"{result.fp16['parity']['status']}")
    con.table(mobile_verdict(result.mobile))
    con.result(result)


def _shape_options(input_shape: tuple[str, ...],
                   dynamic_axes: tuple[str, ...]) -> tuple[Any, dict[str, dict[int, str]]]:
    """Parsed ``--input-shape`` (``None`` when not given) and ``--dynamic-axes``; bad values are usage errors."""
    from minreal.app.shapes import parse_dynamic_axes, parse_input_shapes

    try:
        return (parse_input_shapes(input_shape) if input_shape else None), parse_dynamic_axes(dynamic_axes)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _skip_unavailable_option(fn: Callable) -> Callable:
    return click.option("--skip-unavailable-providers", is_flag=True,
                        help="Benchmark the providers that can run and record the others as unavailable "
                             "(default: a requested provider that cannot run is an error).")(fn)


def _require_providers(names: tuple[str, ...], skip_unavailable: bool) -> None:
    """Exit 1 (before any work) naming each requested provider this onnxruntime cannot run, unless skipped."""
    from minreal.runtime_bench import ProviderUnavailableError
    from minreal.runtime_bench.providers import require_available, unavailable_reason

    if skip_unavailable:
        for name in names:
            unavailable_reason(name)  # an unknown name is still a usage error
        return
    try:
        require_available(names)
    except ProviderUnavailableError as exc:
        raise ProviderUnavailableError(f"{exc}; or pass --skip-unavailable-providers to run without it") from None


def _provider_options(fn: Callable) -> Callable:
    """--provider-option / --provider-config / --io-binding (minreal.runtime_bench.provider_options)."""
    for opt in reversed([
        click.option("--provider-option", "provider_option", multiple=True,
                     help="A provider setting, repeatable: tensorrt.fp16=true, tensorrt.int8=true, "
                          "tensorrt.engine_cache=DIR, tensorrt.timing_cache=DIR, tensorrt.opt_level=0-5, "
                          "tensorrt.workspace=4G, cuda.device_id=0 (wins over --provider-config)."),
        click.option("--provider-config", type=click.Path(dir_okay=False),
                     help="TOML file, one table per provider ([tensorrt], [tensorrt.profiles] input = "
                          "[min, opt, max] shapes, [cuda]); see the README."),
        click.option("--io-binding", is_flag=True,
                     help="On GPU providers, also time with inputs and outputs bound on the device "
                          "(device-only latency beside the with-copy latency)."),
    ]):
        fn = opt(fn)
    return fn


def _provider_settings(options: tuple[str, ...], config: str | None, providers: tuple[str, ...]) -> dict[str, Any]:
    """The merged provider settings; settings of a provider not in ``--providers`` are a usage error (before
    any work), since nothing would use them."""
    from minreal.runtime_bench.provider_options import load_provider_config, merge_settings

    from_file = load_provider_config(config) if config else {}
    skipped = sorted(set(from_file) - set(providers))
    if skipped:  # one shared file may hold every provider's table
        logging.getLogger(__name__).info("--provider-config %s: tables %s unused (not in --providers)", config,
                                         ", ".join(skipped))
    settings = merge_settings({k: v for k, v in from_file.items() if k in providers}, options)
    unused = sorted(set(settings) - set(providers))
    if unused:
        raise click.UsageError(f"--provider-option sets {', '.join(unused)}, which --providers "
                               f"({', '.join(providers)}) does not request")
    return settings


@cli.command("bench")
@click.argument("models", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--providers", default=",".join(PipelineConfig.providers), show_default=True,
              help=f"Comma-separated: {', '.join(PROVIDERS)}.")
@click.option("--batch", "batch", default=",".join(map(str, PipelineConfig.batch_sizes)), show_default=True,
              help="Comma-separated batch sizes.")
@click.option("--data", help="Evaluation data (labels give accuracy); random inputs without it.")
@click.option("--warmup", type=int, default=BenchConfig.warmup, show_default=True,
              help="Discarded warm-up runs per model.")
@click.option("--min-runs", type=int, default=BenchConfig.min_runs, show_default=True, help="Minimum measured runs.")
@click.option("--min-seconds", type=float, default=BenchConfig.min_seconds, show_default=True,
              help="Minimum measuring time.")
@click.option("--repeats", type=int, default=BenchConfig.repeats, show_default=True,
              help="Fresh processes per provider/batch.")
@click.option("--threads", type=int, help="Intra-op threads (default: physical cores).")
@click.option("--out", type=click.Path(dir_okay=False), default="bench.json", show_default=True,
              help="Report JSON; a Markdown copy is written next to it.")
@click.option("--axis-values", "axis_values", multiple=True,
              help="Lengths a dynamic (symbolic) axis is timed at, by its ONNX dimension name, repeatable: "
                   "seq=32,128; each length is its own latency row. With --data, inputs are cut to each length.")
@_provider_options
@_skip_unavailable_option
@_image_options
@common
def bench_cmd(models: tuple[str, ...], providers: str, batch: str, data: str | None, warmup: int,
              min_runs: int, min_seconds: float, repeats: int, threads: int | None, out: str,
              axis_values: tuple[str, ...], provider_option: tuple[str, ...], provider_config: str | None,
              io_binding: bool, skip_unavailable_providers: bool, quiet: bool, as_json: bool, **opts: Any) -> None:
    """Benchmark ONNX MODELS side by side (ratios vs the first) with ONNX Runtime."""
    import minreal.runtime_bench as rb

    con = Console(quiet, as_json)
    preprocess = _image_preprocess(opts)
    from minreal.app.data import require_image_folder

    require_image_folder(preprocess, data)
    settings = _provider_settings(provider_option, provider_config, _split_names(providers))
    if io_binding and not set(_split_names(providers)) - {"cpu"}:
        click.echo("WARNING: --io-binding applies to GPU providers (cuda, tensorrt); --providers has none", err=True)
    _require_providers(_split_names(providers), skip_unavailable_providers)  # fail fast, before any loading
    _prepare_outputs([out, Path(out).with_suffix(".md")], *models, data)
    x = y = None
    if data:
        from minreal.app.data import load_dataset
        from minreal.export.verify import feeds_of

        # the user's evaluation data, all of it (named inputs keyed by graph input)
        held = load_dataset(data, preprocess=preprocess)
        x = feeds_of(held.x)
        y = None if held.y is None else held.y.numpy()
    cfg = rb.BenchConfig(providers=_split_names(providers), batch_sizes=_split_ints(batch, "--batch"),
                         warmup=warmup, min_runs=min_runs, min_seconds=min_seconds, repeats=repeats,
                         intra_op_threads=threads, axis_values=_axis_values_option(axis_values),
                         provider_settings=settings, io_binding=io_binding)
    entries = [rb.ModelEntry(Path(m).stem, Path(m)) for m in models]
    report = rb.run_benchmark(entries, cfg, x, y, progress=con.progress,
                              fail_on_unavailable=not skip_unavailable_providers)
    rb.write_json(report, Path(out))
    rb.write_markdown(report, Path(out).with_suffix(".md"))
    con.table(rb.format_table(report))
    con.result(report)


@cli.command("check")
@click.argument("report", type=click.Path(dir_okay=False))
@click.option("--max-latency-ratio", type=float, help="Highest allowed latency ratio vs the first model.")
@click.option("--max-accuracy-drop", type=float, help="Highest allowed accuracy drop, percentage points.")
@click.option("--min-agreement", type=float, help="Lowest allowed top-1 agreement with the first model (0-1).")
@click.option("--baseline", type=click.Path(dir_okay=False), help="Earlier report to compare latencies with.")
@click.option("--max-regression", type=float,
              help="Highest allowed latency regression vs --baseline, percent; a cell fails only when it is also "
                   "beyond the measured noise (the two runs' per-process p50 ranges do not overlap).")
@click.option("--allow-new-models", is_flag=True,
              help="Let (model, provider, batch) cells absent from --baseline pass (they fail otherwise).")
@click.option("--min-on-provider", type=float,
              help="Lowest allowed share (0-1) of each model's nodes that ran on its requested provider (read from "
                   "ONNX Runtime's profile); a failure names the nodes that fell back.")
@click.option("--allow-hardware-mismatch", is_flag=True,
              help="Let --baseline come from another CPU or GPU model (a warning; it fails otherwise).")
@click.option("--max-int8-drop", type=float,
              help="Highest allowed accuracy drop of each INT8 file against its own fp32 source (NAME.int8 vs NAME), "
                   "percentage points: the loss quantisation alone causes.")
@common
def check_cmd(report: str, max_latency_ratio: float | None, max_accuracy_drop: float | None,
              min_agreement: float | None, baseline: str | None, max_regression: float | None,
              allow_new_models: bool, min_on_provider: float | None, allow_hardware_mismatch: bool,
              max_int8_drop: float | None, quiet: bool, as_json: bool) -> None:
    """Release gate: exit 0 when every criterion holds for REPORT, 1 otherwise.

    REPORT is a `minreal bench` JSON, a run directory's report.json (every case is checked) or a tune directory's
    report.json (the chosen model, as `chosen`, against the original; a tune that chose nothing fails).
    """
    from minreal.app.gate import check_reports

    con = Console(quiet, as_json)
    if all(v is None for v in (max_latency_ratio, max_accuracy_drop, min_agreement, max_regression, min_on_provider,
                                max_int8_drop)):
        raise click.UsageError("give at least one criterion (--max-latency-ratio, --max-accuracy-drop, "
                               "--min-agreement, --max-regression, --min-on-provider, --max-int8-drop); a gate "
                               "with none would always pass")
    results = check_reports(Path(report), Path(baseline) if baseline else None, max_latency_ratio,
                            max_accuracy_drop, min_agreement, max_regression, allow_new_models, min_on_provider,
                            allow_hardware_mismatch, max_int8_drop)
    passed = all(r.passed for _, r in results)
    import minreal.runtime_bench as rb

    for name, res in results:
        con.table(f"[{name}]\n{rb.format_check(res)}")
    con.result({"passed": passed, "reports": {n: r for n, r in results}})
    if not passed:
        from minreal.runtime_bench.check import describe_criterion

        failed = [f"{n}: {describe_criterion(c)}" for n, r in results for c in r.criteria if not c.passed]
        click.echo("FAILED " + "; ".join(failed), err=True)
        sys.exit(FAIL_EXIT)


def _pipeline_options(fn: Callable) -> Callable:
    for opt in reversed([
        click.option("--out", default="runs/latest", show_default=True, type=click.Path(file_okay=False),
                     help="Run directory (must not exist unless --overwrite)."),
        click.option("--overwrite", is_flag=True, help="Replace an existing run directory."),
        click.option("--batch", default=",".join(map(str, PipelineConfig.batch_sizes)), show_default=True,
                     help="Comma-separated batch sizes."),
        click.option("--providers", default=",".join(PipelineConfig.providers), show_default=True,
                     help=f"Comma-separated: {', '.join(PROVIDERS)}."),
        click.option("--no-int8", is_flag=True, help="Skip INT8 quantisation."),
        click.option("--fp16", is_flag=True, help="FP16 copies (LABEL.fp16) of the original and every variant even "
                                                  "without a cuda/tensorrt provider (made anyway with one)."),
        click.option("--quant-target", type=click.Choice(QUANT_TARGETS), default=None,
                     help=QUANT_TARGET_HELP + " Default: tensorrt when --providers includes tensorrt, else cpu."),
        click.option("--quant-mode", type=click.Choice(QUANT_MODES), default=PipelineConfig.quant_mode,
                     show_default=True,
                     help="static: calibrated QDQ; dynamic: weights only, activations quantised at run time."),
        click.option("--min-seconds", type=float,
                     help=f"Minimum measuring time per model (default {PipelineConfig.min_seconds:g} s)."),
        click.option("--repeats", type=int,
                     help=f"Fresh processes per provider/batch (default {PipelineConfig.repeats})."),
    ]):
        fn = opt(fn)
    return fn


def _pipeline_config(base: Any, batch: str, providers: str, no_int8: bool, quant_target: str, quant_mode: str,
                     min_seconds: float | None, repeats: int | None, fp16: bool = False) -> Any:
    from dataclasses import replace

    cfg = replace(base, batch_sizes=_split_ints(batch, "--batch"), providers=_split_names(providers),
                  int8=not no_int8, quant_target=quant_target, quant_mode=quant_mode, fp16=fp16)
    if min_seconds is not None:
        cfg = replace(cfg, min_seconds=min_seconds)
    return replace(cfg, repeats=repeats) if repeats is not None else cfg


def _finish_run(con: Console, report: Any, out: str) -> None:
    from minreal.app.report import format_compact, format_int8, format_recovery

    con.table(format_compact(report))
    for table in (format_recovery(report), format_int8(report)):
        if table:
            con.table("\n" + table)
    for case in report.cases:
        for w in case.warnings:
            click.echo(f"WARNING [{case.name}] {w}", err=True)
    con.table(f"\nrun directory: {out} (full table in report.md; report.json, plot.png, ONNX files per case)")
    con.result(report)


@cli.command("run", cls=MethodCommand)
@click.argument("model")
@click.option("--method", "-m", "method", type=_method_choice(), multiple=True,
              help="Method(s) to compare, each with the method options given here; repeat for several.")
@click.option("--plan", "plan", type=click.Path(dir_okay=False),
              help="TOML plan file: [[variant]] tables, each a method or a chain (method = [\"fde\", \"factorize\"]) "
                   "with its own options; combines with -m.")
@click.option("--data", required=True, help="Calibration/training data.")
@click.option("--eval-data", help="Held-out evaluation data (default: a split of --data).")
@click.option("--weights", help="Local weights file (state dict) for a torchvision name or factory.")
@click.option("--trust-pickle", is_flag=True, help="Allow loading a pickled full nn.Module (unsafe).")
@click.option("--dynamic-axes", "dynamic_axes", multiple=True,
              help="Dynamic axes of one input, in order ('_' = fixed), repeatable: input_ids:batch,seq (an unnamed "
                   "input is called 'input'). Axes whose length differs between --data and --eval-data are dynamic "
                   "anyway.")
@click.option("--axis-values", "axis_values", multiple=True,
              help="Lengths a dynamic axis is timed at, repeatable: seq=32,128 (default: the held-out data's "
                   "length and half of it).")
@_mismatch_option
@_pipeline_options
@_provider_options
@_fixed_shapes_option
@_skip_unavailable_option
@_image_options
@_recovery_options
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
    quant_target = quant_target or ("tensorrt" if "tensorrt" in _split_names(providers)
                                    else PipelineConfig.quant_target)
    preprocess, allow_mismatch = _image_preprocess(opts), opts.pop("allow_data_mismatch")
    fixed_shapes = _fixed_shapes(opts.pop("fixed_shapes"))
    recovery = _recovery_config(opts, quant_target)
    if recovery is not None and recovery.int8 and (no_int8 or quant_mode != "static"):
        raise click.UsageError("--recover-int8 trains ranges for static INT8: drop --no-int8 / --quant-mode dynamic")
    if not method and not plan:
        raise click.UsageError("give --method/-m (repeat for several) or --plan FILE")
    if plan and not method and any(v not in (None, ()) for v in opts.values()):
        raise click.UsageError("method options on the command line apply to -m variants; put the options of "
                               "--plan variants in the plan file")
    cfg = _pipeline_config(PipelineConfig(skip_unavailable_providers=skip_unavailable_providers, recovery=recovery,
                                          allow_data_mismatch=allow_mismatch),
                           batch, providers, no_int8, quant_target, quant_mode, min_seconds, repeats, fp16)
    from minreal.app.method_options import build_configs, provider_defaults
    from minreal.app.pipeline import claim_run_dir, fill_run_dir
    from minreal.app.plan import load_plan
    from minreal.compress.core.demo_case import DemoCase, DemoRun  # torch: after the option checks above

    _refuse_torchrun("run")
    cfg = _with_fixed_shapes(cfg, fixed_shapes)
    cfg = dataclasses.replace(cfg, provider_settings=_provider_settings(provider_option, provider_config,
                                                                        cfg.providers), io_binding=io_binding)
    _require_providers(cfg.providers, skip_unavailable_providers)  # fail fast, before any loading
    _, axes = _shape_options((), dynamic_axes)
    cfg = dataclasses.replace(cfg, axis_values=_axis_values_option(axis_values))
    defaults = provider_defaults(cfg.providers)
    configs = build_configs(method, opts, defaults)  # each option reaches the methods that declare it
    runs = [DemoRun(m, m, config) for m, config in zip(method, configs)]
    runs += load_plan(plan, defaults) if plan else []
    # --out is locked from its existence check to the commit: a concurrent run to it exits 1
    with claim_run_dir(Path(out), overwrite, _input_files(model, weights, data, eval_data, plan)) as claim:
        net, calib, held = _load_inputs(model, weights, trust_pickle, data, eval_data, preprocess=preprocess)
        case_axes = _case_axes(axes, calib.x, None if held is None else held.x)
        from minreal.app.shapes import check_shape_names

        check_shape_names(calib.x, case_axes, cfg.fixed_shapes)  # a typo is a usage error, before any work
        case = DemoCase(Path(model.split(":")[-1]).stem or "model", net, calib, held, runs, dynamic_axes=case_axes)
        report = fill_run_dir([case], claim, cfg, con.progress)
    _finish_run(con, report, out)


def _refuse_torchrun(command: str) -> None:
    """``run``/``tune`` export and time in one process: under torchrun every rank would do it all again."""
    from minreal.compress.core.distributed import launched_by_torchrun

    if launched_by_torchrun():
        raise click.UsageError(f"{command} does not run under torchrun (every rank would export and time): "
                               "compress under torchrun with `minreal compress`, then pass its .pt2 to "
                               f"`minreal {command}` in one process; tune scales out with --executor ray")


def _axis_values_option(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    from minreal.app.shapes import parse_axis_values

    try:
        return parse_axis_values(values)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _case_axes(given: dict[str, dict[int, str]], calib: Any, held: Any) -> dict[str, dict[int, str]]:
    """``--dynamic-axes`` plus the axes along which calibration and held-out inputs differ in length."""
    from minreal.app.shapes import infer_dynamic_axes, merge_axes

    inferred = {} if held is None else infer_dynamic_axes(calib, held)
    if inferred:
        logging.getLogger(__name__).info("dynamic axes inferred from differing data lengths: %s", inferred)
    return merge_axes(inferred, given)


def _demo_keys_help() -> str:
    """``--only`` help: the digits models and the registered methods that ship a demo case."""
    from minreal.compress import get_method, method_names

    own = [n for n in method_names() if get_method(n).demo_case is not None]
    return (f"Comma-separated demo cases: digits-mlp, digits-cnn, or a method name ({', '.join(own)}) for that "
            "method's own case.")


@cli.command("demo")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(file_okay=False))
@click.option("--overwrite", is_flag=True, help="Replace an existing run directory.")
@click.option("--only", help=_demo_keys_help())
@click.option("--full", is_flag=True, help="Longer training and the full 2 s timing protocol.")
@common
def demo_cmd(out: str, overwrite: bool, only: str | None, full: bool, quiet: bool, as_json: bool) -> None:
    """Embedded demo on scikit-learn's digits: train, compress, export, quantise, benchmark."""
    from dataclasses import replace

    from minreal.app.demo import DEMO_PIPELINE, demo_cases
    from minreal.app.pipeline import PipelineConfig, claim_run_dir, fill_run_dir

    con = Console(quiet, as_json)
    with claim_run_dir(Path(out), overwrite) as claim:  # locked until the run directory is committed
        con.progress("training demo models (seeded)")
        try:
            cases = demo_cases(quick=not full, only=_split_names(only or ""))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--only") from None
        cfg = PipelineConfig() if full else DEMO_PIPELINE
        report = fill_run_dir(cases, claim, replace(cfg), con.progress)
    _finish_run(con, report, out)


@cli.command("latency-table")
@click.argument("model")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Destination JSON table.")
@click.option("--kind", type=click.Choice(["rank", "width"]), default="rank", show_default=True,
              help="rank: per-layer factorised pairs (factorize --latency); width: the whole model with each channel "
                   "group segment narrowed (--latency-ratio of the width methods).")
@click.option("--data", help="Data for the example input.")
@click.option("--input-shape", help="Per-sample input shape, e.g. 3,224,224 (random example; no --data).")
@click.option("--batch", type=int, default=1, show_default=True, help="Batch size the latencies are measured at.")
@click.option("--provider", default=BenchConfig.providers[0], show_default=True,
              help=f"Provider to measure on: {', '.join(PROVIDERS)}.")
@click.option("--ranks-per-layer", type=int, default=6, show_default=True,
              help="Ranks measured per layer (--kind rank).")
@click.option("--width-multiple", type=click.IntRange(min=1), default=None,
              help="Widths measured in steps of this many channels (--kind width); default the provider's fast "
                   "multiple, as the width methods use it (cpu 16, GPU 8).")
@click.option("--width-min", type=click.IntRange(min=0), default=None,
              help="No width measured below this many channels (--kind width); default the provider's, as the width "
                   "methods use it (cpu 16, GPU 0). A table serves allocations whose --width-min is at least its own.")
@click.option("--int8", is_flag=True,
              help="Time each variant's INT8 file (static QDQ in this CPU's format, calibrated on the example batch) "
                   "for a model that will run in INT8 (--kind width, cpu provider): int8 kernels favour other widths.")
@click.option("--weights", help="Local weights file (state dict) for a torchvision name or factory.")
@common
def latency_table_cmd(model: str, out: str, kind: str, data: str | None, input_shape: str | None, batch: int,
                      provider: str, ranks_per_layer: int, width_multiple: int | None, width_min: int | None,
                      int8: bool, weights: str | None, quiet: bool, as_json: bool) -> None:
    """Measure latencies on a provider: per factorisable layer for `compress -m factorize --latency` (--kind rank),
    or per channel-group width for the width methods' --latency-ratio (--kind width)."""
    if int8 and (kind != "width" or provider != "cpu"):
        raise click.UsageError("--int8 measures a width table on the cpu provider: pass --kind width --provider cpu")
    import torch

    from minreal.app.callables import SpecError
    from minreal.app.data import load_dataset
    from minreal.app.models import check_input_shape, load_model
    from minreal.export.latency_table import build_latency_table, build_width_latency_table

    con = Console(quiet, as_json)
    _prepare_outputs([out], model, weights, data)
    net = load_model(model, weights=weights)
    if data:
        x = load_dataset(data).x[:batch]
    elif input_shape:
        x = torch.randn(batch, *_split_ints(input_shape, "--input-shape"))
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
    else:
        con.progress(f"timing the factorisable layers of {model} on {provider}")
        table = build_latency_table(net, x, provider, ranks_per_layer, out_path=Path(out))
        con.table(f"wrote {out} ({len(table['layers'])} layers on {provider})")
    con.result(table)


@cli.command("tune")
@click.argument("model")
@click.option("--data", required=True, help="Calibration/training data (methods and recovery see only this).")
@click.option("--eval-data", help="Held-out data every candidate is judged on (default: a split of --data).")
@click.option("--weights", help="Local weights file (state dict) for a torchvision name or factory.")
@click.option("--trust-pickle", is_flag=True, help="Allow loading a pickled full nn.Module (unsafe).")
@click.option("--out", default="runs/tune", show_default=True, type=click.Path(file_okay=False),
              help="Tune directory (must not exist unless --overwrite).")
@click.option("--overwrite", is_flag=True, help="Replace an existing run or tune directory.")
@click.option("--providers", default="cpu", show_default=True, help=f"Comma-separated: {', '.join(PROVIDERS)}.")
@click.option("--batch", default="1", show_default=True,
              help="Comma-separated batch sizes; the first (provider, batch) decides the choice.")
@click.option("--max-accuracy-drop", type=float, metavar="PP",
              help="Largest allowed accuracy drop vs the original, in percentage points (0.5 = half a point), as in "
                   "`minreal check`.")
@click.option("--min-agreement", type=float, metavar="FRACTION",
              help="Lowest allowed top-1 agreement with the original (0-1), as in `minreal check`.")
@click.option("--max-mse-increase", type=float, metavar="VALUE", help="Largest allowed MSE increase (regressors).")
@click.option("--objective", type=click.Choice(["latency", "size"]), default="latency", show_default=True,
              help="What the chosen model minimises among those that meet the constraint.")
@click.option("--time-budget", metavar="DURATION",
              help="Start no candidate after this (e.g. 90s, 20m); checked before every one.")
@click.option("--stats-samples", type=click.IntRange(min=0), default=1024, show_default=True, metavar="N",
              help="Calibration samples the methods' statistics see (a seeded subsample; 0: all). Recovery and the "
                   "judgement use all the data.")
@click.option("--dry-run", is_flag=True,
              help="Print the search plan and its estimated time (from a short probe of the model) and stop.")
@click.option("--methods", help="Comma-separated methods to search (default: every method with a MAC budget, or none "
                                "when --plan is given).")
@click.option("--plan", type=click.Path(dir_okay=False),
              help="TOML plan file whose variants (e.g. chains: width then factorise) are candidates as they are.")
@click.option("--grid", help="Comma-separated MAC ratios to search (default 0.9,0.8,...,0.2).")
@click.option("--recover-epochs", type=click.IntRange(min=0), default=0, show_default=True,
              help="Recovery cap: every method is bisected without recovery, then the budgets just below each "
                   "boundary race with up to this many epochs (successive halving: 1/9, 1/3, all of it).")
@click.option("--no-int8", is_flag=True, help="fp32 candidates only (the original's INT8 is then no baseline).")
@click.option("--no-qat", is_flag=True, help="No quantisation-aware recovery candidates.")
@click.option("--quant-target", type=click.Choice(QUANT_TARGETS), default=QUANT_TARGETS[0], show_default=True,
              help=QUANT_TARGET_HELP)
@click.option("--screen-seconds", type=click.FloatRange(min=0), default=None,
              help="Timing window per model of the screening pass (short protocol, one process).")
@click.option("--min-seconds", type=click.FloatRange(min=0), default=None,
              help="Timing window per model of the confirmation (release protocol).")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Fresh processes per (provider, batch) in the confirmation.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Candidate cache (default: $XDG_CACHE_HOME/minreal/tune or ~/.cache/minreal/tune). With "
                   "--executor ray it must be shared storage every node mounts at the same path.")
@click.option("--workers", type=click.IntRange(min=0), default=1, show_default=True,
              help="Local worker processes evaluating candidates (--executor local); 0 evaluates them in this "
                   "process.")
@click.option("--executor", "executor_kind", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where candidates run: local processes, or Ray tasks on a cluster (pip install 'minreal[ray]'; "
                   "minreal on every node; --cache-dir and relative input paths on shared storage).")
@click.option("--address", help="Ray cluster to join with --executor ray: auto (default) or the head's HOST:PORT.")
@click.option("--bench-resource", metavar="NAME",
              help="Ray custom resource of the target-hardware nodes: benchmarks run only on such a node, started "
                   "with `ray start --resources '{\"NAME\": 1}'` (default minreal_bench; --executor ray).")
@click.option("--dynamic-axes", "dynamic_axes", multiple=True,
              help="Dynamic axes of one input, in order ('_' = fixed), repeatable: input_ids:batch,seq.")
@_image_options
@_mismatch_option
@common
def tune_cmd(model: str, data: str, eval_data: str | None, weights: str | None, trust_pickle: bool, out: str,
             overwrite: bool, providers: str, batch: str, max_accuracy_drop: float | None, min_agreement: float | None,
             max_mse_increase: float | None, objective: str, time_budget: str | None, methods: str | None,
             plan: str | None, grid: str | None, recover_epochs: int, no_int8: bool, no_qat: bool, quant_target: str,
             screen_seconds: float | None, min_seconds: float | None, repeats: int | None, cache_dir: str | None,
             workers: int, executor_kind: str, address: str | None, bench_resource: str | None,
             dynamic_axes: tuple[str, ...], stats_samples: int, dry_run: bool, quiet: bool, as_json: bool,
             **opts: Any) -> None:
    """Find the fastest deployable model within a quality budget, measured on the target runtime, against the
    original in fp32 and INT8. Writes report.json/.md, front.png and chosen.onnx (chosen.pt2) into --out."""
    import dataclasses

    batch_sizes = _split_ints(batch, "--batch")  # option errors before the heavy imports below
    grid_values = tuple(_split_floats(grid, "--grid")) if grid else None

    from minreal.app.tune import CONFIRM, SCREEN, Constraint, TuneConfig, TuneError, parse_duration  # torch-free

    con = Console(quiet, as_json)
    preprocess, allow_mismatch = _image_preprocess(opts), opts.pop("allow_data_mismatch")
    screen = {"min_seconds": screen_seconds} if screen_seconds is not None else {}
    confirm = {k: v for k, v in (("min_seconds", min_seconds), ("repeats", repeats)) if v is not None}
    try:  # the options' errors are usage errors, told before any heavy import
        cfg = TuneConfig(Constraint(max_accuracy_drop, min_agreement, max_mse_increase),
                         providers=_split_names(providers), batch_sizes=batch_sizes,
                         objective=objective, methods=_split_names(methods or ""),
                         grid=TuneConfig.grid if grid_values is None else grid_values,
                         recover_epochs=recover_epochs, int8=not no_int8, qat=not no_qat, quant_target=quant_target,
                         time_budget_s=parse_duration(time_budget) if time_budget else None,
                         screen=dataclasses.replace(SCREEN, **screen), confirm=dataclasses.replace(CONFIRM, **confirm),
                         workers=workers, dynamic_axes=_shape_options((), dynamic_axes)[1] if dynamic_axes else {},
                         stats_samples=stats_samples)
    except TuneError as exc:
        raise click.UsageError(str(exc)) from None
    _refuse_torchrun("tune")
    from minreal.app.mismatch import check_data, require_match
    from minreal.app.pipeline import claim_run_dir, commit_run_dir
    from minreal.app.tune import SpecSource, tune
    from minreal.app.tune.output import format_tune, write_tune_dir

    if plan:
        from minreal.app.method_options import provider_defaults
        from minreal.app.plan import load_plan

        cfg = dataclasses.replace(cfg, plan=tuple(load_plan(plan, provider_defaults(cfg.providers))))
    _require_providers(cfg.providers, False)
    remote = executor_kind == "ray"
    cache = Path(cache_dir) if cache_dir else _default_cache()
    cache = cache.resolve() if remote else cache  # the same folder for workers whatever their working directory
    _check_executor_options(executor_kind, address, bench_resource)  # before any work: Ray may be absent
    if dry_run:
        _tune_dry_run(con, model, weights, trust_pickle, data, eval_data, preprocess, cfg)
        return
    with claim_run_dir(Path(out), overwrite, _input_files(model, weights, data, eval_data, plan)) as claim:
        net, calib, held = _load_inputs(model, weights, trust_pickle, data, eval_data, preprocess=preprocess)
        check = require_match(check_data(net, {"evaluation": held, "calibration": calib}), allow_mismatch)
        _warn_data_check(check)
        source = SpecSource(model, data, eval_data, weights, trust_pickle, preprocess) if workers or remote else None
        cfg = dataclasses.replace(cfg, dynamic_axes=_case_axes(cfg.dynamic_axes, calib.x, held.x if held else None))
        executor = _tune_executor(executor_kind, workers, address, bench_resource)
        report = tune(net, calib, held, cfg, claim.staging, cache, source, executor, con.progress)
        executor.close()
        report.reference["data_check"] = asdict(check)
        report.notes += [f"--allow-data-mismatch: {check.message()}"] if check.allowed else []
        write_tune_dir(report, claim.staging)
        commit_run_dir(claim)
    con.table(format_tune(report))
    files = "report.md, report.json, front.png" + (", chosen.onnx" if report.chosen else "")
    con.table(f"\ntune directory: {out} ({files}; candidate cache {cache})")
    con.result(json.loads((Path(out) / "report.json").read_text()))  # paths relative to the tune directory


def _tune_dry_run(con: Any, model: str, weights: str | None, trust_pickle: bool, data: str, eval_data: str | None,
                  preprocess: Any, cfg: Any) -> None:
    """`tune --dry-run`: the plan and its estimated time; nothing is written."""
    from minreal.app.tune import default_methods
    from minreal.app.tune.dryrun import estimate_plan, probe_model

    net, calib, held = _load_inputs(model, weights, trust_pickle, data, eval_data, preprocess=preprocess)
    methods = cfg.methods or (() if cfg.plan else default_methods())
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
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "minreal" / "tune"


def _split_floats(text: str, flag: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}", param_hint=flag) from None


def _usage_errors() -> tuple[type[BaseException], ...]:
    from minreal.app.callables import SpecError
    from minreal.app.method_options import MethodOptionError
    from minreal.app.pipeline import RunDirError
    from minreal.app.tune import TuneError
    from minreal.compress import CompressionError, UnknownMethodError
    from minreal.export.errors import SameFileError
    from minreal.runtime_bench import (
        BenchInputError,
        CheckError,
        ModelFileError,
        ReportSchemaError,
        UnknownProviderError,
    )

    return (MethodOptionError, RunDirError, SpecError, UnknownMethodError, CompressionError, SameFileError, TuneError,
            BenchInputError, CheckError, ModelFileError, ReportSchemaError, UnknownProviderError)


def run(argv: list[str] | None = None) -> int:
    """Run ``minreal`` with ``argv`` exactly as the console script does, and return its exit code instead of
    exiting (for embedding the CLI, e.g. in a release job written in Python, and for tests)."""
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else FAIL_EXIT)
    return 0


def console() -> None:
    """The ``minreal`` console script: :func:`main` on ``sys.argv``, then, once a command has imported torch, an exit
    that skips the interpreter's final teardown (1-2 s of freeing torch's modules that nothing needs). Exit
    handlers still run first (logging, multiprocessing and temporary-folder cleanup) and the output streams are
    flushed; an unexpected error with ``MINREAL_DEBUG=1`` keeps Python's own exit and traceback."""
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    if "torch" not in sys.modules:
        sys.exit(code)
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else FAIL_EXIT
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry (the console script is :func:`console`): one-line errors, exit 2 for usage errors and 1
    for failures, no tracebacks.

    Ctrl-C (SIGINT) exits 1 and SIGTERM exits 143 (128 + 15), each with one line on stderr, after removing
    what the command had started to write (staging folder, lock file, temporary files, folders it created).
    Set ``MINREAL_DEBUG=1`` to see the traceback of an unexpected error.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, ProgressBars):
            handler.setLevel(logging.WARNING)  # library INFO records reach only the progress bars
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> None:
    try:
        cli.main(args=argv, prog_name="minreal", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("minreal: aborted", err=True)
        sys.exit(FAIL_EXIT)
    except click.ClickException as exc:
        exc.show()
        sys.exit(USAGE_EXIT if isinstance(exc, click.UsageError) else exc.exit_code)
    except Terminated:
        click.echo("minreal: terminated (SIGTERM); partial output removed", err=True)
        sys.exit(TERM_EXIT)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the CLI's single place that turns errors into one line
        if os.environ.get("MINREAL_DEBUG"):
            raise
        from minreal.facts import error_line

        click.echo(f"minreal: error: {error_line(exc)}", err=True)
        sys.exit(USAGE_EXIT if isinstance(exc, _usage_errors()) else FAIL_EXIT)


if __name__ == "__main__":  # python -m minreal.app.cli (or python -m minreal.app.cli)
    console()
