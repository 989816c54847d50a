"""Reachability (Gc) and observability (Go) Gramians of channel groups: every cuttable group of the traced graph
(:mod:`minreal.compress.core.width`) is a state point whose state vector is the group's atoms.

Samples. A group's state points are the graph values its dense consumers read (``group.state_points()``). A
value is read as ``[samples, channels]`` (:func:`~minreal.compress.core.width.channels_last`: the batch and every
spatial or sequence position are samples) and each channel position is mapped to its atom
(``WidthGraph.channel_atoms``). An atom may occupy several positions of one value (after a flatten, or inside a
grouped convolution); the r-th occurrences of the atoms form *slice* r, so one sample row holds each present
atom once — the same rows on which :func:`~minreal.compress.core.width.apply_cuts` applies a merge. Atoms absent from a
value (the channels an option-A shortcut pads in later, say) are zero in its samples. The group's samples are
the union over state points and slices, zero-filled to all ``d = group.size`` atoms.

- Gc = (1/(S−1)) Σ_s (h_s − h̄)(h_s − h̄)ᵀ over those S samples, float64, accumulated per slice
  (:class:`~.empirical_gramians.Moments`) and combined exactly by the pairwise update of Chan, Golub &
  LeVeque (1979, "Updating formulae and a pairwise algorithm for computing sample variances"):
  h̄ = Σ_k n_k h̄_k / S, scatter = Σ_k [scatter_k + n_k (h̄_k − h̄)(h̄_k − h̄)ᵀ], slice quantities
  zero-filled.
- Go = (1/S') Σ_s J_sᵀ J_s, J_s = ∂z_n/∂h_s (z_n the outputs of the input n that sample s belongs to), over
  the S' samples of the ``go_samples`` subset; exact or by random output projections
  (:func:`~.empirical_gramians.output_directions`). Gradients flow through the traced module
  (an :class:`torch.fx.Interpreter` keeps the state values, safe from later in-place operations), so J at one state
  point includes every path from it to the outputs, through the group's later state points too.

Under a process group (:mod:`minreal.compress.core.distributed`) each rank runs its shard of the data; every slice's
moments are combined exactly (:meth:`~.empirical_gramians.Moments.all_reduce`) and Go's sums and sample counts
are all-reduced before the division.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ...core.data import Dataset
from ...core.distributed import all_reduce_sum, rank_seed, shard, sum_count
from ...core.errors import CompressionError, require_finite
from ...core.evaluate import eval_mode
from ...core.inputs import Inputs, args_of
from ...core.width import ChannelGroup, WidthGraph, channels_last
from .empirical_gramians import Moments, StateGramians, gram_sum, output_directions

__all__ = ["StateSlice", "state_slices", "group_state_samples", "select_groups", "group_gramians"]


@dataclass(frozen=True)
class StateSlice:
    """One slice of a state point: the value at ``node`` (channel dimension ``dim``), its channel ``positions``
    that hold the atoms ``atoms`` (indices into ``group.atoms``), one position per atom."""

    group: str
    node: str
    dim: int
    positions: torch.Tensor
    atoms: torch.Tensor

    def rows(self, value: torch.Tensor) -> torch.Tensor:
        """The slice's ``[samples, len(atoms)]`` rows of a value at its node."""
        return channels_last(value, self.dim)[:, self.positions]


def state_slices(wg: WidthGraph, group: ChannelGroup) -> list[StateSlice]:
    """Every slice of every state point of ``group`` (see the module docstring)."""
    out = []
    for node in group.state_points():
        atoms = wg.channel_atoms(group, node)
        seen: dict[int, int] = {}
        by_rank: dict[int, list[int]] = {}
        for p, a in enumerate(atoms):
            by_rank.setdefault(seen.get(a, 0), []).append(p)
            seen[a] = seen.get(a, 0) + 1
        for ps in by_rank.values():
            out.append(StateSlice(group.name, node, group.values[node], torch.tensor(ps),
                                  torch.tensor([atoms[p] for p in ps])))
    return out


def group_state_samples(wg: WidthGraph, group: ChannelGroup, values: dict[str, torch.Tensor]) -> torch.Tensor:
    """The group's zero-filled ``[samples, group.size]`` state matrix from captured ``values`` (node → value),
    stacked over its slices in :func:`state_slices` order (for inspection and tests; the Gramians stream)."""
    blocks = []
    for sl in state_slices(wg, group):
        rows = sl.rows(values[sl.node])
        full = rows.new_zeros(len(rows), group.size)
        full[:, sl.atoms] = rows
        blocks.append(full)
    return torch.cat(blocks)


def select_groups(wg: WidthGraph, names: Sequence[str] = ()) -> list[ChannelGroup]:
    """The groups to analyse: every cuttable group with a state point, or those ``names`` give — a group's name
    or the qualified name of a module whose output carries the group's channels."""
    if not names:
        return [g for g in wg.cuttable() if g.state_points()]
    outputs = {}
    for n in wg.gm.graph.nodes:
        if n.op == "call_module":
            outputs.setdefault(n.target, n.name)
    chosen: dict[str, ChannelGroup] = {}
    for name in names:
        group = next((g for g in wg.groups if g.name == name), None) or \
            next((g for g in wg.groups if outputs.get(name) in g.values), None)
        if group is None:
            raise CompressionError(f"state point {name!r} is neither a channel group nor a module writing one; "
                                   f"groups: {', '.join(g.name for g in wg.cuttable())}")
        if group not in wg.cuttable() or not group.state_points():
            raise CompressionError(f"state point {name!r} (channel group {group.name!r}) cannot be resized: "
                                   f"{group.frozen or 'no dense layer reads it'}")
        chosen.setdefault(group.name, group)
    return list(chosen.values())


class _Recorder(fx.Interpreter):
    """Runs the traced module and keeps the values of the wanted nodes, with their autograd history.

    The graph goes on with a copy of each kept value, so a later in-place operation (``out += x``, an in-place
    ReLU) cannot change what was kept, and gradients with respect to the kept value still reach it through the
    copy. (:func:`minreal.compress.core.width.capture` returns the live tensors and cannot give gradients.)
    """

    def __init__(self, gm: fx.GraphModule, wanted: Iterable[str]) -> None:
        super().__init__(gm)
        self.wanted, self.found = set(wanted), {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.wanted and isinstance(out, torch.Tensor):
            self.found[n.name] = out
            return out.clone()
        return out


def _leaves(xb: Inputs) -> list[torch.Tensor]:
    """Fresh copies of the inputs; floating ones require gradients (token ids cannot)."""
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in args_of(xb)]


def _flat_output(out: Any, n: int) -> torch.Tensor:
    parts = out if isinstance(out, (tuple, list)) else [out]
    return torch.cat([p.reshape(n, -1) for p in parts if isinstance(p, torch.Tensor)], 1)


def _gc(wg: WidthGraph, slices: list[StateSlice], data: Dataset, batch_size: int) -> list[Moments]:
    """Streaming moments of every slice's rows over ``data`` (one :class:`Moments` per slice, in order), combined
    over the ranks' shards under a process group."""
    nodes = {sl.node for sl in slices}
    moments = [Moments() for _ in slices]
    for xb in shard(data).inputs(batch_size):
        rec = _Recorder(wg.gm, nodes)
        with torch.no_grad():
            rec.run(*args_of(xb))
        for node in nodes:
            require_finite(rec.found[node], node, "output activations")
        for sl, m in zip(slices, moments):
            m.update(sl.rows(rec.found[sl.node]))
    for m in moments:
        m.all_reduce()
    return moments


def _combine(size: int, slices: list[StateSlice], moments: list[Moments]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Mean, covariance (1/(S−1)) and S of the zero-filled union of the slices' samples (module docstring)."""
    total = sum(m.n for m in moments)
    means = []
    for sl, m in zip(slices, moments):
        full = torch.zeros(size, dtype=torch.float64)
        full[sl.atoms] = m.mean
        means.append(full)
    mean = sum(m.n * mu for m, mu in zip(moments, means)) / total
    scatter = torch.zeros(size, size, dtype=torch.float64)
    for sl, m, mu in zip(slices, moments, means):
        idx = sl.atoms
        scatter[idx[:, None], idx] += m.scatter
        scatter += m.n * torch.outer(mu - mean, mu - mean)
    return mean, scatter / (total - 1), total


def _go(wg: WidthGraph, slices: list[StateSlice], sizes: dict[str, int], data: Dataset, max_exact_outputs: int,
        probes: int, batch_size: int, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, int], str]:
    """Per group Σ_s J_sᵀ J_s / S' (zero-filled slices), S' and the estimator used; sums and counts over the
    ranks' shards under a process group (probes seeded per rank)."""
    gen = torch.Generator().manual_seed(rank_seed(seed))
    nodes = sorted({sl.node for sl in slices})
    acc = {g: torch.zeros(d, d, dtype=torch.float64) for g, d in sizes.items()}
    count = dict.fromkeys(sizes, 0)
    method = "exact"
    for xb in shard(data).inputs(batch_size):
        rec = _Recorder(wg.gm, nodes)
        with torch.enable_grad():
            z = _flat_output(rec.run(*_leaves(xb)), len(xb))
            hs = [rec.found[n] for n in nodes]
            directions, method = output_directions(z, max_exact_outputs, probes, gen)
            for v in directions:
                grads = dict(zip(nodes, torch.autograd.grad(z, hs, grad_outputs=v, retain_graph=True,
                                                            allow_unused=True)))
                for sl in slices:
                    g = grads[sl.node]
                    if g is not None:
                        acc[sl.group][sl.atoms[:, None], sl.atoms] += gram_sum(sl.rows(g))
        for sl in slices:
            value = rec.found[sl.node]
            count[sl.group] += value.numel() // value.shape[sl.dim]
    for g, a in acc.items():
        all_reduce_sum(a)
        count[g] = sum_count(count[g])
        require_finite(a, g, "output-gradient products (observability Gramian)")
    return {g: acc[g] / max(count[g], 1) for g in sizes}, count, method


def group_gramians(wg: WidthGraph, groups: Sequence[ChannelGroup], data: Dataset, max_exact_outputs: int = 64,
                   probes: int = 16, go_samples: int | None = None, batch_size: int = 64, seed: int = 0
                   ) -> dict[str, StateGramians]:
    """Gc on all of ``data`` and Go on its first ``go_samples`` inputs for every group (module docstring).

    Parameters
    ----------
    wg : WidthGraph
        The analysis of the model (:func:`minreal.compress.core.width.analyse`); its traced module runs in eval mode.
    groups : sequence of ChannelGroup
        The groups to analyse (:func:`select_groups`).
    data : Dataset
        Calibration inputs.
    max_exact_outputs, probes : int
        Exact output Jacobians up to that many outputs, else that many random projections.
    go_samples : int, optional
        Inputs for Go (the costlier Gramian); default all.
    batch_size : int
        Inputs per forward pass.
    seed : int
        Seed of the projections.

    Returns
    -------
    dict of str to StateGramians
        Per group name: mean and Gc over the group's atoms, Go, the sample counts (inputs × positions × slices
        × state points) and how Go was obtained.
    """
    if len(data) < 2:
        raise CompressionError("the reachability Gramian needs at least 2 calibration samples")
    slices = [sl for g in groups for sl in state_slices(wg, g)]
    sizes = {g.name: g.size for g in groups}
    go_data = data if go_samples is None else data.take(min(go_samples, len(data)))
    with eval_mode(wg.gm):
        moments = _gc(wg, slices, data, batch_size)
        go, counts, method = _go(wg, slices, sizes, go_data, max_exact_outputs, probes, batch_size, seed)
    out = {}
    for g in groups:
        own = [(sl, m) for sl, m in zip(slices, moments) if sl.group == g.name]
        mean, gc, n = _combine(g.size, [sl for sl, _ in own], [m for _, m in own])
        out[g.name] = StateGramians(g.name, mean, gc, go[g.name], n, counts[g.name], method)
    return out
