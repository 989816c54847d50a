"""Option groups the commands share, declared once with the same names everywhere: the method options
(:class:`~minreal.app.cli_help.MethodCommand` shows them by group), image folders, recovery, pipeline, runtime
providers and shapes; each group's reader turns its values into the library's config. Single shared options
(``--data``, ``--out``, ...) are in :mod:`minreal.app.cli_options`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import click

from minreal.app.cli_help import BENCHMARK, EXPORT, MODEL_DATA, RECOVERY, GroupedOption
from minreal.app.cli_options import (
    batch_option,
    fp16_option,
    min_seconds_option,
    no_int8_option,
    out_option,
    overwrite_option,
    quant_mode_option,
    repeats_option,
)
from minreal.app.settings import RUN_BENCH
from minreal.export.settings import FORMATS, ORT_OPTIMIZATIONS, ORT_PLATFORMS, ORT_STYLES, QUANT_TARGETS, VariantConfig
from minreal.facts import PROVIDERS

__all__ = ["IMAGE_GROUP", "ORT_GROUP", "QUANT_TARGET_HELP", "axis_values_option", "fixed_shapes_option",
           "fixed_shapes_spec", "image_options", "image_preprocess", "known_providers", "method_choice",
           "method_options", "mismatch_option", "ort_config", "ort_options", "pipeline_config", "pipeline_options",
           "provider_options", "provider_settings", "providers_option", "qat_recovery_option", "quant_target_for",
           "quant_target_option", "recovery_config", "recovery_options", "require_providers", "shape_options",
           "skip_unavailable_option", "split_ints", "split_names"]

#: ``--quant-target``'s help, the same in every command.
QUANT_TARGET_HELP = ("INT8 format. cpu-vnni: uint8 activations, 8-bit weights (x86 with VNNI/AMX); cpu-avx2: "
                     "7-bit weights, which cannot saturate ONNX Runtime's int16 step on x86 without VNNI; cpu: the "
                     "one this machine needs (of those two on x86, arm64 on an ARM64 CPU); arm64: symmetric int8 "
                     "activations and per-channel int8 weights (S8S8), what ONNX Runtime's ARM64 kernels run "
                     "(checked here, not timed on ARM); tensorrt: symmetric int8, what TensorRT builds.")


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


def method_choice(searchable: bool = False) -> click.Choice:
    """``--method``'s choices: the registered methods (with ``searchable``, those ``tune`` can search:
    :attr:`~minreal.compress.core.spec.MethodSpec.searchable`; another registered one is refused saying why)."""
    from minreal.compress import get_method, method_names

    if not searchable:
        return click.Choice(method_names())
    return _SearchableChoice([n for n in method_names() if get_method(n).searchable])


class _SearchableChoice(click.Choice):
    """The methods ``tune`` can search; a registered method it cannot is refused with the reason, not only the list."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from minreal.compress import get_method, method_names

        if value in method_names() and (why := get_method(value).unsearchable):
            self.fail(f"tune cannot search {value!r}: {why}; a plan file's variant (--plan) runs it as given, or "
                      f"choose from {', '.join(map(repr, self.choices))}", param, ctx)
        return super().convert(value, param, ctx)


def split_ints(value: str, name: str) -> tuple[int, ...]:
    """The positive integers of a comma-separated option value (``--batch 1,8``); otherwise a usage error."""
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint=name) from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"expected positive integers, got {value!r}", param_hint=name)
    return out


def split_names(value: str) -> tuple[str, ...]:
    """The names of a comma-separated option value (``--providers cpu,cuda``), blanks dropped."""
    return tuple(v.strip() for v in value.split(",") if v.strip())


def providers_option(help_text: str = f"Comma-separated: {', '.join(PROVIDERS)}.") -> Callable[[Callable], Callable]:
    """``--providers``, the same option in every command: comma-separated provider names, default the pipeline's
    (cpu); ``help_text`` says what the command does with them."""
    return click.option("--providers", default=",".join(RUN_BENCH.providers), show_default=True, metavar="NAMES",
                        cls=GroupedOption, group=BENCHMARK, brief=True, help=help_text)


def known_providers(value: str) -> tuple[str, ...]:
    """The names of a ``--providers`` value, each a known provider; otherwise a usage error naming the option (for
    commands that only read the names; those that run the providers check them with :func:`require_providers`)."""
    names = split_names(value)
    if not names or set(names) - set(PROVIDERS):
        raise click.BadParameter(f"expected comma-separated providers out of {', '.join(PROVIDERS)}, got {value!r}",
                                 param_hint="--providers")
    return names


def quant_target_option(fn: Callable) -> Callable:
    """``--quant-target``, default from the providers; read back by :func:`quant_target_for`."""
    return click.option("--quant-target", type=click.Choice(QUANT_TARGETS), default=None, cls=GroupedOption,
                        group=EXPORT,
                        help=QUANT_TARGET_HELP + " Default: tensorrt when --providers includes tensorrt, else "
                                                 f"{VariantConfig.quant_target}.")(fn)


def quant_target_for(given: str | None, providers: tuple[str, ...]) -> str:
    """The INT8 format: ``--quant-target`` when given, else TensorRT's when tensorrt is among ``providers`` (what
    TensorRT builds), else the pipeline's default."""
    return given or ("tensorrt" if "tensorrt" in providers else VariantConfig.quant_target)


def shape_options(input_shape: tuple[str, ...],
                  dynamic_axes: tuple[str, ...]) -> tuple[Any, dict[str, dict[int, str]]]:
    """Parsed ``--input-shape`` (``None`` when not given) and ``--dynamic-axes``; bad values are usage errors."""
    from minreal.app.shapes import parse_dynamic_axes, parse_input_shapes

    try:
        return (parse_input_shapes(input_shape) if input_shape else None), parse_dynamic_axes(dynamic_axes)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def fixed_shapes_option(fn: Callable) -> Callable:
    """``--fixed-shapes``, read back by :func:`fixed_shapes_spec`."""
    return click.option(
        "--fixed-shapes", "fixed_shapes", metavar="DIM=N|INPUT=AxB,...", cls=GroupedOption, group=EXPORT,
        help="Fix symbolic dimensions in the written ONNX files for edge runtimes (NNAPI runs no node fed by a "
             "dynamic shape): DIM=N fixes a dimension by name (batch=1; the exporter names axis 0 'batch'), "
             "INPUT=AxBxC gives a graph input its whole shape (input_ids=1x128); comma-separated. Parity is checked "
             "on the dynamic graph, then the fixed file against it at its shape. A fixed batch is the only batch "
             "size a file runs at.")(fn)


def fixed_shapes_spec(text: str | None) -> Any:
    """The :class:`~minreal.export.mobile.ShapeSpec` of ``--fixed-shapes`` (``None`` when not given)."""
    if not text:
        return None
    from minreal.export.mobile import parse_fixed_shapes

    try:
        return parse_fixed_shapes(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--fixed-shapes") from None


ORT_GROUP = "ORT format (--format onnx,ort)"
#: :func:`ort_options`' parameters → the :class:`~minreal.export.settings.OrtConfig` fields they set.
_ORT_FIELDS = {"ort_optimization": "optimization", "ort_style": "style", "ort_platform": "target_platform",
               "ort_type_reduction": "type_reduction"}


def ort_options(fn: Callable) -> Callable:
    """``--format`` and the ORT-format converter's settings; read back by :func:`ort_config`."""
    for opt in reversed([
        click.option("--format", "formats", default=FORMATS[0], show_default=True, metavar="onnx[,ort]",
                     cls=GroupedOption, group=EXPORT,
                     help="Comma-separated file formats: onnx (always written), ort: also NAME.ort, ONNX Runtime's "
                          "ORT format for its minimal build, converted from the .onnx file (after --fixed-shapes) "
                          "with onnxruntime.tools, with NAME.required_operators.config, the operators a minimal build "
                          "needs (--include_ops_by_config), and parity checked by loading the .ort file."),
        click.option("--ort-optimization", type=click.Choice(ORT_OPTIMIZATIONS), default=None, cls=GroupedOption,
                     group=ORT_GROUP, help="Graph optimisation level baked into the .ort file (default all; 'layout' "
                                           "and 'all' add x86's NCHWc layouts only for --ort-platform amd64)."),
        click.option("--ort-style", type=click.Choice(ORT_STYLES), default=None, cls=GroupedOption, group=ORT_GROUP,
                     help="fixed (default): optimise before saving, for the CPU EP; runtime: basic optimisations "
                          "saved, the others replayed at run time (for NNAPI/CoreML, with "
                          "session.enable_saved_runtime_optimizations=1)."),
        click.option("--ort-platform", type=click.Choice(ORT_PLATFORMS), default=None, cls=GroupedOption,
                     group=ORT_GROUP, help="Target platform of the optimisations: arm allows int8 QDQ fusions, amd64 "
                                           "x86 NCHWc layouts (with this CPU's NCHWc block: for a fleet of the same "
                                           "CPU), any neither (runs anywhere). Default: arm for --quant-target arm64 "
                                           "(cpu on ARM), any otherwise."),
        click.option("--ort-type-reduction", is_flag=True, cls=GroupedOption, group=ORT_GROUP,
                     help="Record the types each operator needs (NAME.required_operators_and_types.config), so a "
                          "minimal build also drops unused type kernels."),
    ]):
        fn = opt(fn)
    return fn


def ort_config(opts: dict[str, Any]) -> Any:
    """Pop :func:`ort_options`' values from ``opts`` (the command's keyword arguments) and return the
    :class:`~minreal.export.settings.OrtConfig` they ask for, or None without ``ort`` in ``--format``; a bad format,
    or a converter setting without ``ort``, is a usage error naming the option."""
    from minreal.export.settings import OrtConfig

    text = opts.pop("formats")
    formats = split_names(text)
    given = {key: value for key in _ORT_FIELDS if (value := opts.pop(key)) not in (None, False)}
    if not formats or set(formats) - set(FORMATS):
        raise click.BadParameter(f"expected comma-separated formats out of {', '.join(FORMATS)}, got {text!r}",
                                 param_hint="--format")
    if "ort" not in formats:
        if given:
            raise click.UsageError(f"--{next(iter(given)).replace('_', '-')} applies to the ORT-format file: add "
                                   "--format onnx,ort")
        return None
    return OrtConfig(**{_ORT_FIELDS[key]: value for key, value in given.items()})


IMAGE_GROUP = "Image folders (data given as a folder of images)"


def image_options(fn: Callable) -> Callable:
    """``--image-size``, ``--mean``, ``--std``, ``--preprocess``: how an image folder becomes inputs (see
    :class:`minreal.app.preprocess.ImagePreprocess`); read back by :func:`image_preprocess`."""
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


def image_preprocess(opts: dict[str, Any]) -> Any:
    """Pop the image options from ``opts`` (the command's keyword arguments) and return the
    :class:`~minreal.app.preprocess.ImagePreprocess` they ask for, or None when none was given (the defaults)."""
    from minreal.app.preprocess import preprocess_from_options

    return preprocess_from_options(opts.pop("image_size"), opts.pop("image_mean"), opts.pop("image_std"),
                                   opts.pop("image_preprocess"))


def mismatch_option(fn: Callable) -> Callable:
    """``--allow-data-mismatch``: go on when the original scores near chance on the labelled data."""
    return click.option("--allow-data-mismatch", is_flag=True, cls=GroupedOption, group=MODEL_DATA,
                        help="Go on, with a warning recorded in the report, when the original model scores near "
                             "chance on the labelled data (which otherwise stops the command: the data most likely "
                             "does not match the model's preprocessing or labels).")(fn)


def recovery_options(fn: Callable) -> Callable:
    """``--recover-*``: distillation from the original after the method (see
    :class:`minreal.compress.core.recover_options.RecoveryConfig`), off by default; read back by
    :func:`recovery_config`."""
    from minreal.compress.core.recover_options import TASKS, RecoveryConfig

    base = RecoveryConfig()
    for opt in reversed([
        click.option("--recover-epochs", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
                     cls=GroupedOption, group=RECOVERY, brief=True,
                     help="Epochs of distillation from the original on the data after compressing; 0: none."),
        click.option("--recover-steps", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
                     cls=GroupedOption, group=RECOVERY,
                     help="Budget in optimiser steps instead of epochs (not with --recover-epochs)."),
        click.option("--recover-alpha", type=click.FloatRange(0.0, 1.0), default=base.alpha, show_default=True,
                     cls=GroupedOption, group=RECOVERY,
                     help="Weight of the label loss (when the data has labels); 0: pure distillation, 1: labels "
                          "alone."),
        click.option("--recover-lr", type=click.FloatRange(min=0.0, min_open=True), default=base.lr,
                     show_default=True, cls=GroupedOption, group=RECOVERY,
                     help="AdamW learning rate of the recovery (cosine schedule with warm-up)."),
        click.option("--recover-temperature", type=click.FloatRange(min=0.0, min_open=True), default=base.temperature,
                     show_default=True, cls=GroupedOption, group=RECOVERY,
                     help="Softmax temperature of the distillation loss (classifiers)."),
        click.option("--recover-batch-size", type=click.IntRange(min=1), default=base.batch_size, show_default=True,
                     cls=GroupedOption, group=RECOVERY, help="Training batch size of the recovery."),
        click.option("--recover-patience", type=click.IntRange(min=1), default=base.patience, show_default=True,
                     cls=GroupedOption, group=RECOVERY,
                     help="Stop after this many epochs without improvement on the recovery's validation split."),
        click.option("--recover-features", multiple=True, metavar="auto|MODULE", cls=GroupedOption,
                     group=RECOVERY,
                     help="Also match intermediate features: 'auto' (the layers the method changed) or module names "
                          "(repeat); points whose output shape changed are skipped and reported."),
        click.option("--recover-feature-weight", type=click.FloatRange(min=0.0), default=base.feature_weight,
                     show_default=True, cls=GroupedOption, group=RECOVERY,
                     help="Weight of the feature-matching term against the output loss."),
        click.option("--recover-task", type=click.Choice(list(TASKS)), default=base.task, show_default=True,
                     cls=GroupedOption, group=RECOVERY,
                     help="auto: integer labels mean classification, float labels regression; without labels, "
                          "outputs (batch, k>1) are taken for logits. Give regression for an unlabelled "
                          "multi-output regressor."),
        click.option("--recover-weight-decay", type=click.FloatRange(min=0.0), default=base.weight_decay,
                     show_default=True, cls=GroupedOption, group=RECOVERY, help="AdamW weight decay."),
        click.option("--recover-warmup", type=click.FloatRange(0.0, 1.0, max_open=True), default=base.warmup,
                     show_default=True, cls=GroupedOption, group=RECOVERY,
                     help="Share of the steps with a linear learning-rate warm-up."),
        click.option("--recover-val-fraction", type=click.FloatRange(0.0, 1.0, max_open=True),
                     default=base.val_fraction, show_default=True, cls=GroupedOption, group=RECOVERY,
                     help="Share of the data held out (seeded) as the recovery's validation split (early stopping)."),
        click.option("--recover-seed", type=int, default=base.seed, show_default=True, cls=GroupedOption,
                     group=RECOVERY, help="Seed of the split, the batch order and the training."),
        click.option("--recover-freeze-bn", "recover_freeze_batchnorm", flag_value=True, default=None,
                     cls=GroupedOption, group=RECOVERY,
                     help="Keep BatchNorm statistics frozen while training (re-estimated exactly after each "
                          "epoch), as a torchrun recovery always does: give it to one process to get the "
                          "distributed result; default in one process: batch statistics."),
    ]):
        fn = opt(fn)
    return fn


def qat_recovery_option(fn: Callable) -> Callable:
    """``--recover-int8``: a quantisation-aware recovery, for the commands that export INT8 with its trained ranges
    (``run``); read back by :func:`recovery_config`."""
    return click.option("--recover-int8", is_flag=True, cls=GroupedOption, group=RECOVERY,
                        help="Quantisation-aware recovery: train with weights and layer inputs fake-quantised in the "
                             "target's INT8 format (--quant-target, by default from --providers), learning the "
                             "activation ranges; run's INT8 export then uses the trained ranges, beside a "
                             "post-training INT8 (.ptq.int8) of the same weights.")(fn)


def recovery_config(opts: dict[str, Any], int8_target: str) -> Any:
    """Pop the ``recover_*`` options from ``opts`` (the command's keyword arguments) and return the
    :class:`~minreal.compress.core.recover_options.RecoveryConfig` they ask for, or None when recovery is off;
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
        from minreal.export.int8.target import resolve_target

        given["int8"] = resolve_target(int8_target)
    return RecoveryConfig(**given)


def pipeline_options(fn: Callable) -> Callable:
    """The run directory, batch sizes, providers, INT8/FP16 and timing options of a pipeline run; read back by
    :func:`pipeline_config`."""
    for opt in reversed([
        out_option("the run directory.", "runs/latest", directory=True),
        overwrite_option,
        batch_option("to time.", ",".join(map(str, RUN_BENCH.batch_sizes))),
        providers_option(),
        no_int8_option("fp32 files only."),
        fp16_option("LABEL.fp16 of the original and every variant even without a cuda/tensorrt provider (made "
                    "anyway with one)."),
        quant_target_option,
        quant_mode_option(VariantConfig.quant_mode),
        min_seconds_option(f"default {RUN_BENCH.min_seconds:g}."),
        repeats_option(f"default {RUN_BENCH.repeats}."),
    ]):
        fn = opt(fn)
    return fn


def pipeline_config(base: Any, batch: str, providers: str, no_int8: bool, quant_target: str, quant_mode: str,
                    min_seconds: float | None, repeats: int | None, fp16: bool = False) -> Any:
    """``base`` (a :class:`~minreal.app.settings.PipelineConfig`) with the values of :func:`pipeline_options`."""
    from dataclasses import replace

    timing = {k: v for k, v in (("min_seconds", min_seconds), ("repeats", repeats)) if v is not None}
    cfg = base.with_bench(batch_sizes=split_ints(batch, "--batch"), providers=split_names(providers), **timing)
    return replace(cfg, int8=not no_int8, variant=replace(base.variant, quant_target=quant_target,
                                                           quant_mode=quant_mode), fp16=fp16)


def provider_options(fn: Callable) -> Callable:
    """--provider-option / --provider-config / --io-binding (minreal.runtime_bench.provider_options)."""
    for opt in reversed([
        click.option("--provider-option", "provider_option", multiple=True, metavar="PROVIDER.KEY=VALUE",
                     cls=GroupedOption, group=BENCHMARK,
                     help="A provider setting, repeatable: tensorrt.fp16=true, tensorrt.int8=true, "
                          "tensorrt.engine_cache=DIR, tensorrt.timing_cache=DIR, tensorrt.opt_level=0-5, "
                          "tensorrt.workspace=4G, cuda.device_id=0 (wins over --provider-config)."),
        click.option("--provider-config", type=click.Path(dir_okay=False), cls=GroupedOption, group=BENCHMARK,
                     help="TOML file, one table per provider ([tensorrt], [tensorrt.profiles] input = "
                          "[min, opt, max] shapes, [cuda]); see the README."),
        click.option("--io-binding", is_flag=True, cls=GroupedOption, group=BENCHMARK,
                     help="On GPU providers, also time with inputs and outputs bound on the device "
                          "(device-only latency beside the with-copy latency)."),
    ]):
        fn = opt(fn)
    return fn


def provider_settings(options: tuple[str, ...], config: str | None, providers: tuple[str, ...]) -> dict[str, Any]:
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


def skip_unavailable_option(fn: Callable) -> Callable:
    """``--skip-unavailable-providers``, read back by :func:`require_providers`."""
    return click.option("--skip-unavailable-providers", is_flag=True, cls=GroupedOption, group=BENCHMARK,
                        help="Benchmark the providers that can run and record the others as unavailable "
                             "(default: a requested provider that cannot run is an error).")(fn)


def require_providers(names: tuple[str, ...], skip_unavailable: bool) -> None:
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


def axis_values_option(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """Parsed ``--axis-values`` (``seq=32,128``); bad values are usage errors."""
    from minreal.app.shapes import parse_axis_values

    try:
        return parse_axis_values(values)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
