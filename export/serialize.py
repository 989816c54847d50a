"""Saving compressed modules in a form that loads without unpickling code: a torch.export program."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from export.atomic import atomic_path

__all__ = ["save_program"]


def save_program(module: nn.Module, example: torch.Tensor, path: Path) -> Path:
    """``torch.export`` ``module`` with a dynamic batch and save it atomically as ``.pt2``."""
    module = module.eval()
    batch = torch.export.Dim("batch", min=1)
    shapes = ({0: batch},)
    example = torch.cat([example, example]) if example.shape[0] == 1 else example
    program = torch.export.export(module, (example,), dynamic_shapes=shapes)
    with atomic_path(path) as tmp:
        torch.export.save(program, tmp)
    return path
