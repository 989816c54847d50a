"""torch → ONNX export with a dynamic batch axis.

The torch.export-based exporter (``torch.onnx.export(..., dynamo=True)``) is tried first; if it
fails, the TorchScript exporter (``dynamo=False``) is tried, and the result records which one wrote
the file and the first exporter's error in one line.

Measured here (torch 2.14.1, onnxscript 0.7.2, offline): the dynamo exporter handles small MLPs and
CNNs with a dynamic batch (example batch 1 included) at opsets 18-23; asked for opset 17 it still
writes opset 18, its minimum. It fails on data-dependent control flow (``if x.sum() > 0``), where the
TorchScript exporter traces one branch. Hence ``DEFAULT_OPSET = 18``.

A module whose parameters and buffers exceed 1.5 GiB (:data:`EXTERNAL_DATA_BYTES`; one protobuf holds at most
2 GiB) is written with ONNX external data: the graph ``PATH`` names its weights in ``PATH.data`` beside it by
that relative location (:mod:`minreal.export.onnx_files`). The checker is given the path, never a loaded model.

Both exporters print to stdout/stderr (progress lines, graph dumps, C++ "Torch IR graph at
exception" logs). Each exporter call runs inside :func:`minreal.export.quiet.captured_output`, which
captures Python and file-descriptor output, so ``--json`` output stays clean and ``-q`` is quiet;
the captured text goes to the debug log.
"""

from __future__ import annotations

import errno
import logging
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import torch
from torch import nn

from minreal.compress.core.evaluate import eval_mode, output_paths
from minreal.compress.core.inputs import Inputs, NamedInputs, args_of, call, input_names
from minreal.export.errors import ExportError
from minreal.export.onnx_files import data_files, externalize, onnx_size, staged_onnx
from minreal.export.quiet import Captured, captured_output
from minreal.export.serialize import export_dims
from minreal.export.settings import MIN_OPSET
from minreal.facts import ANSI_ESCAPE, first_line
from minreal.runtime_bench.atomic import OutputWriteError, write_error

__all__ = ["DEFAULT_OPSET", "EXTERNAL_DATA_BYTES", "Axes", "ExportResult", "graph_axes", "to_onnx"]

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 18
"""Opset asked for by default: the lowest one the dynamo exporter writes."""

EXTERNAL_DATA_BYTES = 1536 * 2**20
"""Parameters and buffers above this many bytes are exported as external data by default: one protobuf holds at
most 2 GiB, and this is the torch.export-based exporter's own threshold (torch 2.14), so the two always agree."""

_MAX_REASON = 240
_CLASS_REPR = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")
_OP_PATTERNS = (
    re.compile(r"operator '([\w:.]+)'"),
    re.compile(r"No ONNX function found for <OpOverload\(op='([\w.]+)'"),
    re.compile(r"target=torch\.ops\.([\w.]+)"),
)


@dataclass(frozen=True)
class ExportResult:
    """What :func:`to_onnx` wrote.

    Attributes
    ----------
    path : str
        the ONNX graph file (weights embedded, or in ``data_files`` beside it).
    exporter : str
        ``"dynamo"`` (torch.export-based) or ``"torchscript"``.
    opset : int
        default-domain opset of the written file (may exceed ``requested_opset``).
    requested_opset : int
        opset asked for.
    input_name : str
        name of the (first) graph input.
    output_names : list[str]
        names of the graph outputs, in the module's output order.
    dynamic_dims : dict[int, str]
        axis → symbolic name of every dynamic axis of the first input.
    fallback_reason : str | None
        one line: why the dynamo exporter was not used (``None`` if it was).
    num_nodes : int
        nodes in the main graph.
    file_size_bytes : int
        size of the written graph file.
    data_files : list[str]
        external data files the graph names (``[PATH.data]`` for a model exported with external
        data, else empty).
    total_size_bytes : int
        graph plus data files.
    """

    path: str
    exporter: str
    opset: int
    requested_opset: int
    input_name: str
    output_names: list[str]
    dynamic_dims: dict[int, str]
    fallback_reason: str | None
    num_nodes: int
    file_size_bytes: int
    input_names: list[str] = field(default_factory=list)
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    data_files: list[str] = field(default_factory=list)
    total_size_bytes: int = 0


Axes = dict[str, dict[int, str]]
"""Graph input name → {axis: symbolic dimension name} (one name may appear on several inputs: one dimension)."""


def _dynamic_axes(ndim: int, dynamic_batch: bool, dynamic_dims: Mapping[int, str] | None,
                  input_name: str = "input") -> dict[int, str]:
    """Validate and merge the batch axis with one input's extra dynamic axes."""
    axes = {0: "batch"} if dynamic_batch else {}
    for axis, name in (dynamic_dims or {}).items():
        if not 0 <= axis < ndim:
            raise ValueError(f"dynamic axis {axis} ({name!r}) of input {input_name!r} is outside the {ndim}-d "
                             "example input")
        if not name.isidentifier():
            raise ValueError(f"dynamic axis name {name!r} is not a Python identifier")
        axes[axis] = name
    if len(set(axes.values())) != len(axes):
        raise ValueError(f"dynamic axis names of input {input_name!r} must be distinct, got {axes}")
    return dict(sorted(axes.items()))


def graph_axes(example: Inputs, dynamic_batch: bool = True, dynamic_dims: Mapping[int, str] | None = None,
               dynamic_axes: Mapping[str, Mapping[int, str]] | None = None, input_name: str = "input") -> Axes:
    """Dynamic axes of every graph input: the batch (axis 0) plus ``dynamic_axes[name]`` (or, for a one-tensor
    input, ``dynamic_dims``).

    Raises
    ------
    ValueError
        an axis outside an input, a name that is not an identifier, an unknown input name, or a
        dimension name used on two inputs whose example sizes differ.
    """
    tensors = dict(example.items()) if isinstance(example, NamedInputs) else {input_name: example}
    extra = {k: dict(v) for k, v in (dynamic_axes or {}).items()}
    if dynamic_dims:
        extra.setdefault(next(iter(tensors)), {}).update(dynamic_dims)
    unknown = sorted(set(extra) - set(tensors))
    if unknown:
        raise ValueError(f"dynamic axes name unknown input(s) {unknown}; the inputs are {list(tensors)}")
    axes = {n: _dynamic_axes(t.dim(), dynamic_batch, extra.get(n), n) for n, t in tensors.items()}
    sizes: dict[str, tuple[str, int]] = {}
    for name, per_input in axes.items():
        for axis, dim in per_input.items():
            size = int(tensors[name].shape[axis])
            seen = sizes.setdefault(dim, (name, size))
            if seen[1] != size:
                raise ValueError(f"dimension {dim!r} is {seen[1]} on input {seen[0]!r} but {size} on {name!r} "
                                 "in the example; one name means one size")
    return axes


def _one_line(exc: BaseException, output: str = "") -> str:
    """Condense an exporter error to one line, preferring its 'Exception summary' section.

    If the exception carries no message, the first line the exporter printed (``output``) is used.
    """
    text = ANSI_ESCAPE.sub("", str(exc)) or first_line(output)
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip() != "⬆️"]
    line = _CLASS_REPR.sub(r"\1", lines[0]) if lines else ""
    line = f"{type(exc).__name__}: {line}"
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


def _unsupported_op(*messages: str) -> str | None:
    """Return the ATen/prims op an exporter error names, written ``aten::name``, if any."""
    for message in messages:
        for pattern in _OP_PATTERNS:
            match = pattern.search(message)
            if match:
                op = match.group(1).removesuffix(".default")
                return op.replace(".", "::", 1) if "::" not in op else op
    return None


def _locate_op(module: nn.Module, example: Inputs, op: str) -> str | None:
    """Return the qualified name of the submodule that calls ``op`` (best effort, via torch.export)."""
    try:
        with captured_output():
            program = torch.export.export(module, args_of(example), strict=False)
    except Exception:
        return None
    for node in program.graph.nodes:
        target = getattr(node.target, "name", None)
        if node.op == "call_function" and callable(target) and target() == op:
            stack = node.meta.get("nn_module_stack") or {}
            path = list(stack.values())[-1][0] if stack else ""
            return path or "<root>"
    return None


Names = tuple[list[str], list[str]]
"""(graph input names, graph output names)."""


def _export_dynamo(module: nn.Module, example: Inputs, path: Path, opset: int, axes: Axes, names: Names, *,
                   external: bool = False) -> None:
    """Export with the torch.export-based exporter; weights embedded in the file, or with ``external`` (or above
    the exporter's own 1.5 GiB threshold) in ``PATH.data`` beside it."""
    torch.onnx.export(
        module, args_of(example), str(path), dynamo=True, opset_version=opset,
        dynamic_shapes=export_dims(axes, names[0], module),
        input_names=names[0], output_names=names[1], external_data=external, verbose=False,
    )  # fmt: skip


def _export_torchscript(module: nn.Module, example: Inputs, path: Path, opset: int, axes: Axes, names: Names, *,
                        external: bool = False) -> None:
    """Export with the legacy TorchScript exporter (``dynamic_axes``; batch marked on outputs too).

    ``external`` is not passed on: this exporter writes external data (a file per tensor) only past 2 GiB;
    :func:`to_onnx` moves the weights out afterwards when asked.
    """
    dynamic_axes: dict[str, dict[int, str]] = {n: dict(a) for n, a in axes.items() if a}
    if any(a.get(0) == "batch" for a in axes.values()):
        dynamic_axes.update({name: {0: "batch"} for name in names[1]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, torch.jit.TracerWarning))
        torch.onnx.export(
            module, args_of(example), str(path), dynamo=False, opset_version=opset, input_names=names[0],
            output_names=names[1], dynamic_axes=dynamic_axes or None, do_constant_folding=True, verbose=False,
        )  # fmt: skip


def _tensor_bytes(module: nn.Module) -> int:
    """Bytes of the module's parameters and buffers (each shared tensor once)."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def _check_written(path: Path, external_data: bool | None, want: bool) -> onnx.ModelProto:
    """Check the written file by path (the checker cannot take a proto over 2 GiB) and return its graph, weights
    not loaded; move embedded weights out when external data is ``want``ed, refuse it when ``external_data`` is
    ``False``."""
    written = bool(data_files(path))
    if written and external_data is False:
        raise ExportError(f"the exporter wrote external data for {path.name}: the model is too large for one file; "
                          "pass external_data=None (automatic) or True")
    if want and not written:
        externalize(path)
    onnx.checker.check_model(str(path))
    return onnx.load(str(path), load_external_data=False)


def _output_names(module: nn.Module, example: Inputs, output_names: Sequence[str] | None) -> list[str]:
    """Run the module once and return one name per flattened output: by default the outputs' dict keys where the
    module returns a dict (a segmentation model's ``out``/``aux``, a Hugging Face ``ModelOutput``'s fields), else
    ``output`` or ``output_0``, ``output_1``, ..."""
    with torch.no_grad():
        paths = output_paths(call(module, example))
    count = len(paths)
    if output_names is None:
        if any(keyed for _, keyed in paths) and len({p for p, _ in paths}) == count:
            return [p for p, _ in paths]
        return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
    if len(output_names) != count:
        raise ValueError(f"{len(output_names)} output names given for {type(module).__name__} with {count} outputs")
    return list(output_names)


#: Errors of the file system, not of the model: the file cannot be written whichever exporter tries. A full disk or
#: quota counts wherever it struck (the exporter's temporary files share the disk); a permission or read-only error
#: only on a path in the output folder (elsewhere it may be the exporter's own, which the other exporter avoids).
_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_ACCESS_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def _write_failure(exc: BaseException | None, folder: Path) -> OSError | None:
    """The OSError of the file system behind ``exc`` or its causes (a context left out by ``raise ... from None``
    is not followed), if any: see :data:`_SPACE_ERRNOS` and :data:`_ACCESS_ERRNOS`."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _SPACE_ERRNOS:
            return exc
        if isinstance(exc, OSError) and exc.errno in _ACCESS_ERRNOS and exc.filename is not None \
                and Path(str(exc.filename)).resolve().is_relative_to(folder):
            return exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return None


def _write_error(path: str | Path, exc: OSError, module: nn.Module) -> ExportError:
    """One line naming the file that could not be written, why and what to do (:func:`write_error`'s words, or the
    staging's own one line), and what the weights alone need: a full disk is not an op the exporter does not
    support (the zoo's vit_l_16 said so when its disk filled)."""
    line = str(exc) if isinstance(exc, OutputWriteError) else str(write_error(Path(path), exc))
    return ExportError(f"{line} (the weights alone take {_tensor_bytes(module) / 2**20:.0f} MiB, and the exporter "
                       "stages a copy beside the file)")


def _export_error(
    module: nn.Module, example: Inputs, opset: int, errors: list[BaseException], outputs: list[str]
) -> ExportError:
    """Build the one-line error raised when both exporters failed (``outputs``: what each printed)."""
    op = _unsupported_op(*(ANSI_ESCAPE.sub("", str(e)) for e in reversed(errors)))
    where = _locate_op(module, example, op) if op else None
    culprit = f"op {op}" + (f" in submodule '{where}'" if where else "") if op else "the module"
    reasons = "; ".join(
        f"{name}: {_one_line(e, out)}" for name, e, out in zip(("dynamo", "torchscript"), errors, outputs)
    )
    return ExportError(
        f"cannot export {type(module).__name__} to ONNX opset {opset}: {culprit} is not supported ({reasons})"
    )


def to_onnx(
    module: nn.Module,
    example_input: Inputs,
    path: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    dynamic_batch: bool = True,
    dynamic_dims: Mapping[int, str] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    input_name: str = "input",
    output_names: Sequence[str] | None = None,
    external_data: bool | None = None,
) -> ExportResult:
    """Export a module to an ONNX file with a dynamic batch axis (weights beside it, for a large model).

    The module is exported in eval mode (its training flags are restored afterwards). The dynamo
    exporter is tried first, then the TorchScript exporter; the graph (and its data file) are written
    atomically (:func:`minreal.export.onnx_files.staged_onnx`).

    Parameters
    ----------
    module : nn.Module
        module taking one tensor (or, for :class:`~minreal.compress.core.inputs.NamedInputs`, one positional
        tensor per named input) and returning a tensor or a tuple/list/dict of tensors.
    example_input : Inputs
        an input of the right shape and dtype (any batch size, 1 included), or named inputs
        (their names become the graph input names, in order).
    path : str | Path
        destination ``.onnx`` file.
    opset : int
        default-domain opset to ask for (>= 17; the dynamo exporter writes at least 18).
    dynamic_batch : bool
        make axis 0 of every input (and outputs) dynamic, named ``"batch"``.
    dynamic_dims : Mapping[int, str] | None
        extra dynamic axes of a one-tensor input (or of the first named input), e.g. ``{1: "seq"}``.
    dynamic_axes : Mapping[str, Mapping[int, str]] | None
        extra dynamic axes by input name, e.g. ``{"input_ids": {1: "seq"}, "attention_mask":
        {1: "seq"}}``; one dimension name on several inputs is one dimension. Example sizes of a dynamic
        axis other than the batch should not be 1 (the exporter would specialise them).
    input_name : str
        graph input name of a one-tensor input.
    output_names : Sequence[str] | None
        graph output names (default ``output`` or ``output_0``, ``output_1``, ...).
    external_data : bool | None
        keep the weights in ``PATH.data`` beside the graph (ONNX external data, location relative
        to the graph): ``None`` (default) when parameters and buffers exceed :data:`EXTERNAL_DATA_BYTES` or
        the exporter needs it, ``True`` always, ``False`` never (a model too large for one file then fails).

    Returns
    -------
    ExportResult
        An :class:`ExportResult` naming the exporter used and why the first one failed, if it did.

    Raises
    ------
    ValueError
        bad opset, axes or names.
    ExportError
        neither exporter could convert the module (names the op and submodule).
    """
    if opset < MIN_OPSET:
        raise ValueError(f"opset {opset} is below the supported minimum {MIN_OPSET}")
    if not Path(path).parent.is_dir():
        raise ValueError(f"output folder {Path(path).parent} does not exist; create it first")
    axes = graph_axes(example_input, dynamic_batch, dynamic_dims, dynamic_axes, input_name)
    errors: list[BaseException] = []
    outputs: list[str] = []
    want = external_data if external_data is not None else _tensor_bytes(module) > EXTERNAL_DATA_BYTES
    with eval_mode(module):
        names = (input_names(example_input, input_name), _output_names(module, example_input, output_names))
        for exporter, run in (("dynamo", _export_dynamo), ("torchscript", _export_torchscript)):
            printed = Captured()
            try:
                with staged_onnx(path) as staged:
                    with captured_output() as printed:
                        run(module, example_input, staged, opset, axes, names, external=want)
                    model = _check_written(staged, external_data, want)
                    _check_inputs(model, names[0], exporter)
                    _check_axes(model, axes, exporter)
                break
            except Exception as exc:
                if (written := _write_failure(exc, Path(path).resolve().parent)) is not None:  # nor can the other
                    raise _write_error(path, written, module) from exc
                reason = _one_line(exc, printed.text)
                logger.info("%s exporter failed for %s: %s", exporter, type(module).__name__, reason)
                errors.append(exc)
                outputs.append(printed.text)
            finally:
                _log_printed(exporter, printed.text)
        else:
            raise _export_error(module, example_input, opset, errors, outputs) from errors[-1]
    return _result(Path(path), exporter, model, opset, names, axes, errors, outputs)


def _check_inputs(model: onnx.ModelProto, names: list[str], exporter: str) -> None:
    """Every input must survive as a graph input (an exporter drops an input the graph does not use)."""
    graph = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if graph != names:
        raise ExportError(f"the {exporter} exporter wrote graph inputs {graph}, expected {names} (an input the model "
                          "does not use is dropped); every named input must be used by the model")


def _check_axes(model: onnx.ModelProto, axes: Axes, exporter: str) -> None:
    """Every axis asked to be dynamic must be a named dimension of its graph input: an exporter that fixed one (the
    model's code needs that size, or torch.export specialised a size of 1) wrote a file that runs at that size only."""
    inputs = {i.name: i for i in model.graph.input}
    for name, per_input in axes.items():
        dims = inputs[name].type.tensor_type.shape.dim if name in inputs else []
        for axis, dim in sorted(per_input.items()):
            if axis < len(dims) and not dims[axis].dim_param and dims[axis].HasField("dim_value"):
                raise ExportError(f"the {exporter} exporter fixed dynamic dimension {dim!r} (axis {axis} of input "
                                  f"{name!r}) at {dims[axis].dim_value}: the model needs that size there (its code, "
                                  "a torch.export program's guards, or a size of 1, which torch.export specialises); "
                                  "keep that axis static, or, for a size of 1, export from data where it is larger")


def _log_printed(exporter: str, text: str) -> None:
    """Send what an exporter printed to the debug log (it never reaches stdout/stderr)."""
    if text.strip():
        logger.debug("%s exporter printed:\n%s", exporter, text.rstrip())


def _result(
    path: Path,
    exporter: str,
    model: onnx.ModelProto,
    opset: int,
    names: Names,
    axes: Axes,
    errors: list[BaseException],
    outputs: list[str],
) -> ExportResult:
    """Assemble the :class:`ExportResult` for a written file."""
    written = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    reason = _one_line(errors[0], outputs[0]) if errors else None
    if reason:
        logger.warning("exported with the TorchScript exporter; dynamo failed: %s", reason)
    return ExportResult(
        path=str(path), exporter=exporter, opset=written, requested_opset=opset, input_name=names[0][0],
        output_names=names[1], dynamic_dims=axes[names[0][0]], fallback_reason=reason, num_nodes=len(model.graph.node),
        file_size_bytes=path.stat().st_size, input_names=names[0], dynamic_axes=axes,
        data_files=[str(f) for f in data_files(path)], total_size_bytes=onnx_size(path),
    )  # fmt: skip
