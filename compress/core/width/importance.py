"""Channel importance per group, summed over the group's members (the pruning baselines' criteria)."""

from __future__ import annotations

import torch
from torch import fx

from ..distributed import all_reduce_sum, shard
from ..inputs import Inputs
from .graph import ChannelGroup, Use, WidthGraph, param_owner
from .probe import channels_last, visit
from .tracing import activation_batch

__all__ = ["magnitude_importance", "wanda_importance"]


def _param(gm: fx.GraphModule, use: Use) -> torch.Tensor:
    owner, attr = param_owner(gm, use.target, use.param)
    return getattr(owner, attr).detach().double()


def _per_atom(wg: WidthGraph, group: ChannelGroup, use: Use, per_position: torch.Tensor) -> torch.Tensor:
    index = {a: i for i, a in enumerate(group.atoms)}
    atoms = torch.tensor([index[wg.find(s)] for s in use.slots])
    return torch.zeros(group.size, dtype=torch.float64).index_add_(0, atoms, per_position)


def magnitude_importance(wg: WidthGraph, group: ChannelGroup) -> torch.Tensor:
    """L1 norm of every weight row writing each channel (Li et al. 2017, "Pruning filters for efficient
    ConvNets", §3.1), summed over all producers in the group — a residual stream's channel sums the filters of
    every block that adds into it. Groups without dense producers (attention heads, depthwise-only groups) use
    their per-channel weight rows instead."""
    weights = [u for u in group.uses if u.role == "producer" and "weight" in u.param]
    if not weights:
        weights = [u for u in group.uses if u.role == "affine" and "weight" in u.param
                   and _param(wg.gm, u).dim() > 1]
    total = torch.zeros(group.size, dtype=torch.float64)
    for u in weights:
        w = _param(wg.gm, u).movedim(u.dim, 0)
        total += _per_atom(wg, group, u, w.reshape(w.shape[0], -1).abs().sum(1))
    return total


def wanda_importance(wg: WidthGraph, groups: list[ChannelGroup], x: Inputs,
                     batch_size: int | None = None) -> dict[str, torch.Tensor]:
    """Wanda (Sun et al. 2023, eq. 1: ``S_ij = |W_ij|·‖X_j‖₂``) summed over each channel's outgoing weights in
    every dense consumer of the group: ``S_c = Σ_consumers ‖X_c‖₂ · Σ_i |W[i, c]|`` with ``X_c`` the channel's
    values (all samples and positions) where that consumer reads them. Groups without dense consumers fall
    back to :func:`magnitude_importance`. ``batch_size``: samples a pass, default 256 or fewer where the
    activations are large (:func:`~minreal.compress.core.width.tracing.activation_batch`)."""
    sources = sorted({u.source for g in groups for u in g.uses if u.role == "consumer"})
    squares: dict[str, torch.Tensor] = {}

    def add(node: str, value: torch.Tensor) -> None:  # reduced as the value is computed: no copy of it is held
        sq = channels_last(value.double(), wg.values[node].dim).pow(2).sum(0)
        squares[node] = squares[node] + sq if node in squares else sq

    x = shard(x)  # under torch.distributed: this rank's samples; the sums of squares are all-reduced below
    step = batch_size or activation_batch(wg.gm, 256, copy_to=torch.float64)
    for start in range(0, len(x), step):
        visit(wg.gm, x[start:start + step], sources, add)
    for node in sources:  # same order on every rank: the collectives pair up
        if node in squares:
            all_reduce_sum(squares[node])
    out: dict[str, torch.Tensor] = {}
    for g in groups:
        consumers = [u for u in g.uses if u.role == "consumer"]
        if not consumers:
            out[g.name] = magnitude_importance(wg, g)
            continue
        total = torch.zeros(g.size, dtype=torch.float64)
        for u in consumers:
            norms = squares[u.source].sqrt()
            w = _param(wg.gm, u).movedim(u.dim, 0)
            total += _per_atom(wg, g, u, norms * w.reshape(w.shape[0], -1).abs().sum(1))
        out[g.name] = total
    return out
