"""torch → ONNX export with a dynamic batch axis.

The torch.export-based exporter (``torch.onnx.export(..., dynamo=True)``) is tried first; if it
fails, the TorchScript exporter (``dynamo=False``) is tried, and the result records which one wrote
the file and the first exporter's error in one line.

Measured here (torch 2.14.1, onnxscript 0.7.2, offline): the dynamo exporter handles small MLPs and
CNNs with a dynamic batch (example batch 1 included) at opsets 18-23; asked for opset 17 it still
writes opset 18, its minimum. It fails on data-dependent control flow (``if x.sum() > 0``), where the
TorchScript exporter traces one branch. Hence ``DEFAULT_OPSET = 18``.

Both exporters print to stdout/stderr (progress lines, graph dumps, C++ "Torch IR graph at
exception" logs). Each exporter call runs inside :func:`export.quiet.captured_output`, which
captures Python and file-descriptor output, so ``--json`` output stays clean and ``-q`` is quiet;
the captured text goes to the debug log.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch import nn

from compress.core.evaluate import eval_mode
from export.atomic import atomic_path
from export.errors import ExportError
from export.quiet import Captured, captured_output
from runtime_bench.facts import ANSI_ESCAPE, first_line

__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "ExportResult", "eval_mode", "flatten_outputs", "to_onnx"]

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 18
"""Opset asked for by default: the lowest one the dynamo exporter writes."""

MIN_OPSET = 17
"""Lowest opset accepted (LayerNormalization is standard from 17)."""

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

    Attributes:
        path: the ONNX file (weights embedded, no external data).
        exporter: ``"dynamo"`` (torch.export-based) or ``"torchscript"``.
        opset: default-domain opset of the written file (may exceed ``requested_opset``).
        requested_opset: opset asked for.
        input_name: name of the single graph input.
        output_names: names of the graph outputs, in the module's output order.
        dynamic_dims: input axis → symbolic name of every dynamic axis.
        fallback_reason: one line: why the dynamo exporter was not used (``None`` if it was).
        num_nodes: nodes in the main graph.
        file_size_bytes: size of the written file.
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


def flatten_outputs(outputs: object) -> list[torch.Tensor]:
    """Return a module's output(s) as a flat list of tensors (tensor, or tuple/list/dict of them)."""
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, Mapping):
        outputs = list(outputs.values())
    if isinstance(outputs, (tuple, list)):
        return [t for item in outputs for t in flatten_outputs(item)]
    raise TypeError(f"module output of type {type(outputs).__name__} is not a tensor or a tuple/list/dict of tensors")


def _dynamic_axes(ndim: int, dynamic_batch: bool, dynamic_dims: Mapping[int, str] | None) -> dict[int, str]:
    """Validate and merge the batch axis with the caller's extra dynamic axes."""
    axes = {0: "batch"} if dynamic_batch else {}
    for axis, name in (dynamic_dims or {}).items():
        if not 0 <= axis < ndim:
            raise ValueError(f"dynamic axis {axis} ({name!r}) is outside the {ndim}-d example input")
        if not name.isidentifier():
            raise ValueError(f"dynamic axis name {name!r} is not a Python identifier")
        axes[axis] = name
    if len(set(axes.values())) != len(axes):
        raise ValueError(f"dynamic axis names must be distinct, got {axes}")
    return dict(sorted(axes.items()))


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


def _locate_op(module: nn.Module, example: torch.Tensor, op: str) -> str | None:
    """Return the qualified name of the submodule that calls ``op`` (best effort, via torch.export)."""
    try:
        with captured_output():
            program = torch.export.export(module, (example,), strict=False)
    except Exception:  # noqa: BLE001 - locating is a courtesy; the export error is raised anyway
        return None
    for node in program.graph.nodes:
        target = getattr(node.target, "name", None)
        if node.op == "call_function" and callable(target) and target() == op:
            stack = node.meta.get("nn_module_stack") or {}
            path = list(stack.values())[-1][0] if stack else ""
            return path or "<root>"
    return None


def _export_dynamo(
    module: nn.Module, example: torch.Tensor, path: Path, opset: int, axes: dict[int, str], names: tuple[str, list[str]]
) -> None:
    """Export with the torch.export-based exporter; weights embedded in the file."""
    shapes = ({axis: torch.export.Dim(name) for axis, name in axes.items()},) if axes else None
    torch.onnx.export(
        module, (example,), str(path), dynamo=True, opset_version=opset, dynamic_shapes=shapes,
        input_names=[names[0]], output_names=names[1], external_data=False, verbose=False,
    )  # fmt: skip


def _export_torchscript(
    module: nn.Module, example: torch.Tensor, path: Path, opset: int, axes: dict[int, str], names: tuple[str, list[str]]
) -> None:
    """Export with the legacy TorchScript exporter (``dynamic_axes``; batch marked on outputs too)."""
    dynamic_axes: dict[str, dict[int, str]] = {names[0]: dict(axes)} if axes else {}
    if 0 in axes:
        dynamic_axes.update({name: {0: axes[0]} for name in names[1]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, torch.jit.TracerWarning))
        torch.onnx.export(
            module, (example,), str(path), dynamo=False, opset_version=opset, input_names=[names[0]],
            output_names=names[1], dynamic_axes=dynamic_axes or None, do_constant_folding=True, verbose=False,
        )  # fmt: skip


def _check_embedded(path: Path) -> onnx.ModelProto:
    """Load and check the written file; raise if any initializer points at external data."""
    model = onnx.load(str(path), load_external_data=False)
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise ExportError(f"exporter wrote external data for {external[0]!r}; the model is too large for one file")
    onnx.checker.check_model(model)
    return model


def _output_names(module: nn.Module, example: torch.Tensor, output_names: Sequence[str] | None) -> list[str]:
    """Run the module once and return one name per flattened output."""
    with torch.no_grad():
        count = len(flatten_outputs(module(example)))
    if output_names is None:
        return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
    if len(output_names) != count:
        raise ValueError(f"{len(output_names)} output names given for {type(module).__name__} with {count} outputs")
    return list(output_names)


def _export_error(
    module: nn.Module, example: torch.Tensor, opset: int, errors: list[BaseException], outputs: list[str]
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
    example_input: torch.Tensor,
    path: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    dynamic_batch: bool = True,
    dynamic_dims: Mapping[int, str] | None = None,
    input_name: str = "input",
    output_names: Sequence[str] | None = None,
) -> ExportResult:
    """Export a one-input module to a single ONNX file with a dynamic batch axis.

    The module is exported in eval mode (its training flags are restored afterwards). The dynamo
    exporter is tried first, then the TorchScript exporter; the file is written atomically.

    Args:
        module: module taking one tensor and returning a tensor or a tuple/list/dict of tensors.
        example_input: an input of the right shape and dtype (any batch size, 1 included).
        path: destination ``.onnx`` file.
        opset: default-domain opset to ask for (>= 17; the dynamo exporter writes at least 18).
        dynamic_batch: make axis 0 of the input (and outputs) dynamic, named ``"batch"``.
        dynamic_dims: extra dynamic input axes, e.g. ``{1: "seq"}`` for a sequence model.
        input_name: graph input name.
        output_names: graph output names (default ``output`` or ``output_0``, ``output_1``, ...).

    Returns:
        An :class:`ExportResult` naming the exporter used and why the first one failed, if it did.

    Raises:
        ValueError: bad opset, axes or names.
        ExportError: neither exporter could convert the module (names the op and submodule).
    """
    if opset < MIN_OPSET:
        raise ValueError(f"opset {opset} is below the supported minimum {MIN_OPSET}")
    if not Path(path).parent.is_dir():
        raise ValueError(f"output folder {Path(path).parent} does not exist; create it first")
    axes = _dynamic_axes(example_input.dim(), dynamic_batch, dynamic_dims)
    errors: list[BaseException] = []
    outputs: list[str] = []
    with eval_mode(module):
        names = (input_name, _output_names(module, example_input, output_names))
        for exporter, run in (("dynamo", _export_dynamo), ("torchscript", _export_torchscript)):
            printed = Captured()
            try:
                with atomic_path(path) as tmp:
                    with captured_output() as printed:
                        run(module, example_input, tmp, opset, axes, names)
                    model = _check_embedded(tmp)
                break
            except Exception as exc:  # noqa: BLE001 - any exporter failure triggers the fallback
                reason = _one_line(exc, printed.text)
                logger.info("%s exporter failed for %s: %s", exporter, type(module).__name__, reason)
                errors.append(exc)
                outputs.append(printed.text)
            finally:
                _log_printed(exporter, printed.text)
        else:
            raise _export_error(module, example_input, opset, errors, outputs) from errors[-1]
    return _result(Path(path), exporter, model, opset, names, axes, errors, outputs)


def _log_printed(exporter: str, text: str) -> None:
    """Send what an exporter printed to the debug log (it never reaches stdout/stderr)."""
    if text.strip():
        logger.debug("%s exporter printed:\n%s", exporter, text.rstrip())


def _result(
    path: Path,
    exporter: str,
    model: onnx.ModelProto,
    opset: int,
    names: tuple[str, list[str]],
    axes: dict[int, str],
    errors: list[BaseException],
    outputs: list[str],
) -> ExportResult:
    """Assemble the :class:`ExportResult` for a written file."""
    written = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    reason = _one_line(errors[0], outputs[0]) if errors else None
    if reason:
        logger.warning("exported %s with the TorchScript exporter; dynamo failed: %s", path.name, reason)
    return ExportResult(
        path=str(path), exporter=exporter, opset=written, requested_opset=opset, input_name=names[0],
        output_names=names[1], dynamic_dims=axes, fallback_reason=reason, num_nodes=len(model.graph.node),
        file_size_bytes=path.stat().st_size,
    )  # fmt: skip
