"""One surgery for every width method: keep sets per channel group, optional compensation, a plain module out.

A :class:`Cut` names the atoms of a :class:`~minreal.compress.core.width.graph.ChannelGroup` to keep and, optionally,
how the removed channels are expressed through the kept ones — ``x_all ≈ merge · x_kept + offset`` per
sample, measured at the group's state points. Compensation is pushed into every dense consumer of the group
(``W ← W · merge`` over the consumer's input channels, ``b ← b + W · offset``; the offset is exact for Linear
layers and unpadded convolutions, and near the borders of zero-padded convolutions an approximation, since the
padded taps saw zeros, not the offset): a merge matrix whose rows sum
the merged channels into their representative is what ε-FDE lumping needs; a least-squares fit
``merge = Σ_{all,kept} Σ_{kept}⁻¹`` is the refit of consumers a warm start needs. Without compensation the
cut is exact whenever the removed channels are dead (zero at every state point); with nothing removed the
result computes exactly what the original does.

The result is the traced :class:`torch.fx.GraphModule` with its ``torch.nn`` layers resized in place (BN cut
consistently with its conv), constants that hold channel counts rewritten (channel pads, view sizes, layer-norm
shapes) and attention layers whose heads or embedding channels shrink replaced by
:class:`SlimAttention` — plain torch modules that export to ONNX without special cases.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..attention import AttentionBase
from ..errors import CompressionError
from ..evaluate import eval_mode
from ..inputs import args_of
from .graph import ChannelGroup, Use, WidthGraph, param_owner

__all__ = ["Cut", "SlimAttention", "apply_cuts"]


@dataclass
class Cut:
    """Keep ``keep`` (indices into the group's atoms); ``merge`` (``[group size, len(keep)]``) and ``offset``
    (``[group size]``) express every channel through the kept ones; rows of kept channels must be the identity
    and zero (checked)."""

    keep: Sequence[int]
    merge: torch.Tensor | None = None
    offset: torch.Tensor | None = None


class SlimAttention(AttentionBase):
    """Multi-head self-attention whose inner width (``heads × head_dim``) and embedding widths in and out may
    all differ, q/k/v still in one ``in_proj_weight``; a drop-in for :class:`torch.nn.MultiheadAttention` (same
    call and results, see :class:`~minreal.compress.core.attention.AttentionBase`)."""

    def __init__(self, in_proj_weight: torch.Tensor, in_proj_bias: torch.Tensor | None, out_proj: nn.Linear,
                 num_heads: int, head_dim: int, batch_first: bool, dropout: float) -> None:
        super().__init__(num_heads, batch_first, dropout)
        self.in_proj_weight = nn.Parameter(in_proj_weight.detach().clone())
        self.in_proj_bias = None if in_proj_bias is None else nn.Parameter(in_proj_bias.detach().clone())
        self.out_proj = out_proj
        self.head_dim = head_dim

    def project(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inner = self.num_heads * self.head_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:inner], b[inner:2 * inner], b[2 * inner:])
        return (F.linear(query, w[:inner], bq), F.linear(key, w[inner:2 * inner], bk),
                F.linear(value, w[2 * inner:], bv))


def _atom_index(wg: WidthGraph, group: ChannelGroup) -> dict[int, int]:
    return {a: i for i, a in enumerate(group.atoms)}


def _check_cut(group: ChannelGroup, cut: Cut) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None]:
    keep = sorted({int(k) for k in cut.keep})
    if not keep or keep[0] < 0 or keep[-1] >= group.size:
        raise CompressionError(f"channel group {group.name!r}: keep set must be 1..{group.size} indices in "
                               f"[0, {group.size}), got {len(keep)} (min {min(keep, default=None)}, "
                               f"max {max(keep, default=None)})")
    if group.frozen and len(keep) < group.size:
        raise CompressionError(f"channel group {group.name!r} cannot be cut: {group.frozen}")
    merge, offset = cut.merge, cut.offset
    if merge is not None:
        merge = merge.detach().to(torch.float64)
        if tuple(merge.shape) != (group.size, len(keep)):
            raise CompressionError(f"channel group {group.name!r}: merge matrix must be {group.size}×{len(keep)}, "
                                   f"got {tuple(merge.shape)}")
        if not torch.allclose(merge[keep], torch.eye(len(keep), dtype=torch.float64)):
            raise CompressionError(f"channel group {group.name!r}: rows of kept channels in the merge matrix must "
                                   "be the identity")
    if offset is not None:
        offset = offset.detach().to(torch.float64).reshape(-1)
        if offset.numel() != group.size or bool(offset[keep].abs().max() > 0):
            raise CompressionError(f"channel group {group.name!r}: offset must have {group.size} entries, zero on "
                                   "kept channels")
    return keep, merge, offset


def _compensate(gm: nn.Module, wg: WidthGraph, use: Use, index: dict[int, int], keep: list[int],
                merge: torch.Tensor | None, offset: torch.Tensor | None, created: set[tuple[str, str]]) -> None:
    """Fold ``x_all = merge·x_kept + offset`` into one dense consumer's weight (and bias)."""
    owner, attr = param_owner(gm, use.target, use.param)
    weight = getattr(owner, attr)
    wt = weight.detach().to(torch.float64).movedim(use.dim, 0)  # [positions, ...]
    atoms = [index[wg.find(s)] for s in use.slots]
    occurrence: list[int] = []
    counts: dict[int, int] = {}
    for a in atoms:
        occurrence.append(counts.get(a, 0))
        counts[a] = occurrence[-1] + 1
    column = {a: j for j, a in enumerate(keep)}
    if merge is not None:  # per occurrence rank r (a flatten repeats atoms): W_kept ← mergeᵀ·W over that rank
        new_wt = wt.clone()
        by_rank: dict[int, list[int]] = {}
        for p, r in enumerate(occurrence):
            by_rank.setdefault(r, []).append(p)
        for ps in by_rank.values():
            src = torch.tensor([atoms[p] for p in ps])
            kept = [q for q in ps if atoms[q] in column]
            if not kept:
                continue
            cols = torch.tensor([column[atoms[q]] for q in kept])
            mixed = torch.tensordot(merge[src][:, cols].T, wt[torch.tensor(ps)], dims=1)
            new_wt[torch.tensor(kept)] = mixed
    else:
        new_wt = wt
    if offset is not None:
        c = offset[torch.tensor(atoms)]
        shift = torch.tensordot(c, wt, dims=1)  # [out, *kernel]
        shift = shift.reshape(shift.shape[0], -1).sum(1) if shift.dim() > 1 else shift
        bias_name = "in_proj_bias" if attr == "in_proj_weight" else "bias"
        bias = getattr(owner, bias_name, None)
        if bias is None:
            setattr(owner, bias_name, nn.Parameter(shift.to(weight.dtype)))
            created.add((use.target, bias_name))
        else:
            bias.data += shift.to(bias.dtype)
    weight.data.copy_(new_wt.movedim(0, use.dim).to(weight.dtype))


def _slice(gm: nn.Module, use: Use, positions: list[int]) -> None:
    owner, attr = param_owner(gm, use.target, use.param)
    value = getattr(owner, attr)
    idx = torch.tensor(positions, dtype=torch.long, device=value.device)
    new = value.detach().index_select(use.dim, idx).clone()
    if attr in owner._buffers:
        owner._buffers[attr] = new
    elif isinstance(value, nn.Parameter):
        setattr(owner, attr, nn.Parameter(new, requires_grad=value.requires_grad))
    else:
        setattr(owner, attr, new)


def _refresh(gm: fx.GraphModule, wg: WidthGraph, touched: set[str], removed: set[int]) -> None:
    """Bring each resized layer's size attributes in line with its parameters."""
    for target in touched:
        if not target:
            continue
        mod = gm.get_submodule(target)
        if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            mod.out_channels = mod.weight.shape[0]
            if target in wg.conv_groups:
                a, b = wg.conv_groups[target]
                mod.groups = mod.out_channels // b
                mod.in_channels = mod.groups * a
            else:
                mod.in_channels = mod.weight.shape[1]
        elif isinstance(mod, nn.Linear):
            mod.out_features, mod.in_features = mod.weight.shape
        elif isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            mod.num_features = mod.running_mean.shape[0] if mod.running_mean is not None else mod.weight.shape[0]
        elif isinstance(mod, nn.PReLU):
            mod.num_parameters = mod.weight.shape[0]
        elif isinstance(mod, nn.LayerNorm):
            mod.normalized_shape = (mod.weight.shape[0],)
        elif isinstance(mod, nn.GroupNorm):
            mod.num_channels = mod.weight.shape[0]
            mod.num_groups = mod.num_channels // wg.norm_groups[target]
        elif isinstance(mod, nn.MultiheadAttention):
            heads = sum(1 for h in wg.heads[target] if wg.find(h) not in removed)
            out_proj = nn.Linear(mod.out_proj.in_features, mod.out_proj.out_features,
                                 bias=mod.out_proj.bias is not None)
            out_proj.weight = mod.out_proj.weight
            out_proj.in_features, out_proj.out_features = mod.out_proj.weight.shape[1], mod.out_proj.weight.shape[0]
            if mod.out_proj.bias is not None:
                out_proj.bias = mod.out_proj.bias
            slim = SlimAttention(mod.in_proj_weight, mod.in_proj_bias, out_proj, heads, mod.head_dim,
                                 mod.batch_first, mod.dropout)
            parent, _, child = target.rpartition(".")
            setattr(gm.get_submodule(parent), child, slim)


def _rewrite(gm: fx.GraphModule, wg: WidthGraph, removed: set[int]) -> None:
    nodes = {n.name: n for n in gm.graph.nodes}
    for rw in wg.rewrites:
        node = nodes[rw.node]
        kept = len(wg.positions(rw.slots, removed))
        if rw.kind == "pad":
            pad = list(node.args[1] if len(node.args) > 1 else node.kwargs["pad"])
            pad[rw.position] = len(wg.positions(rw.slots[:rw.before], removed))
            pad[rw.position + 1] = len(wg.positions(rw.slots[len(rw.slots) - rw.after:], removed)) if rw.after else 0
            _set_arg(node, 1, "pad", tuple(pad))
        elif rw.kind == "shape":
            if rw.before:  # x.view(n, c, ...)
                args = list(node.args)
                args[rw.position + 1] = kept
                node.args = tuple(args)
            else:
                sizes = list(node.args[1])
                sizes[rw.position] = kept
                _set_arg(node, 1, "shape", tuple(sizes))
        elif rw.kind == "norm_shape":
            _set_arg(node, 1, "normalized_shape", (kept,))


def _set_arg(node: fx.Node, i: int, key: str, value: object) -> None:
    if len(node.args) > i:
        args = list(node.args)
        args[i] = value
        node.args = tuple(args)
    else:
        kwargs = dict(node.kwargs)
        kwargs[key] = value
        node.kwargs = kwargs


def apply_cuts(wg: WidthGraph, cuts: Mapping[str, Cut]) -> fx.GraphModule:
    """A resized copy of ``wg``'s traced model: each named group keeps its ``Cut.keep`` atoms (see module doc).

    Where channels were removed, the copy is run once on the example ``wg`` was traced on (:func:`_require_runs`):
    CompressionError, one line naming the operation, where it does not run."""
    gm = copy.deepcopy(wg.gm)
    removed: set[int] = set()
    plans: dict[str, tuple[ChannelGroup, list[int], torch.Tensor | None, torch.Tensor | None]] = {}
    for name, cut in cuts.items():
        group = wg.group(name)
        keep, merge, offset = _check_cut(group, cut)
        plans[name] = (group, keep, merge, offset)
        kept = {group.atoms[k] for k in keep}
        removed.update(a for a in group.atoms if a not in kept)
    created: set[tuple[str, str]] = set()
    with torch.no_grad():
        for group, keep, merge, offset in plans.values():
            if merge is None and offset is None:
                continue
            index = _atom_index(wg, group)
            for use in group.uses:
                if use.role == "consumer":
                    _compensate(gm, wg, use, index, keep, merge, offset, created)
        touched: set[str] = set()
        for use in wg.uses:
            positions = wg.positions(use.slots, removed)
            if len(positions) == len(use.slots):
                continue
            _slice(gm, use, positions)
            bias = "in_proj_bias" if use.param == "in_proj_weight" else "bias"
            if use.dim == 0 and use.param in ("weight", "in_proj_weight") and (use.target, bias) in created:
                _slice(gm, Use(use.target, bias, 0, use.slots, use.role, use.node), positions)  # a bias the
                # compensation of this layer's input created is cut with the layer's own rows
            touched.add(use.target if use.target else "")
        _refresh(gm, wg, touched, removed)
        _rewrite(gm, wg, removed)
    gm.recompile()
    if removed:
        _require_runs(gm, wg)
    return gm


class _Replay(fx.Interpreter):
    """Runs a graph node by node and remembers the node it is at (the one that failed)."""

    at: fx.Node | None = None

    def run_node(self, n: fx.Node) -> object:
        self.at = n
        return super().run_node(n)


def _require_runs(gm: fx.GraphModule, wg: WidthGraph) -> None:
    """Refuse, in one line naming the operation, a cut model that does not run on the traced example: the house
    rule is that width surgery never writes a model that does not run; a structure the rules cannot keep consistent
    must have been left whole (a gap in the rules if this fires). Run through an interpreter, stderr captured:
    torch.fx's GraphModule prints a traceback of its own to stderr when its generated code raises."""
    if wg.example is None:
        return
    replay = _Replay(gm)
    try:  # the random state as it was (a forward drawing noise): a seeded run does not depend on the cuts tried
        with torch.random.fork_rng(devices=[]), torch.no_grad(), eval_mode(gm), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            replay.run(*args_of(wg.example))
    except Exception as exc:
        node = replay.at
        stack = list((node.meta.get("nn_module_stack") or {}).values()) if node is not None else []
        inside = stack[-1][0] if stack and isinstance(stack[-1], tuple) else ""
        where = f" at its operation {node.name}{f' (in {inside})' if inside else ''}" if node is not None else ""
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise CompressionError(f"width surgery cut {wg.gm.__class__.__name__} into a model that does not run"
                               f"{where}: {type(exc).__name__}: {first}; the channels that operation touches should "
                               "have been left whole (a gap in the width rules: please report it); use factorize, "
                               "which needs no trace") from None
