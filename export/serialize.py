"""Saving compressed modules in a form that loads without unpickling code: a torch.export program."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from export.atomic import atomic_path

__all__ = ["save_program"]


def save_program(module: nn.Module, example: torch.Tensor, path: Path,
                 dynamic_dims: Mapping[int, str] | None = None) -> Path:
    """``torch.export`` ``module`` with a dynamic batch (and ``dynamic_dims``), saved atomically as ``.pt2``."""
    module = module.eval()
    dims = {0: torch.export.Dim("batch", min=1)}
    dims.update({axis: torch.export.Dim(name, min=1) for axis, name in (dynamic_dims or {}).items()})
    shapes = (dims,)
    example = torch.cat([example, example]) if example.shape[0] == 1 else example
    program = torch.export.export(module, (example,), dynamic_shapes=shapes)
    with atomic_path(path) as tmp, warnings.catch_warnings():
        # torch warns about tied tensors ("No complete tensor found in the group") on CPU-only weights.
        warnings.filterwarnings("ignore", message="No complete tensor found")
        torch.export.save(program, tmp)
    return path
