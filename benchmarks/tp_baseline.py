"""Torch-Pruning's own pruner as a registered method for the width benchmarks (benchmarks only; not a dependency
of minreal): MetaPruner with group L1 magnitude importance, its pruning ratio bisected to a whole-model MAC ratio.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.options import CostBudget
from minreal.compress.core.report import CompressionReport
from minreal.compress.core.spec import MethodSpec

__all__ = ["TorchPruningConfig", "torch_pruning_spec"]


@dataclass
class TorchPruningConfig(CostBudget):
    """Torch-Pruning's MetaPruner (group L1 magnitude importance) at a whole-model MAC ratio."""


def torch_pruning_spec(ignored: Callable[[nn.Module], list[nn.Module]], round_to: int, samples: int = 2,
                       steps: int = 12, note: str = "") -> MethodSpec:
    """A ``torch_pruning`` method: ``ignored(model)`` lists the layers DepGraph must leave whole; channel counts
    rounded to ``round_to``; ``steps`` bisection steps on the pruning ratio until the MACs meet the target (the
    smallest model reached when none does, with a note)."""

    def run(model: nn.Module, data: Dataset, cfg: TorchPruningConfig) -> tuple[nn.Module, CompressionReport]:
        import torch_pruning as tp

        report = CompressionReport("torch_pruning", asdict(cfg))
        x = data.x[:samples]
        full = tp.utils.count_ops_and_params(model, x)[0]
        target = (cfg.mac_ratio or 0.5) * full
        lo, hi, best, smallest = 0.0, 0.95, None, None
        for _ in range(steps):
            mid = (lo + hi) / 2
            m = copy.deepcopy(model).eval().requires_grad_(True)  # DepGraph traces autograd: frozen weights hide it
            with torch.enable_grad():
                tp.pruner.MetaPruner(m, x, importance=tp.importance.GroupMagnitudeImportance(p=1),
                                     pruning_ratio=mid, ignored_layers=ignored(m), round_to=round_to).step()
            macs = tp.utils.count_ops_and_params(m, x)[0]
            if smallest is None or macs < smallest[1]:
                smallest = (m, macs)
            if macs <= target:
                best, hi = (m, macs), mid
            else:
                lo = mid
        if best is None:
            best = smallest
            report.notes.append(f"target MAC ratio {cfg.mac_ratio} not reached; smallest {smallest[1] / full:.3f}")
        if note:
            report.notes.append(note)
        report.predicted.extra["tp_mac_ratio"] = best[1] / full  # this benchmark's own key
        return best[0], report

    return MethodSpec("torch_pruning", "Torch-Pruning MetaPruner (benchmark baseline)", TorchPruningConfig, run,
                      budgets=("mac_ratio",))
