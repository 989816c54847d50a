"""ε-FDE lumping over the channel groups of any traceable model (groups and cuts from
:mod:`minreal.compress.core.width`).

An *atom* of a channel group (a channel kept or removed everywhere at once) gets its values wherever a layer
writes them: the rows of a dense conv/linear producing it (a BatchNorm right after it folded in:
``s = γ/√(var+ε)``, ``t = β − s·mean``), a standalone BatchNorm (scale ``s``, shift ``t``), a grouped or
depthwise conv's rows, a per-channel constant of an elementwise operation, and the zeros a channel pad writes
(option-A shortcuts). Two atoms are *equivalent* when they occur in the same graph values and parameter
dimensions equally often (same zero-pad slots included) and, at every writer, their rows agree within ε
relative to that writer's largest coefficient — a dense producer's input columns taken through its input
group's current merge ``W·M`` (the columns of a block summed into its leader's, each scaled by its ρ). This is
the lumping condition of forward differential equivalence (Cardelli et al. 2017, "Maximal aggregation of
polynomial dynamical systems", Def. 3) read on the traced graph: by induction over the graph order, equivalent
atoms carry equal values at every node, so merging each block into its leader (``Cut(keep=leaders, merge=M)``
with ``M[a, leader(a)] = ρ_a``; the merged channels' outgoing weights summed into every dense consumer) is
exact at ε = 0 on any input.

*Scaled* equivalence (``x_a = ρ_a·x_leader``, ρ > 0) needs every operation on the group's values positively
homogeneous (ReLU/LeakyReLU, pools, sums, concatenation, pads, reshapes, products with a constant): the parts
linear in the values (producer rows, biases, BN shifts, additive constants) are then compared by direction and
ρ is the ratio of their norms, while multiplicative parts (BN scales, grouped-conv kernels, constant factors)
must agree as they are. Groups with any other nonlinearity merge equal values only (ρ = 1).

The exact partition comes from refinement: start from the coarsest partition (atoms with the same occurrences
form one block) and split blocks until a sweep over all groups splits none and no ρ moves (partition refinement
to the greatest fixpoint, Cardelli, Tribastone, Tschaikowski & Vandin, POPL 2016); in each block the members
equal to the leader up to rounding stay and the others are clustered anew (:func:`~.partition.leader_clusters`).
A tolerance ε > 0 then merges blocks upward from the exact partition — leaders whose rows agree within ε, with
the inputs taken through the merges made so far — sweeping until no block merges (:class:`Lumper`).

Groups whose channels something mixes or the analysis does not fully track (LayerNorm over the channels,
attention heads, PReLU with per-channel slopes, BatchNorm without running statistics) are left whole, with
the reason; frozen groups (model input/output) are never cut.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import fx, nn

from ...core.chain import fold_bn_after
from ...core.distributed import all_reduce_max
from ...core.evaluate import eval_mode
from ...core.width import ChannelGroup, Cut, Use, WidthGraph, capture, channels_last, param_owner
from .partition import leader_clusters, rounding_tolerance

__all__ = ["MAX_EPS", "Writer", "GroupPlan", "Partition", "LumpStats", "Lumper", "plan_groups", "dead_atoms",
           "group_cuts", "blocks_of"]

#: Every writer's rows are normalised to [-1, 1], so rows differ by at most 2: at this tolerance every block of
#: atoms with the same occurrences merges (the coarsest reachable partition).
MAX_EPS = 2.0

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_DENSE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
_HOMOGENEOUS_MODULES = (nn.ReLU, nn.LeakyReLU, nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.MaxPool1d,
                        nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
                        nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.Flatten, nn.Upsample) + _BN + _DENSE
_HOMOGENEOUS_FUNCTIONS = {"relu", "relu_", "leaky_relu", "dropout", "dropout1d", "dropout2d", "max_pool1d",
                          "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                          "adaptive_max_pool1d", "adaptive_max_pool2d", "interpolate", "contiguous", "clone", "float",
                          "detach", "neg", "abs", "stochastic_depth", "cat", "concat", "pad", "flatten", "view",
                          "reshape", "permute", "transpose", "getitem", "mean", "sum", "amax", "amin"}
_ADD = {operator.add, operator.iadd, operator.sub, operator.isub, "add", "add_", "sub", "sub_"}
_MUL = {operator.mul, operator.imul, "mul", "mul_"}
_DIV = {operator.truediv, operator.itruediv, "div", "div_"}
SCALED, VALUE, WHOLE = "scaled", "value", "whole"


@dataclass
class Writer:
    """Rows that compute a group's channel values at one place.

    ``kind``: ``"dense"`` (a conv/linear's rows with its ``bias``, the BatchNorm ``bn`` folded after it and the
    consumer use ``source`` reading its input channels), ``"scale"``/``"shift"`` (a standalone BatchNorm ``bn``)
    or ``"rows"`` (a per-channel parameter). ``linear``: the part scales with the values (compared by direction
    in scaled mode) rather than having to agree as it is.
    """

    kind: str
    use: Use
    linear: bool = True
    bias: Use | None = None
    bn: str = ""
    source: Use | None = None


@dataclass
class _Positions:
    """Where each atom of a group occurs in one use: ``atoms[p]`` per position, ``rank[p]`` its occurrence number,
    ``at[a, r]`` the position of atom ``a``'s ``r``-th occurrence (−1 past its count)."""

    atoms: np.ndarray
    rank: np.ndarray
    at: np.ndarray


@dataclass
class GroupPlan:
    """How one group is lumped: ``mode`` (scaled, value or whole), why it is left whole, its writers, the
    positions of its atoms in each writer, and each atom's occurrence key (atoms with different keys never
    merge)."""

    group: ChannelGroup
    mode: str
    reason: str = ""
    writers: list[Writer] = field(default_factory=list)
    keys: list[tuple[int, ...]] = field(default_factory=list)


@dataclass
class Partition:
    """Per atom: its block's ``leader`` (itself for a leader, −1 when removed as dead) and ``rho`` with
    ``x_atom = rho · x_leader``."""

    leader: np.ndarray
    rho: np.ndarray

    @staticmethod
    def identity(n: int) -> "Partition":
        return Partition(np.arange(n), np.ones(n))


@dataclass
class LumpStats:
    """Sweeps (exact refinement, then merges at ε), blocks split by the refinement, blocks merged at ε."""

    sweeps: int = 0
    splits: int = 0
    merges: int = 0


@dataclass
class _Context:
    """What the refinement reads besides the partitions: the traced model, group of every atom, positions."""

    wg: WidthGraph
    plans: dict[str, GroupPlan]
    owner: dict[int, tuple[str, int]]  # root slot → (group name, atom index)
    positions: dict[int, _Positions] = field(default_factory=dict)  # id(use) → positions

    def where(self, use: Use) -> _Positions:
        key = id(use)
        if key not in self.positions:
            self.positions[key] = _positions(self, use)
        return self.positions[key]

    def group_of(self, use: Use) -> str:
        return self.owner[self.wg.find(use.slots[0])][0]


def _positions(ctx: _Context, use: Use) -> _Positions:
    atoms = np.array([ctx.owner[ctx.wg.find(s)][1] for s in use.slots], dtype=np.int64)
    n = ctx.plans[ctx.group_of(use)].group.size
    counts = np.zeros(n, dtype=np.int64)
    rank = np.zeros(len(atoms), dtype=np.int64)
    for p, a in enumerate(atoms):
        rank[p], counts[a] = counts[a], counts[a] + 1
    at = np.full((n, max(int(counts.max(initial=0)), 1)), -1, dtype=np.int64)
    at[atoms, rank] = np.arange(len(atoms))
    return _Positions(atoms, rank, at)


# ---- planning: modes, writers, occurrence keys ------------------------------------------------------------------

def _fn_name(node: fx.Node) -> object:
    return node.target if node.target in _ADD | _MUL | _DIV else getattr(node.target, "__name__", node.target)


def _operands(node: fx.Node) -> list[object]:
    return list(node.args) + list(node.kwargs.values())


def _homogeneous(node: fx.Node, modules: dict[str, nn.Module], values: dict[str, int],
                 constants: set[tuple[str, str]]) -> bool:
    """Whether ``node`` maps the group's values ``x`` to ``ρ·(its output)`` when they scale to ``ρ·x`` (ρ > 0)."""
    if node.op == "call_module":
        mod = modules[node.target]
        return isinstance(mod, _HOMOGENEOUS_MODULES) or (isinstance(mod, nn.PReLU) and mod.num_parameters == 1)
    name = _fn_name(node)
    ops = _operands(node)
    if name in _ADD:  # sums of the group's values and of per-channel constants (compared as linear parts)
        return all(isinstance(a, fx.Node) and (a.name in values or (node.name, a.target) in constants) for a in ops)
    if name in _MUL:
        return sum(isinstance(a, fx.Node) and a.name in values for a in ops) == 1
    if name in _DIV:
        return isinstance(ops[0], fx.Node) and ops[0].name in values and \
            not any(isinstance(a, fx.Node) and a.name in values for a in ops[1:])
    return name in _HOMOGENEOUS_FUNCTIONS


def _whole_reason(wg: WidthGraph, group: ChannelGroup, modules: dict[str, nn.Module],
                  nodes: dict[str, fx.Node]) -> str:
    """Why the group cannot be lumped (empty when it can)."""
    if group.frozen:
        return f"frozen ({group.frozen})"
    for u in group.uses:
        mod = modules.get(u.target) if u.target else None
        if u.target in wg.heads and u.role == "affine":
            return f"attention heads of {u.target} (their projections are not merged)"
        if u.role == "affine" and u.target and u.dim != 0:
            return f"per-channel parameter {u.target}.{u.param} along dimension {u.dim}"
        if isinstance(mod, nn.LayerNorm) or (not u.target and _fn_name(nodes[u.node]) == "layer_norm"):
            return f"LayerNorm over the channels mixes them ({u.target or u.node})"
        if isinstance(mod, _BN) and mod.running_mean is None:
            return f"{u.target} is a BatchNorm without running statistics"
    if any(rw.kind == "norm_shape" and wg.find(rw.slots[0]) in set(group.atoms) for rw in wg.rewrites):
        return "layer_norm over the channels mixes them"
    for name in group.values:
        node = nodes.get(name)
        if node is not None and node.op == "call_module" and isinstance(modules[node.target], nn.PReLU) \
                and modules[node.target].num_parameters > 1:
            return f"{node.target} has per-channel PReLU slopes the width analysis does not track"
    return ""


def _bn_folds(gm: fx.GraphModule, modules: dict[str, nn.Module]) -> dict[str, str]:
    """Dense layer → the BatchNorm right after it (its only user; each called once): folded when comparing."""
    calls: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1
    folds = {}
    for n in gm.graph.nodes:
        if n.op != "call_module" or not isinstance(modules[n.target], _BN) or not n.args:
            continue
        src = n.args[0]
        if isinstance(src, fx.Node) and src.op == "call_module" and len(src.users) == 1 \
                and calls[src.target] == 1 == calls[n.target] and isinstance(modules[src.target], _DENSE) \
                and getattr(modules[src.target], "groups", 1) == 1:
            folds[src.target] = n.target
    return folds


def _affine_writer(u: Use, modules: dict[str, nn.Module], wg: WidthGraph, nodes: dict[str, fx.Node]
                   ) -> tuple[Writer, bool]:
    """The writer of a per-channel parameter use (not BatchNorm: see :func:`_writers`) and whether its part keeps
    scaled merges possible."""
    mod = modules.get(u.target) if u.target else None
    if u.target in wg.conv_groups:
        return Writer("rows", u, linear=u.param == "bias"), True
    if isinstance(mod, nn.GroupNorm):  # normalises: its output does not scale with its input
        return Writer("rows", u, linear=u.param == "bias"), False
    node = nodes[u.node]
    name = _fn_name(node)
    if name in _ADD:
        return Writer("rows", u, linear=True), True
    is_divisor = name in _DIV and not (isinstance(node.args[0], fx.Node) and node.args[0].target == u.param)
    return Writer("rows", u, linear=False), name in _MUL or is_divisor


def _writers(group: ChannelGroup, modules: dict[str, nn.Module], wg: WidthGraph, nodes: dict[str, fx.Node],
             folds: dict[str, str]) -> tuple[list[Writer], bool]:
    """The group's writers and whether all of them allow scaled merges."""
    consumers = {(u.target, u.param): u for u in wg.uses if u.role == "consumer"}
    biases = {u.target: u for u in group.uses if u.role == "producer" and u.param.endswith("bias")}
    folded = set(folds.values())
    writers: list[Writer] = []
    homogeneous, bns = True, {}
    for u in group.uses:
        if u.role == "producer" and u.param.endswith("weight"):
            writers.append(Writer("dense", u, bias=biases.get(u.target), bn=folds.get(u.target, ""),
                                  source=consumers.get((u.target, u.param))))
        elif u.role == "affine" and isinstance(modules.get(u.target), _BN):
            if u.target not in folded:
                bns.setdefault(u.target, u)
        elif u.role == "affine":
            writer, ok = _affine_writer(u, modules, wg, nodes)
            writers.append(writer)
            homogeneous &= ok
    for target, u in bns.items():
        writers += [Writer("scale", u, linear=False, bn=target), Writer("shift", u, linear=True, bn=target)]
    return writers, homogeneous


def _keys(wg: WidthGraph, group: ChannelGroup) -> list[tuple[int, ...]]:
    """Per atom: how often it occurs in each use, each value and each zero-pad of the group."""
    index = {a: i for i, a in enumerate(group.atoms)}
    lists = [u.slots for u in group.uses] + [wg.values[n].slots for n in group.values]
    for rw in wg.rewrites:
        if rw.kind == "pad" and wg.find(rw.slots[0]) in index:
            lists.append(rw.slots[:rw.before] + rw.slots[len(rw.slots) - rw.after:])
    counts = np.zeros((group.size, len(lists)), dtype=np.int64)
    for j, slots in enumerate(lists):
        for s in slots:
            counts[index[wg.find(s)], j] += 1
    return [tuple(row) for row in counts.tolist()]


def plan_groups(wg: WidthGraph, scaling: bool = True) -> dict[str, GroupPlan]:
    """How each group of ``wg`` is lumped (module docstring): scaled, value or left whole with the reason."""
    modules = dict(wg.gm.named_modules())
    nodes = {n.name: n for n in wg.gm.graph.nodes}
    folds = _bn_folds(wg.gm, modules)
    plans: dict[str, GroupPlan] = {}
    for g in wg.groups:
        reason = _whole_reason(wg, g, modules, nodes)
        plans[g.name] = GroupPlan(g, WHOLE, reason)
        if reason:
            continue
        writers, homogeneous = _writers(g, modules, wg, nodes, folds)
        constants = {(u.node, u.param) for u in g.uses if not u.target}
        homogeneous &= all(_homogeneous(nodes[n], modules, g.values, constants) for n in g.values if n in nodes)
        plans[g.name] = GroupPlan(g, SCALED if scaling and homogeneous else VALUE, "", writers, _keys(wg, g))
    return plans


# ---- dead atoms ---------------------------------------------------------------------------------------------------

def dead_atoms(wg: WidthGraph, plans: dict[str, GroupPlan], batches: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """Per lumpable group: which atoms are exactly 0 at every state point on all ``batches`` in eval mode (removing
    them is exact on that data; one atom is kept when all are).

    Under a process group ``batches`` are this rank's share of the data (e.g. from
    :func:`~minreal.compress.core.distributed.shard`, at least one batch per rank) and the per-channel peaks |value| are
    all-reduced by maximum, so every rank finds the same dead atoms as one process on all the batches."""
    groups = [p.group for p in plans.values() if p.mode != WHOLE and p.group.state_points()]
    dims = {n: g.values[n] for g in groups for n in g.state_points()}
    peak: dict[str, torch.Tensor] = {}
    for xb in batches:
        with eval_mode(wg.gm):  # running statistics of the traced copy stay as they are
            values = capture(wg.gm, xb, dims)
        for node, value in values.items():
            m = channels_last(value.detach(), dims[node]).abs().amax(0).double()
            peak[node] = m if node not in peak else torch.maximum(peak[node], m)
    for node in dims:  # the same order on every rank
        all_reduce_max(peak[node])
    dead = {}
    for g in groups:
        top = torch.zeros(g.size, dtype=torch.float64)
        for node in g.state_points():
            idx = torch.tensor(wg.channel_atoms(g, node))
            top.scatter_reduce_(0, idx, peak[node], "amax")
        zero = (top == 0).numpy()
        zero[0] &= not zero.all()
        dead[g.name] = zero
    return dead


# ---- rows of the writers ------------------------------------------------------------------------------------------

def _param(gm: nn.Module, target: str, name: str) -> torch.Tensor:
    owner, attr = param_owner(gm, target, name)
    return getattr(owner, attr).detach().to(torch.float64)


def _through_merge(w: torch.Tensor, where: _Positions, part: Partition) -> torch.Tensor:
    """``w``'s input columns (dim 1) as the consumer holds them after the merge: each kept atom's columns plus
    ρ times those of the atoms merged into it; removed atoms' columns dropped."""
    lead = part.leader[where.atoms]
    live = lead >= 0
    target = torch.from_numpy(where.at[lead[live], where.rank[live]])
    coef = torch.from_numpy(part.rho[where.atoms[live]]).reshape(1, -1, *[1] * (w.dim() - 2))
    merged = torch.zeros_like(w).index_add_(1, target, w[:, torch.from_numpy(live)] * coef)
    return merged[:, torch.from_numpy(lead == where.atoms)]


def _rows(ctx: _Context, writer: Writer, parts: dict[str, Partition]) -> torch.Tensor:
    """The writer's rows ``[positions, features]`` in float64, scaled to a largest magnitude of 1."""
    gm, u = ctx.wg.gm, writer.use
    if writer.kind == "dense":
        w = _param(gm, u.target, u.param)
        if writer.source is not None:
            w = _through_merge(w, ctx.where(writer.source), parts[ctx.group_of(writer.source)])
        w = w.reshape(len(w), -1)
        b = _param(gm, u.target, writer.bias.param) if writer.bias is not None else torch.zeros(len(w),
                                                                                                dtype=torch.float64)
        if writer.bn:
            w, b = fold_bn_after(w, b, gm.get_submodule(writer.bn))
        rows = torch.cat([w, b[:, None]], 1)
    elif writer.kind in ("scale", "shift"):
        n = len(u.slots)
        s, t = fold_bn_after(torch.ones(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64),
                             gm.get_submodule(writer.bn))
        rows = (s if writer.kind == "scale" else t)[:, None]
    else:
        p = _param(gm, u.target, u.param).movedim(u.dim, 0)
        rows = p.reshape(len(p), -1)
    top = float(rows.abs().max()) if rows.numel() else 0.0
    return rows / top if top > 0 else rows


def _features(ctx: _Context, plan: GroupPlan, rows: list[torch.Tensor], members: np.ndarray
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The members' linear and multiplicative parts, each ``[members, features]`` (members share their key)."""
    parts: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    for writer, r in zip(plan.writers, rows):
        at = ctx.where(writer.use).at
        count = int((at[members[0]] >= 0).sum())
        if count:
            idx = torch.from_numpy(at[members, :count])
            parts[writer.linear].append(r[idx].reshape(len(members), -1))
    empty = torch.zeros(len(members), 0, dtype=torch.float64)
    return tuple(torch.cat(parts[k], 1) if parts[k] else empty for k in (True, False))


# ---- refinement ---------------------------------------------------------------------------------------------------

def _space(linear: torch.Tensor, fixed: torch.Tensor, scaled: bool) -> tuple[torch.Tensor, np.ndarray]:
    """Points compared in the ∞-norm, and the norms ρ is the ratio of. In scaled mode the linear parts count by
    direction (a flag of 4 > MAX_EPS keeps rows with and without a linear part apart)."""
    norms = linear.abs().amax(1) if linear.shape[1] else torch.zeros(len(linear), dtype=torch.float64)
    if not scaled:  # a zero column keeps atoms nothing writes (zero-pad slots) comparable
        return torch.cat([linear, fixed, torch.zeros(len(linear), 1, dtype=torch.float64)], 1), np.ones(len(linear))
    live = norms > 0
    direction = linear / torch.where(live, norms, torch.ones_like(norms))[:, None]
    return torch.cat([direction, fixed, 4.0 * live.double()[:, None]], 1), torch.where(live, norms, 1.0).numpy()


def _split(feats: torch.Tensor, lead: int, tol: float) -> np.ndarray:
    """Leader (row index) of each row of one block led by row ``lead``: rows within ``tol`` of it stay, the others
    are clustered among themselves."""
    leader = np.full(len(feats), lead)
    rest = np.flatnonzero(((feats - feats[lead]).abs().amax(1) > tol).numpy())
    if len(rest):
        leader[rest] = rest[leader_clusters(feats[rest].numpy(), tol)]
    return leader


def _refine_group(ctx: _Context, plan: GroupPlan, parts: dict[str, Partition], tol: float) -> tuple[int, bool]:
    """One sweep over one group: split its blocks; returns (splits, whether any ρ moved by more than ``tol``)."""
    part = parts[plan.group.name]
    rows = [_rows(ctx, w, parts) for w in plan.writers]
    splits, moved = 0, False
    for lead, members in blocks_of(part).items():
        if len(members) < 2:
            continue
        feats, norms = _space(*_features(ctx, plan, rows, members), plan.mode == SCALED)
        new_lead = _split(feats, int(np.flatnonzero(members == lead)[0]), tol)
        rho = norms / norms[new_lead]
        splits += len(np.unique(new_lead)) - 1
        moved |= bool(np.abs(rho - part.rho[members]).max() > tol * np.abs(rho).max())
        part.leader[members], part.rho[members] = members[new_lead], rho
    return splits, moved


def _coarsen_group(ctx: _Context, plan: GroupPlan, parts: dict[str, Partition], tol: float) -> int:
    """One sweep over one group: merge blocks whose leaders' rows agree within ``tol`` (leader clustering among
    the leaders of each occurrence key); returns the blocks merged away."""
    part = parts[plan.group.name]
    rows = [_rows(ctx, w, parts) for w in plan.writers]
    classes: dict[tuple[int, ...], list[int]] = {}
    for lead in blocks_of(part):
        classes.setdefault(plan.keys[lead], []).append(lead)
    merged = 0
    for leads in classes.values():
        if len(leads) < 2:
            continue
        leads = np.array(leads)
        feats, norms = _space(*_features(ctx, plan, rows, leads), plan.mode == SCALED)
        new = leader_clusters(feats.numpy(), tol)
        for i in np.flatnonzero(new != np.arange(len(leads))):
            members = part.leader == leads[i]
            part.leader[members] = leads[new[i]]
            part.rho[members] *= norms[i] / norms[new[i]]
            merged += 1
    return merged


def blocks_of(part: Partition) -> dict[int, np.ndarray]:
    """Leader → its block's atoms (ascending), removed atoms left out."""
    out: dict[int, list[int]] = {}
    for a, r in enumerate(part.leader.tolist()):
        if r >= 0:
            out.setdefault(r, []).append(a)
    return {r: np.array(m) for r, m in out.items()}


def _initial(plan: GroupPlan, dead: np.ndarray | None) -> Partition:
    """Atoms with the same occurrence key in one block led by its first atom; dead atoms removed."""
    n = plan.group.size
    if plan.mode == WHOLE:
        return Partition.identity(n)
    leader = np.full(n, -1)
    first: dict[tuple[int, ...], int] = {}
    for a, key in enumerate(plan.keys):
        if dead is None or not dead[a]:
            leader[a] = first.setdefault(key, a)
    return Partition(leader, np.ones(n))


class Lumper:
    """ε-FDE partitions of every group of one analysed model (module docstring).

    The exact partition is computed once: refinement from the coarsest partition until a sweep splits no block
    and moves no ρ, at four units of ``dtype``'s roundoff (the greatest fixpoint: exact on any input). A larger
    ε then merges blocks upward from it (:meth:`at`) until a sweep merges none: the least fixpoint above the
    exact one, so the reduction grows gradually with ε (starting from the coarsest partition instead lets
    coarse input blocks make rows look alike and keep each other merged).
    """

    def __init__(self, wg: WidthGraph, plans: dict[str, GroupPlan], dead: dict[str, np.ndarray],
                 dtype: torch.dtype, max_sweeps: int = 50) -> None:
        self._attach(wg, plans, dtype, max_sweeps)
        self.exact = {name: _initial(p, dead.get(name)) for name, p in plans.items()}
        self.stats = LumpStats()
        for sweep in range(max_sweeps):
            changed = False
            for plan in self._lumped():
                splits, moved = _refine_group(self.ctx, plan, self.exact, self.rounding)
                self.stats.splits += splits
                changed |= bool(splits) or moved
            self.stats.sweeps = sweep + 1
            if not changed:
                break

    def _attach(self, wg: WidthGraph, plans: dict[str, GroupPlan], dtype: torch.dtype, max_sweeps: int) -> None:
        owner = {a: (g.name, i) for g in wg.groups for i, a in enumerate(g.atoms)}
        self.plans, self.ctx, self.max_sweeps = plans, _Context(wg, plans, owner), max_sweeps
        self.rounding = rounding_tolerance(dtype)

    @classmethod
    def from_exact(cls, wg: WidthGraph, plans: dict[str, GroupPlan], exact: dict[str, Partition], stats: LumpStats,
                   dtype: torch.dtype, max_sweeps: int = 50) -> "Lumper":
        """A lumper whose exact partitions (and the statistics of their refinement) were computed before on the same
        model (``Lumper(...).exact``/``.stats``): no refinement runs; :meth:`at` starts from copies of them."""
        sizes = {name: p.group.size for name, p in plans.items()}
        if sizes != {name: len(part.leader) for name, part in exact.items()}:
            raise ValueError("the exact partitions are of another analysis (channel groups differ); compute them again")
        lumper = cls.__new__(cls)
        lumper._attach(wg, plans, dtype, max_sweeps)
        lumper.exact, lumper.stats = exact, stats
        return lumper

    def _lumped(self) -> list[GroupPlan]:
        return [p for p in self.plans.values() if p.mode != WHOLE]

    def at(self, eps: float) -> tuple[dict[str, Partition], LumpStats]:
        """Partitions at merge tolerance ``eps`` (relative to each writer's largest coefficient; ≤ the rounding
        tolerance: the exact ones) and the statistics of the refinement and merge sweeps."""
        parts = {k: Partition(p.leader.copy(), p.rho.copy()) for k, p in self.exact.items()}
        stats = LumpStats(self.stats.sweeps, self.stats.splits)
        if eps <= self.rounding:
            return parts, stats
        for _ in range(self.max_sweeps):
            merged = sum(_coarsen_group(self.ctx, plan, parts, eps) for plan in self._lumped())
            stats.sweeps, stats.merges = stats.sweeps + 1, stats.merges + merged
            if not merged:
                break
        return parts, stats


def group_cuts(plans: dict[str, GroupPlan], parts: dict[str, Partition]) -> dict[str, Cut]:
    """One :class:`~minreal.compress.core.width.Cut` per group that changes: keep the leaders; a merge matrix
    ``M[a, leader(a)] = ρ_a`` where blocks merged (none for dead-only removals)."""
    cuts = {}
    for name, part in parts.items():
        n = plans[name].group.size
        keep = [a for a in range(n) if part.leader[a] == a]
        if len(keep) == n:
            continue
        merge = None
        if any(r >= 0 and r != a for a, r in enumerate(part.leader.tolist())):
            column = {a: j for j, a in enumerate(keep)}
            merge = torch.zeros(n, len(keep), dtype=torch.float64)
            for a, r in enumerate(part.leader.tolist()):
                if r >= 0:
                    merge[a, column[r]] = 1.0 if r == a else float(part.rho[a])
        cuts[name] = Cut(keep, merge)
    return cuts
