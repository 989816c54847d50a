"""ONNX Runtime's ORT format: an ``.onnx`` file converted to ``.ort``, with its required-operators configuration.

What an app ships with ONNX Runtime's minimal build is an ORT-format model (``.ort``) and a runtime that holds only
the kernels the model needs, built with ``build.sh --minimal_build --include_ops_by_config NAME.config``.

- :func:`convert_to_ort` runs ONNX Runtime's own converter (``onnxruntime.tools.convert_onnx_models_to_ort``, what
  ``python -m onnxruntime.tools.convert_onnx_models_to_ort`` runs) in-process on one file, into a temporary folder
  beside the destination; the ``.ort`` file and its configuration reach their paths only once both are written.
- :func:`parse_operator_config`, :func:`format_operator_config` and :func:`merge_operator_configs` read, write and
  merge configurations in the format of ``onnxruntime/tools/reduced_build_config_parser.py``: one
  ``DOMAIN;OPSETS;Op1,Op2`` line per domain and opset, each operator optionally followed by the types it needs as
  JSON (``Cast{"inputs": {"0": ["float"]}}``; an operator without types needs all of them).
- :func:`ort_variant` converts a verified variant and checks the ``.ort`` file's parity, loaded by ONNX Runtime: against
  the torch module (:func:`minreal.export.verify.verify_parity`) or, for a file torch does not reproduce within the
  tolerance (INT8), against its source ``.onnx`` file (:func:`minreal.export.verify.verify_files`);
  :func:`ort_copy` converts any ``.onnx`` file (a tune's ``chosen.onnx``) and checks it against that file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torch import nn

from minreal.compress.core.inputs import Inputs, repeat_to
from minreal.export.atomic import ensure_distinct
from minreal.export.errors import OrtConversionError
from minreal.export.int8 import resolve_target
from minreal.export.json_safe import to_jsonable
from minreal.export.quiet import Captured, captured_output
from minreal.export.record import VariantRecord
from minreal.export.settings import OrtConfig, VariantConfig
from minreal.export.variant import PARITY_BATCH_SIZES, parity_inputs, record_axes, relative_to
from minreal.export.verify import (
    Feeds,
    ParityResult,
    feeds_of,
    verify_files,
    verify_parity,
)
from minreal.facts import ARM64_TARGET, CPU_AVX2_TARGET, CPU_VNNI_TARGET, error_line
from minreal.runtime_bench.atomic import atomic_path
from minreal.runtime_bench.cpu import ARM_GRAPH_CONFIG
from minreal.runtime_bench.errors import ModelFileError

__all__ = ["OrtFile", "Operators", "convert_to_ort", "config_path_for", "parse_operator_config",
           "read_operator_config", "format_operator_config", "union_operators", "merge_operator_configs",
           "operator_names", "ort_copy", "ort_for_target", "converter_platform", "TARGET_PLATFORMS", "ort_paths",
           "ort_summary", "ort_variant"]

logger = logging.getLogger(__name__)

Operators = dict[str, dict[int, dict[str, str | None]]]
"""A required-operators configuration: domain → opset → operator → its required types as JSON (``None``: all)."""

_LEVEL_VARIABLE = "ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL"
"""The only way to give ONNX Runtime's converter its optimisation level (its ``convert_onnx_models_to_ort``)."""


@dataclass(frozen=True)
class OrtFile:
    """An ORT-format model written by :func:`convert_to_ort`.

    Attributes
    ----------
    path : str
        the ``.ort`` file.
    config_path : str
        its required-operators configuration (``--include_ops_by_config`` of a minimal build).
    source : str
        the ``.onnx`` file it was converted from.
    bytes : int
        size of the ``.ort`` file.
    optimization, style, target_platform, type_reduction
        the converter's settings (:class:`OrtConfig`).
    operators : list[str]
        the operators the configuration lists, ``domain:Op`` (sorted).
    optimized_onnx : str | None
        the ONNX file with the same optimisations (for viewing in Netron), when asked for.
    """

    path: str
    config_path: str
    source: str
    bytes: int
    optimization: str
    style: str
    target_platform: str | None
    type_reduction: bool
    operators: list[str]
    optimized_onnx: str | None = None


def config_path_for(ort_path: str | os.PathLike[str], type_reduction: bool = False) -> Path:
    """The configuration beside an ``.ort`` file: ``NAME.required_operators.config`` (the converter's name;
    ``NAME.required_operators_and_types.config`` with type reduction)."""
    kind = "required_operators_and_types" if type_reduction else "required_operators"
    return Path(ort_path).with_suffix(f".{kind}.config")


@contextlib.contextmanager
def _converter_level(level: str) -> Iterator[None]:
    """Set the converter's optimisation level (read from the environment only) for the block, then restore it."""
    saved = os.environ.get(_LEVEL_VARIABLE)
    os.environ[_LEVEL_VARIABLE] = level
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(_LEVEL_VARIABLE, None)
        else:
            os.environ[_LEVEL_VARIABLE] = saved


def _run_converter(src: Path, out_dir: Path, config: OrtConfig, optimized_onnx: bool) -> None:
    """ONNX Runtime's converter on one file into ``out_dir``, silent; its failure as :class:`OrtConversionError`."""
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    printed = Captured()
    try:
        with _converter_level(config.optimization), captured_output() as printed:
            convert_onnx_models_to_ort(src, output_dir=out_dir,
                                       optimization_styles=[OptimizationStyle[config.style.title()]],
                                       target_platform=converter_platform(config),
                                       save_optimized_onnx_model=optimized_onnx,
                                       enable_type_reduction=config.type_reduction)
    except Exception as exc:  # the converter re-raises whatever ONNX Runtime raised
        logger.debug("ORT-format conversion of %s failed; the converter printed:\n%s", src, printed.text)
        raise OrtConversionError(f"ONNX Runtime cannot convert {src} to ORT format: {error_line(exc)}") from None


def _one(folder: Path, pattern: str) -> Path:
    """The one file of ``folder`` matching ``pattern`` (what the converter wrote)."""
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise OrtConversionError(f"ONNX Runtime's converter wrote {[f.name for f in found]} for {pattern}, "
                                 "expected one file; check the onnxruntime version")
    return found[0]


def convert_to_ort(src: str | os.PathLike[str], dst: str | os.PathLike[str] | None = None,
                   config: OrtConfig | None = None, optimized_onnx: bool = False) -> OrtFile:
    """Convert an ONNX file to ORT format with ONNX Runtime's converter, and write its operator configuration.

    Parameters
    ----------
    src : str | os.PathLike[str]
        the ``.onnx`` file (never changed; external data beside it is read in place).
    dst : str | os.PathLike[str] | None
        the ``.ort`` file (default ``src`` with suffix ``.ort``); its configuration goes beside it
        (:func:`config_path_for`) and names it by file name.
    config : OrtConfig | None
        optimisation level and style, target platform, type reduction (default :class:`OrtConfig`).
    optimized_onnx : bool
        also write ``NAME.optimized.onnx``, the ONNX graph with the same optimisations.

    Returns
    -------
    OrtFile
        An :class:`OrtFile`.

    Raises
    ------
    ModelFileError
        ``src`` does not exist.
    ValueError
        ``dst`` does not end in ``.ort`` (ONNX Runtime picks the format by it).
    SameFileError
        an output would overwrite ``src``.
    OrtConversionError
        the converter failed (its error in one line).
    """
    config = config or OrtConfig()
    src = Path(src)
    dst = Path(dst) if dst is not None else src.with_suffix(".ort")
    if not src.is_file():
        raise ModelFileError(f"ONNX file not found: {src}")
    if dst.suffix != ".ort":
        raise ValueError(f"an ORT-format file's name ends in .ort (ONNX Runtime picks the format by it), got {dst}")
    outputs = {"ort": dst, "config": config_path_for(dst, config.type_reduction)}
    if optimized_onnx:
        outputs["optimized"] = dst.with_suffix(".optimized.onnx")
    for out in outputs.values():
        ensure_distinct(src, out)
    with tempfile.TemporaryDirectory(prefix=".minreal-ort-", dir=dst.parent) as tmp:
        _run_converter(src, Path(tmp), config, optimized_onnx)
        made = {"ort": _one(Path(tmp), "*.ort"), "config": _one(Path(tmp), "*.config")}
        if optimized_onnx:
            made["optimized"] = _one(Path(tmp), "*.optimized.onnx")
        operators = read_operator_config(made["config"])
        made["config"].write_text(format_operator_config(operators, ["Generated from model/s:", f"- {dst.name}"]))
        for key, path in made.items():
            with atomic_path(outputs[key]) as target:
                os.replace(path, target)
    return OrtFile(str(dst), str(outputs["config"]), str(src), dst.stat().st_size, config.optimization, config.style,
                   config.target_platform, config.type_reduction, operator_names(operators),
                   str(outputs["optimized"]) if optimized_onnx else None)


def _closing_brace(text: str, start: int) -> int:
    """Index just past the brace that closes the one at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError(f"unbalanced braces in {text[start:]!r}")


def _operators(body: str) -> Iterator[tuple[str, str | None]]:
    """``(operator, types JSON or None)`` of the operator list of one configuration line."""
    cur = 0
    while cur < len(body):
        stop = min((i for i in (body.find(",", cur), body.find("{", cur)) if i >= 0), default=len(body))
        name = body[cur:stop].strip()
        if not name:
            raise ValueError(f"empty operator name in {body!r}")
        if stop < len(body) and body[stop] == "{":
            end = _closing_brace(body, stop)
            if end < len(body) and body[end] != ",":
                raise ValueError(f"expected ',' after the types of {name} in {body!r}")
            yield name, body[stop:end]
            cur = end + 1
        else:
            yield name, None
            cur = stop + 1


def _union_json(a: Any, b: Any) -> Any:
    """Union of two type descriptions: maps key by key, lists as sorted sets."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _union_json(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list):
        items = {json.dumps(v): v for v in [*a, *b]}
        return [items[k] for k in sorted(items)]
    if a != b:
        raise ValueError(f"cannot merge the type descriptions {a!r} and {b!r}")
    return a


def _union_types(a: str | None, b: str | None) -> str | None:
    """The types an operator needs in either configuration (``None``, all types, wins)."""
    if a is None or b is None:
        return None
    return json.dumps(_union_json(json.loads(a), json.loads(b)))


def _add(ops: Operators, domain: str, opset: int, op: str, types: str | None) -> None:
    """Add one operator (with its types) to ``ops`` in place, merging with what is there."""
    table = ops.setdefault(domain, {}).setdefault(opset, {})
    table[op] = _union_types(table[op], types) if op in table else types


def parse_operator_config(text: str) -> Operators:
    """The operators of a required-operators configuration (comments and blank lines skipped).

    Raises
    ------
    ValueError
        a line that is not ``DOMAIN;OPSETS;OPERATORS``, or a ``!`` directive (global type lists are
        not merged here: write them by hand after merging).
    """
    ops: Operators = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(";", 2)]
        if line.startswith("!") or len(parts) != 3:
            raise ValueError(f"configuration line {number} is not DOMAIN;OPSETS;Op1,Op2: {line[:80]!r}")
        domain, opsets, body = parts
        try:
            versions = [int(v) for v in opsets.split(",")]
        except ValueError:
            raise ValueError(f"configuration line {number}: opsets {opsets!r} are not integers") from None
        for opset in versions:
            for op, types in _operators(body):
                _add(ops, domain, opset, op, types)
    return ops


def read_operator_config(path: str | os.PathLike[str]) -> Operators:
    """:func:`parse_operator_config` of a file; a bad line names the file."""
    try:
        return parse_operator_config(Path(path).read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def format_operator_config(ops: Operators, header: Sequence[str] = ()) -> str:
    """A configuration's text: ``header`` lines as comments, then one sorted line per domain and opset."""
    lines = [f"# {line}" for line in header]
    for domain in sorted(ops):
        for opset in sorted(ops[domain]):
            table = ops[domain][opset]
            if table:
                lines.append(f"{domain};{opset};" + ",".join(op + (table[op] or "") for op in sorted(table)))
    return "\n".join(lines) + "\n"


def union_operators(*configs: Operators) -> Operators:
    """Every operator of every configuration, at each of its opsets, with the union of the types it needs."""
    ops: Operators = {}
    for config in configs:
        for domain, opsets in config.items():
            for opset, table in opsets.items():
                for op, types in table.items():
                    _add(ops, domain, opset, op, types)
    return ops


def merge_operator_configs(paths: Sequence[str | os.PathLike[str]], dst: str | os.PathLike[str]) -> Path:
    """Write ``dst`` (atomically): the union of the configurations ``paths`` (a minimal build for several models).

    Raises
    ------
    ValueError
        no configuration given, or one that cannot be parsed (the message names it).
    SameFileError
        ``dst`` is one of ``paths``.
    """
    if not paths:
        raise ValueError("no required-operators configuration to merge")
    for path in paths:
        ensure_distinct(path, dst)
    merged = union_operators(*(read_operator_config(p) for p in paths))
    header = ["Merged from:", *(f"- {Path(p).name}" for p in paths)]
    with atomic_path(dst) as tmp:
        tmp.write_text(format_operator_config(merged, header))
    return Path(dst)


def operator_names(ops: Operators) -> list[str]:
    """``domain:Op`` of every operator in ``ops``, sorted."""
    return sorted({f"{domain}:{op}" for domain, opsets in ops.items() for table in opsets.values() for op in table})


def ort_paths(onnx_path: str | os.PathLike[str], config: OrtConfig) -> tuple[Path, Path]:
    """The ``.ort`` file and configuration :func:`ort_variant` writes for ``onnx_path`` (``NAME.ort``,
    ``NAME.required_operators.config``)."""
    ort = Path(onnx_path).with_suffix(".ort")
    return ort, config_path_for(ort, config.type_reduction)


def _parity_inputs(record: VariantRecord, x: Inputs, cfg: VariantConfig) -> tuple[list[Inputs], bool]:
    """The inputs a variant's ``.ort`` file is checked on, and whether its batch is fixed: the export's parity
    inputs, or for a fixed-shape file the example rows at its fixed batch (at each parity batch size when only
    other dimensions are fixed)."""
    if not record.fixed_shapes:
        return parity_inputs(x, record_axes(record)), False
    batch = cfg.fixed_shapes.batch() if cfg.fixed_shapes is not None else None
    return [repeat_to(x, b) for b in ((batch,) if batch else PARITY_BATCH_SIZES)], batch is not None


def ort_variant(record: VariantRecord, folder: Path, x: Inputs, cfg: VariantConfig, ort: OrtConfig,
                module: nn.Module | None = None) -> dict[str, Any]:
    """``NAME.ort`` and its configuration beside a verified variant's file, written once its parity passed.

    Parameters
    ----------
    record : VariantRecord
        the variant (from :func:`minreal.export.variant.export_variant` or ``quantize_variant``); its file
        lies in ``folder`` (with fixed shapes, the fixed file: the ``.ort`` file is converted from it).
    folder : Path
        where the variant's file lies and the ``.ort`` file is written.
    x : Inputs
        example inputs, batch first (the export's parity inputs are drawn from them).
    cfg : VariantConfig
        the variant's tolerances and fixed shapes.
    ort : OrtConfig
        the converter's settings.
    module : nn.Module | None
        the torch module the variant was exported from: parity against torch; ``None`` (an INT8 file)
        compares the ``.ort`` file with its ``.onnx`` source instead, both run by ONNX Runtime.

    Returns
    -------
    dict[str, Any]
        The :class:`OrtFile` as a dict with ``parity`` (a :class:`~minreal.export.verify.ParityResult` and
        ``against``: ``torch`` or the source file), paths relative to ``folder``.

    Raises
    ------
    ParityError
        the ``.ort`` file's outputs differ beyond ``cfg.rtol``/``cfg.atol`` (nothing is written).
    OrtConversionError
        the converter failed.
    """
    folder, source = Path(folder), Path(folder) / record.onnx
    ort = ort_for_target(ort, record.quantization.get("target") or cfg.quant_target)
    inputs, fixed_batch = _parity_inputs(record, x, cfg)
    if module is None:
        check, against = _source_check(source, [feeds_of(i) for i in inputs], ort, cfg.rtol, cfg.atol)
    else:
        def check(path: str) -> ParityResult:
            return verify_parity(module, path, inputs, cfg.rtol, cfg.atol, fixed_batch=fixed_batch,
                                 atol_scale=cfg.atol_scale)

        against = {"against": "torch"}
    return _checked_conversion(source, folder, ort, check, against)


#: The converter's platform for the files of each explicit INT8 target (``--quant-target``). ``arm`` for ``arm64``:
#: int8 QDQ fusions kept (ARM's graph), the graph ARM's builds make of the file anyway. ``any`` for the x86 targets:
#: ``amd64`` would add x86's NCHWc convolution layouts (which an ``.onnx`` session on x86 builds at load, so the fp32
#: ``.ort`` files without them ran 1.52x (digits CNN) and 1.57x (ResNet-32) as long as their ``.onnx`` files at batch
#: 1, with them 0.97x and 0.95x, ``benchmarks/edge.json``), but it bakes this machine's NCHWc block into the file (16
#: channels on AVX-512, 8 on AVX2; ONNX Runtime's converter warns that such a file belongs to the machine that made
#: it), so it stays opt-in.
TARGET_PLATFORMS = {ARM64_TARGET: "arm", CPU_VNNI_TARGET: "any", CPU_AVX2_TARGET: "any", "tensorrt": "any"}


def ort_for_target(ort: OrtConfig, quant_target: str | None) -> OrtConfig:
    """``ort`` with its platform decided for files of INT8 target ``quant_target`` (the run's ``--quant-target``, for
    its fp32 files too; ``cpu``: this machine's, :func:`minreal.export.int8.resolve_target`): an asked-for
    platform is kept, else :data:`TARGET_PLATFORMS` (an arm64 file keeps its int8 QDQ fusions, not this machine's
    uint8 rewrite; any other file gets no platform's); ``any`` without a target."""
    if ort.target_platform is not None:
        return ort
    target = resolve_target(quant_target) if quant_target else ""
    return replace(ort, target_platform=TARGET_PLATFORMS.get(target, "any"))


def converter_platform(ort: OrtConfig) -> str | None:
    """The ``target_platform`` argument ONNX Runtime's converter takes for ``ort`` (``any`` and ``None``: none)."""
    return None if ort.target_platform in (None, "any") else ort.target_platform


def ort_copy(source: str | os.PathLike[str], feeds: Sequence[Feeds], ort: OrtConfig, rtol: float = VariantConfig.rtol,
             atol: float = VariantConfig.atol, quant_target: str | None = None) -> dict[str, Any]:
    """``NAME.ort`` and its configuration beside the ONNX file ``source``, written once the ``.ort`` file reproduces
    ``source`` on each of ``feeds``, both run by ONNX Runtime (:func:`minreal.export.verify.verify_files`).

    Parameters
    ----------
    source : str | os.PathLike[str]
        the ``.onnx`` file (e.g. a tune's ``chosen.onnx``).
    feeds : Sequence[Feeds]
        inputs the two files are compared on (e.g. held-out rows at two batch sizes).
    ort : OrtConfig
        the converter's settings.
    rtol, atol : float
        parity tolerances (default: an exported variant's, as :func:`ort_variant` checks).
    quant_target : str | None
        the INT8 target the file is made for (``source``'s own, or for an fp32 file the run's
        ``--quant-target``; ``None``: none): it decides the converter's platform (:func:`ort_for_target`; an
        arm64 file: ``arm``).

    Returns
    -------
    dict[str, Any]
        The :class:`OrtFile` as a dict with ``parity`` (``against``: ``source``'s name), paths relative to
        ``source``'s folder.

    Raises
    ------
    ParityError
        the ``.ort`` file's outputs differ beyond the tolerance (nothing is written).
    OrtConversionError
        the converter failed.
    """
    source, ort = Path(source), ort_for_target(ort, quant_target)
    check, against = _source_check(source, feeds, ort, rtol, atol)
    return _checked_conversion(source, source.parent, ort, check, against)


def _source_check(source: Path, feeds: Sequence[Feeds], ort: OrtConfig, rtol: float,
                  atol: float) -> tuple[Callable[[str], ParityResult], dict[str, str]]:
    """The parity check of an ``.ort`` file against its ``.onnx`` source, both run by ONNX Runtime, and what the record
    says it was checked against. For an ``.ort`` file optimised for the arm platform the source runs in ONNX Runtime's
    ARM graph (:data:`~minreal.runtime_bench.cpu.ARM_GRAPH_CONFIG`: the same int8 QDQ fusions, so the two agree
    exactly); this x86 machine's own graph rewrites int8 activations to uint8, and the logits of trained arm64
    ResNet-32 and SSM files differed from the ``.ort`` file's by up to 0.24 there (``benchmarks/edge.py``)."""
    config = ARM_GRAPH_CONFIG if ort.target_platform == "arm" else None

    def check(path: str) -> ParityResult:
        return verify_files(source, path, feeds, rtol, atol, reference_config=config)

    return check, {"against": source.name, **({"reference_graph": "arm"} if config else {})}


def _checked_conversion(source: Path, folder: Path, ort: OrtConfig, check: Callable[[str], ParityResult],
                        against: dict[str, str]) -> dict[str, Any]:
    """Convert ``source`` in a temporary folder inside ``folder``, ``check`` the ``.ort`` file there, then move it and
    its configuration into ``folder``: the record of :func:`ort_variant` and :func:`ort_copy`."""
    with tempfile.TemporaryDirectory(prefix=".minreal-ort-", dir=folder) as tmp:
        made = convert_to_ort(source, Path(tmp) / ort_paths(source, ort)[0].name, ort)
        parity = check(made.path)
        final = replace(made, path=str(folder / Path(made.path).name),
                        config_path=str(folder / Path(made.config_path).name))
        for temporary, path in ((made.config_path, final.config_path), (made.path, final.path)):
            with atomic_path(path) as target:
                os.replace(temporary, target)
        found = relative_to(to_jsonable(parity), Path(tmp))
    return relative_to({**to_jsonable(final), "parity": {**found, **against}}, folder)


def ort_summary(ort: dict[str, Any], folder: str | os.PathLike[str] = ".") -> str:
    """One line on an :func:`ort_variant` record (paths relative to ``folder``): both files, the settings and the
    parity."""
    parity = ort["parity"]
    batches = ", ".join(map(str, parity["batch_sizes"]))
    platform = {"arm": ", for arm", "amd64": ", for amd64 (this CPU's NCHWc block)", "any": ", for any CPU"}.get(
        ort.get("target_platform") or "any")
    graph = " in ONNX Runtime's ARM graph" if parity.get("reference_graph") == "arm" else ""
    return (f"wrote {Path(folder) / ort['path']} ({ort['bytes']} bytes, optimisation {ort['optimization']}, "
            f"{ort['style']}{platform}) and {Path(folder) / ort['config_path']} ({len(ort['operators'])} operators); "
            f"ORT parity ok against {parity['against']}{graph} (max abs err {parity['max_abs_err']:.3g} at batch sizes "
            f"{batches})")
