"""Feature matching for the recovery: the student also matches the teacher's intermediate features at named state
points, each term an MSE normalised by the teacher feature's variance so that points of different scale weigh alike.
Only points whose outputs keep their shape are matched (no regressor).

References
----------
Romero, A., et al. (2015). FitNets: Hints for Thin Deep Nets, eq. 3 (here without a regressor).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .evaluate import eval_mode

__all__ = ["feature_points"]


class _FeatureMatch:
    """Forward hooks recording the outputs of the same named modules in teacher and student (while entered)."""

    def __init__(self, teacher: nn.Module, student: nn.Module, points: list[str]) -> None:
        self.points, self.nets = points, (teacher, student)
        self.outputs: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] = ({}, {})
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> "_FeatureMatch":
        for net, store in zip(self.nets, self.outputs):
            modules = dict(net.named_modules())
            for name in self.points:
                self.handles.append(modules[name].register_forward_hook(
                    lambda _m, _i, out, name=name, store=store: store.__setitem__(name, out)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def loss(self) -> torch.Tensor:
        """Mean over the points of MSE(student, teacher) / Var(teacher) on the last forward of each net."""
        teacher, student = self.outputs
        terms = [F.mse_loss(student[n], teacher[n].detach()) / (teacher[n].detach().var() + 1e-12)
                 for n in self.points]
        return torch.stack(terms).mean()


@torch.no_grad()
def feature_points(teacher: nn.Module, student: nn.Module, names: list[str], probe: torch.Tensor
                   ) -> tuple[list[str], dict[str, str]]:
    """(points to match, {skipped point: reason}): the names present in both models whose outputs are single
    tensors of equal shape on ``probe``."""
    have = [dict(teacher.named_modules()), dict(student.named_modules())]
    present = [n for n in names if n and all(n in h for h in have)]
    skipped = {n: "not a submodule of both models" for n in names if n not in present}
    if not present:
        return [], skipped
    with eval_mode(teacher), eval_mode(student), _FeatureMatch(teacher, student, present) as fm:
        teacher(probe)
        student(probe)
    kept = []
    for n in present:
        t, s = fm.outputs[0].get(n), fm.outputs[1].get(n)
        if not (isinstance(t, torch.Tensor) and isinstance(s, torch.Tensor)):
            skipped[n] = "output is not a single tensor (or the module did not run)"
        elif t.shape != s.shape:
            skipped[n] = f"output shape differs ({tuple(t.shape)} vs {tuple(s.shape)})"
        else:
            kept.append(n)
    return kept, skipped
