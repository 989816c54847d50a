"""Values of chosen graph nodes on given inputs, from a traced model (for statistics at state points)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import fx

from ..inputs import args_of

__all__ = ["capture", "channels_last"]


class _Probe(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, wanted: set[str]) -> None:
        super().__init__(gm)
        self.wanted, self.found = wanted, {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.wanted:  # a copy: a later in-place operation must not change what was captured
            self.found[n.name] = out.clone() if isinstance(out, torch.Tensor) else out
        return out


def capture(gm: fx.GraphModule, x: torch.Tensor, nodes: Iterable[str]) -> dict[str, torch.Tensor]:
    """Run ``gm`` on ``x`` (no gradients, eval mode) and return the values of ``nodes`` by name.

    The traced module's node names are those of :func:`~minreal.compress.core.width.analysis.analyse` (a deep copy made
    with :func:`copy.deepcopy` keeps them), so a resized copy can be probed at the same points.
    """
    probe = _Probe(gm, set(nodes))
    modes = {m: m.training for m in gm.modules()}
    gm.eval()  # statistics are of the model as deployed; BatchNorm running stats stay untouched
    try:
        with torch.no_grad():
            probe.run(*args_of(x))
    finally:
        for m, mode in modes.items():
            m.training = mode
    return probe.found


def channels_last(value: torch.Tensor, dim: int) -> torch.Tensor:
    """``value`` as a ``[samples, channels]`` matrix: the channel dimension last, every other one a sample."""
    return value.movedim(dim, -1).reshape(-1, value.shape[dim])
