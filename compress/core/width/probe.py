"""Values of chosen graph nodes on given inputs, from a traced model (for statistics at state points)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx

from ..inputs import args_of

__all__ = ["capture", "channels_last", "visit"]


class _Probe(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, wanted: set[str], seen: Callable[[str, Any], None]) -> None:
        super().__init__(gm)
        self.wanted, self.seen = wanted, seen

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.wanted:
            self.seen(n.name, out)
        return out


def visit(gm: fx.GraphModule, x: torch.Tensor, nodes: Iterable[str], seen: Callable[[str, Any], None]) -> None:
    """Run ``gm`` on ``x`` (no gradients, eval mode) and call ``seen(name, value)`` on each of ``nodes`` as soon as
    it is computed (before any later in-place operation can change it): a statistic reduced there holds no copy of
    the value (:func:`capture` keeps a copy of every one until the run ends).

    The traced module's node names are those of :func:`~minreal.compress.core.width.analysis.analyse` (a deep copy made
    with :func:`copy.deepcopy` keeps them), so a resized copy can be probed at the same points.
    """
    probe = _Probe(gm, set(nodes), seen)
    modes = {m: m.training for m in gm.modules()}
    gm.eval()  # statistics are of the model as deployed; BatchNorm running stats stay untouched
    try:
        with torch.no_grad():
            probe.run(*args_of(x))
    finally:
        for m, mode in modes.items():
            m.training = mode


def capture(gm: fx.GraphModule, x: torch.Tensor, nodes: Iterable[str]) -> dict[str, torch.Tensor]:
    """Run ``gm`` on ``x`` (no gradients, eval mode) and return the values of ``nodes`` by name (copies: a later
    in-place operation must not change what was captured); see :func:`visit`."""
    found: dict[str, Any] = {}

    def keep(name: str, out: Any) -> None:
        found[name] = out.clone() if isinstance(out, torch.Tensor) else out

    visit(gm, x, nodes, keep)
    return found


def channels_last(value: torch.Tensor, dim: int) -> torch.Tensor:
    """``value`` as a ``[samples, channels]`` matrix: the channel dimension last, every other one a sample."""
    return value.movedim(dim, -1).reshape(-1, value.shape[dim])
