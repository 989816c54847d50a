"""Saving compressed modules in a form that loads without unpickling code: a torch.export program."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

from minreal.compress.core.inputs import Inputs, NamedInputs, args_of, takes_varargs
from minreal.export.errors import ExportError
from minreal.export.quiet import captured_output
from minreal.facts import error_line
from minreal.runtime_bench.atomic import atomic_path

__all__ = ["export_dims", "foreign_output_types", "save_program", "synthetic_example"]

log = logging.getLogger(__name__)


def synthetic_example(example: torch.Tensor, rows: int = 2, seed: int = 0) -> torch.Tensor:
    """A fresh tensor shaped like ``rows`` samples of ``example``, holding none of its values.

    A program saved by ``torch.export.save`` stores its example inputs. Saving a slice of the calibration
    data would ship that data (a view keeps the whole storage), so the example is seeded random normal data
    for floating inputs and zeros for integer inputs (always a valid index), in ``example``'s dtype.
    """
    shape = (rows, *example.shape[1:])
    if example.is_floating_point():
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(example.dtype)
    return torch.zeros(shape, dtype=example.dtype)


def export_dims(axes: Mapping[str, Mapping[int, str]], names: list[str], module: nn.Module,
                min_size: int | None = None) -> tuple | None:
    """torch.export dynamic shapes, one dict per input; one ``Dim`` object per dimension name (shared). A
    ``forward(*inputs)`` (:class:`~minreal.compress.core.inputs.PackedInputs`) gets them nested in one more tuple."""
    if not any(axes.values()):
        return None
    made: dict[str, torch.export.Dim] = {}
    bounds = {} if min_size is None else {"min": min_size}
    dim = lambda name: made.setdefault(name, torch.export.Dim(name, **bounds))  # noqa: E731
    shapes = tuple({axis: dim(d) for axis, d in axes.get(n, {}).items()} for n in names)
    return (shapes,) if takes_varargs(module) else shapes


@contextlib.contextmanager
def _no_suffix_warning() -> Iterator[None]:
    """Drop torch's log line about a program file name without ``.pt2`` (the name is the user's choice)."""
    package_log = logging.getLogger("torch.export.pt2_archive._package")
    drop = logging.Filter()
    drop.filter = lambda record: (  # type: ignore[method-assign]
        not record.getMessage().startswith("Expect archive file"))
    package_log.addFilter(drop)
    try:
        yield
    finally:
        package_log.removeFilter(drop)


def _traced_program(module: nn.Module, example: tuple, shapes: tuple | None,
                    path: Path) -> torch.export.ExportedProgram:
    """``torch.export`` of ``module``, or one line saying why it cannot be a program with a dynamic batch. When a
    data-dependent value defeats torch's shape solver, torch logs a warning and prints the graph to stderr (twice)
    before raising: that output is held back and the one-line error says what matters; after a successful trace it
    is written out as it came."""
    try:
        with captured_output() as held:
            program = torch.export.export(module, example, dynamic_shapes=shapes)
    except Exception as exc:  # torch.export raises many types (UserError, GuardOnDataDependentSymNode, ...)
        raise ExportError(
            f"cannot save {type(module).__name__} as the program {path.name}: torch.export could not trace its "
            f"forward with a dynamic batch ({error_line(exc, with_type=True, max_chars=160)}); a forward whose "
            "shapes or branches depend on the values of the data (a detection model's post-processing, .item(), "
            "nonzero) cannot be one program: compress a module without that step (its backbone and heads)") from exc
    sys.stderr.write(held.text)
    return program


def foreign_output_types(program: torch.export.ExportedProgram) -> list[str]:
    """The output container types of ``program`` that torch does not know by itself (a Hugging Face
    ``ModelOutput``): their package registers them with torch's pytree when imported, so a process that loads the
    program without importing that package (``minreal export``: a program file never imports code) cannot rebuild
    its outputs. Qualified names, in the order the outputs hold them, each once."""
    found: dict[str, None] = {}
    pending = [program.call_spec.out_spec]
    while pending:
        spec = pending.pop(0)
        kind = spec.type
        if kind is not None and kind.__module__ not in ("builtins", "collections") \
                and not kind.__module__.startswith("torch."):  # torch registers its own (fx's immutable_dict)
            found[f"{kind.__module__}.{kind.__qualname__}"] = None
        pending.extend(spec.children())
    return list(found)


def save_program(module: nn.Module, example: Inputs, path: Path, dynamic_dims: Mapping[int, str] | None = None,
                 dynamic_axes: Mapping[str, Mapping[int, str]] | None = None) -> Path:
    """``torch.export`` ``module`` with a dynamic batch (and ``dynamic_dims`` of a one-tensor input, or
    ``dynamic_axes`` by input name), saved atomically as ``.pt2``.

    ``example`` only gives the per-sample shapes and dtypes: the program stores a synthetic two-row example
    (:func:`synthetic_example`), never the caller's data.
    """
    module = module.eval()
    names = example.names if isinstance(example, NamedInputs) else ["input"]
    axes = {n: {0: "batch", **dict((dynamic_axes or {}).get(n, {}))} for n in names}
    axes[names[0]].update(dynamic_dims or {})
    shapes = export_dims(axes, names, module, min_size=1)
    fresh = tuple(synthetic_example(t) for t in args_of(example))
    program = _traced_program(module, fresh, shapes, path)
    if foreign := foreign_output_types(program):
        log.warning("%s returns %s, an output type its package registers with torch on import: `minreal export` "
                    "(which imports no code from a program) cannot load it; return tensors in tuples, lists or "
                    "dicts (e.g. wrap a Hugging Face model to return dict(outputs), as hf:FAMILY does)",
                    path.name, ", ".join(foreign))
    with atomic_path(path) as tmp, tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as work, \
            warnings.catch_warnings(), _no_suffix_warning():
        # torch warns about tied tensors ("No complete tensor found in the group") on CPU-only weights.
        warnings.filterwarnings("ignore", message="No complete tensor found")
        staged = Path(work) / path.name  # torch names the archive's top folder after the file: keep the real name
        torch.export.save(program, staged)
        os.replace(staged, tmp)
    return path
