"""Channel groups from the traced graph: which channels of a model must shrink together.

The model is traced (:mod:`~minreal.compress.core.width.tracing`) and every operation constrains the channel slots
of the tensors it reads and writes (:mod:`~minreal.compress.core.width.rules`). Tied slots form *atoms*
(union-find classes): a channel of the network that is kept or removed everywhere at once. Atoms that appear
together in any tensor form a :class:`~minreal.compress.core.width.graph.ChannelGroup`, the unit a width method
sizes. Whatever the analysis does not understand freezes the channels it touches (the model's inputs and outputs
always are): the group is reported by node name with the reason and left whole — never mis-cut.

Why not Torch-Pruning's DepGraph: on a CIFAR ResNet-20 with option-A shortcuts it treats ``F.pad`` as an
elementwise operation and ties the 16-, 32- and 64-channel streams position by position (measured with
torch-pruning 1.6.1), which cuts the wrong channels; the pad offset is the whole point of that shortcut.

"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import CompressionError
from ..surgery import shared_parameters
from .graph import ChannelGroup, Use, WidthGraph
from .rules import apply_rules
from .tracing import trace

__all__ = ["analyse"]


def analyse(model: nn.Module, example: torch.Tensor) -> WidthGraph:
    """Trace ``model`` on ``example`` and find its channel groups (see the module docstring). Where the classes kept
    whole leave no group that may shrink (a T5 or BART encoder's blocks check sizes in Python), the model is traced
    again carrying example values (:func:`~.tracing.trace` with ``values``), and that graph is taken if it has one.
    ``example`` is kept as ``wg.example``: :func:`~.surgery.apply_cuts` runs each cut model on it once."""
    gm = trace(model, example)
    wg = _groups(gm)
    wg.example = example  # apply_cuts runs each cut model on it once
    if not wg.cuttable() and gm.meta.get("opaque"):
        try:
            again = _groups(trace(model, example, values=True))
        except CompressionError:
            return wg
        if again.cuttable():
            again.example = example
            return again
    return wg


def _groups(gm: torch.fx.GraphModule) -> WidthGraph:
    """The channel groups of a traced model."""
    wg = WidthGraph(gm)
    for name, reason in wg.gm.meta.get("opaque", {}).items():
        wg.unsupported.append((name, f"kept whole as one layer, its channels as they are: torch.fx cannot trace "
                                     f"or replay it ({reason})"))
    apply_rules(wg)
    _freeze_inside_opaque(wg)
    _freeze_size_uses(wg)
    _build_groups(wg)
    _freeze_tied(wg)
    return wg


def _freeze_inside_opaque(wg: WidthGraph) -> None:
    """Freeze every use of a layer or parameter that lies inside a module kept whole (:func:`trace`'s opaque
    modules): the model's own code may call one of its layers or read one of its parameters, and the module's own
    uses of them, which the graph does not show, would no longer fit a cut (found in review)."""
    inside = tuple(wg.gm.meta.get("opaque_modules", ()))
    if not inside:
        return
    for u in wg.uses:
        owner = next((name for name in inside if u.target == name or u.target.startswith(f"{name}.")), None)
        if owner is not None:
            wg.freeze(u.slots, u.node, f"{u.target}.{u.param} lies inside {owner}, which is kept whole (torch.fx "
                                       "cannot trace or replay it)")


def _freeze_size_uses(wg: WidthGraph) -> None:
    """Leave whole the channels whose count the model's code reads as a Python size and the tensors of the operation
    that takes it (``b, t, d = x.shape`` then ``qkv(x).view(b, t, 3, h, d // h)``: a cut of x's channels would
    change the view's sizes, not qkv's width), unless the size is the channel count itself, at the very position
    where the reshaped tensor's channels land, and those are the same channels (``pooled.view(b, c)`` with ``c``
    read from the tensor pooled): then a cut changes both alike. Checked once every rule has tied its slots (the
    residual addition that makes two streams one comes after the view)."""
    for node, read, touched, same in wg.size_uses:
        if same is not None and [wg.find(s) for s in same] == [wg.find(s) for s in read.slots]:
            continue
        wg.freeze(read.slots + touched, node, f"takes a size read from the {len(read.slots)} channels of "
                                               f"{read.source} (x.shape, x.size()) that a cut would not keep "
                                               "consistent with its tensor's")


def _freeze_tied(wg: WidthGraph) -> None:
    """Leave whole every group that indexes a parameter another module holds too (a language model's head tied to
    its token embedding): narrowing one holder cannot narrow the other, so the cut would untie them and the model
    would gain the narrowed copy's parameters instead of losing any."""
    shared = {name: group for group in shared_parameters(wg.gm) for name in group}
    for g in wg.groups:
        if g.frozen:
            continue
        for u in g.uses:
            key = f"{u.target}.{u.param}" if u.target else u.param
            others = [n for n in shared.get(key, ()) if n != key]
            if others:
                g.frozen = (f"{key} is tied to {others[0]} (one parameter held by two modules): narrowing it would "
                            "untie the two and add parameters")
                break


def _build_groups(wg: WidthGraph) -> None:
    """Atoms that share any tensor or parameter dimension form one group; name it after its first producer."""
    seen_params: dict[tuple[str, str, int], Use] = {}
    unique: list[Use] = []
    for u in wg.uses:  # a layer called twice reads and writes the same channels both times
        key = (u.target, u.param, u.dim)
        first = seen_params.get(key)
        if first is None:
            seen_params[key] = u
            unique.append(u)
        elif len(first.slots) == len(u.slots):
            for s, t in zip(first.slots, u.slots):
                wg.union(s, t)
        else:
            wg.freeze(first.slots + u.slots, u.node, f"{u.target or u.param} is used twice with other widths")
    wg.uses = unique
    lists: list[tuple[str, list[int], str | None, int]] = []
    for name, chan in wg.values.items():
        lists.append((name, chan.slots, None, chan.dim))
    for u in wg.uses:
        lists.append((u.node, u.slots, "use", 0))
    comp: dict[int, int] = {}

    def cfind(a: int) -> int:
        while comp.setdefault(a, a) != a:
            comp[a] = comp[comp[a]]
            a = comp[a]
        return a

    for _, slots, _, _ in lists:
        roots = {wg.find(s) for s in slots}
        first = next(iter(roots), None)
        for r in roots:
            ra, rb = cfind(first), cfind(r)
            if ra != rb:
                comp[max(ra, rb)] = min(ra, rb)
    order: dict[int, dict[int, None]] = {}  # component → its atoms (a dict: a set in first-seen order)
    for _, slots, _, _ in lists:
        for s in slots:
            r = wg.find(s)
            order.setdefault(cfind(r), {})[r] = None
    by_comp: dict[int, ChannelGroup] = {}
    for c, atoms in order.items():
        by_comp[c] = ChannelGroup("", sorted(atoms))
    for u in wg.uses:
        g = by_comp[cfind(wg.find(u.slots[0]))] if u.slots else None
        if g is not None:
            g.uses.append(u)
    for name, chan in wg.values.items():
        if chan.slots and "#" not in name:  # "node#i": an item of a tuple output, carried on by its getitem node
            by_comp[cfind(wg.find(chan.slots[0]))].values[name] = chan.dim
    frozen_roots: dict[int, str] = {}
    for s, reason in wg.frozen.items():
        frozen_roots.setdefault(wg.find(s), reason)
    names: set[str] = set()
    for g in by_comp.values():
        g.frozen = next((frozen_roots[a] for a in g.atoms if a in frozen_roots), "")
        if not g.uses:
            continue
        producer = next((u for u in g.uses if u.role == "producer"), None)
        if producer is not None:
            base = producer.target or producer.param
        else:
            base = f"{g.uses[0].target or g.uses[0].param}:in"
        name, k = base, 2
        while name in names:
            name, k = f"{base}#{k}", k + 1
        names.add(name)
        g.name = name
        wg.groups.append(g)
    # canonical atom order: first appearance along the first producer's rows
    for g in wg.groups:
        seen: dict[int, None] = {}
        for u in sorted(g.uses, key=lambda u: u.role != "producer"):
            for s in u.slots:
                seen.setdefault(wg.find(s), None)
        for a in g.atoms:
            seen.setdefault(a, None)
        g.atoms = list(seen)
