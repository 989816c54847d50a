"""Saving compressed modules in a form that loads without unpickling code: a torch.export program."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from compress.core.inputs import Inputs, NamedInputs, args_of
from export.atomic import atomic_path
from export.onnx_export import export_dims

__all__ = ["save_program", "synthetic_example"]


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
    program = torch.export.export(module, fresh, dynamic_shapes=shapes)
    with atomic_path(path) as tmp, tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as work, \
            warnings.catch_warnings():
        # torch warns about tied tensors ("No complete tensor found in the group") on CPU-only weights.
        warnings.filterwarnings("ignore", message="No complete tensor found")
        staged = Path(work) / path.name  # torch names the archive's top folder after the file: keep the real name
        torch.export.save(program, staged)
        os.replace(staged, tmp)
    return path
