"""The data of the width analysis: channel slots tied by union-find, the parameters and graph constants they index,
and the channel groups they form.

:func:`minreal.compress.core.width.analysis.analyse` fills a :class:`WidthGraph` from a traced model
(:mod:`~minreal.compress.core.width.tracing` traces it, :mod:`~minreal.compress.core.width.rules` says what each
operation does to the channels); width methods read its groups and cut them with
:mod:`~minreal.compress.core.width.surgery`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn

from ..errors import CompressionError

__all__ = ["Use", "Rewrite", "SizeRead", "ChannelGroup", "WidthGraph", "param_owner"]


@dataclass
class Use:
    """One dimension of a parameter or buffer indexed by channel slots.

    ``target``: the module's qualified name (``""`` for the root); ``param``: its attribute (``weight``,
    ``running_mean``, …); ``dim``: the indexed dimension; ``slots``: one slot id per index; ``role``:
    ``"producer"`` (rows a conv/linear writes), ``"consumer"`` (columns a dense conv/linear reads; compensation
    goes here), ``"affine"`` (per-channel parameters: BN, LayerNorm, scales, grouped-conv rows);
    ``node``: the graph node (for reports); ``source``: the node whose value the consumer reads.
    """

    target: str
    param: str
    dim: int
    slots: list[int]
    role: str
    node: str
    source: str = ""


@dataclass
class Rewrite:
    """A graph constant that holds a channel count: ``kind`` is ``"pad"`` (amounts of a channel pad; ``slots``
    are the padded output's), ``"shape"`` (a literal size at argument ``position`` of view/reshape),
    ``"norm_shape"`` (``F.layer_norm``'s normalized shape)."""

    node: str
    kind: str
    position: int
    slots: list[int]
    before: int = 0
    after: int = 0


@dataclass
class SizeRead:
    """A Python value the traced code computed from the channel count of a tensor (``b, t, d = x.shape``,
    ``x.size(1)``, ``d // heads``): ``slots`` are that tensor's channels, ``source`` the node whose size was read;
    ``exact``: the value is the channel count itself, not computed from it; ``position``: for a whole shape
    (``x.shape``, ``x.size()``, a slice of them), where in it the channel count lies, of ``length`` entries (-1 for
    a number); ``product``: the value is the product of a shape read's entries, the channel count among them
    (``x.shape[1:].numel()``). A cut changes the value: the operation that takes it must change with it (see
    :func:`~minreal.compress.core.width.analysis._freeze_size_uses`)."""

    slots: list[int]
    source: str
    exact: bool = True
    position: int = -1
    length: int = 0
    product: bool = False


@dataclass
class ChannelGroup:
    """Channels that shrink together: ``atoms`` (root slot ids, canonical order); ``uses`` the parameters they
    index; ``values`` the graph values carrying them (node → channel dim); ``frozen``: why it cannot be cut
    (empty when it can)."""

    name: str
    atoms: list[int]
    uses: list[Use] = field(default_factory=list)
    values: dict[str, int] = field(default_factory=dict)
    frozen: str = ""

    @property
    def size(self) -> int:
        return len(self.atoms)

    def state_points(self) -> list[str]:
        """Graph values read by the group's dense consumers (where a merge must hold), in graph order."""
        seen: dict[str, None] = {}
        for u in self.uses:
            if u.role == "consumer":
                seen.setdefault(u.source, None)
        return list(seen)

    def describe(self) -> str:
        members = sorted({f"{u.target}.{u.param}" if u.target else u.param for u in self.uses})
        more = f" … (+{len(members) - 4})" if len(members) > 4 else ""
        return f"{self.name}: {self.size} channels; {', '.join(members[:4])}{more}"

def param_owner(module: nn.Module, target: str, param: str) -> tuple[nn.Module, str]:
    """The submodule holding ``param`` of the layer at ``target`` (``""``: a dotted path from the root, as a
    :class:`Use` of a ``get_attr`` parameter has), and the attribute's name there."""
    path, _, attr = (f"{target}.{param}" if target else param).rpartition(".")
    return module.get_submodule(path), attr



def _shape(node: Any) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None



class _Chan:
    """The channel annotation of one tensor value: its channel ``dim`` and one slot per channel."""

    __slots__ = ("dim", "slots")

    def __init__(self, dim: int, slots: list[int]) -> None:
        self.dim, self.slots = dim, slots


class WidthGraph:
    """The analysis of one traced model: slots, atoms, groups, parameter uses and graph rewrites."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.parent: list[int] = []
        self.frozen: dict[int, str] = {}
        self.uses: list[Use] = []
        self.rewrites: list[Rewrite] = []
        self.heads: dict[str, list[int]] = {}  # MultiheadAttention target → head slots
        self.conv_groups: dict[str, tuple[int, int]] = {}  # grouped conv → (in, out) channels per group
        self.norm_groups: dict[str, int] = {}  # GroupNorm → channels per group
        self.unsupported: list[tuple[str, str]] = []
        self.values: dict[str, _Chan] = {}
        self.sizes: dict[str, SizeRead] = {}  # node → the channel count its Python value was computed from
        # (node, size it takes, channels of its tensors, channels the size must stay equal to: None where none may)
        self.size_uses: list[tuple[str, SizeRead, list[int], list[int] | None]] = []
        self.groups: list[ChannelGroup] = []
        self.example: Any = None  # the input the model was traced on (analyse sets it): a cut model must run on it

    # ---- union-find over slots -------------------------------------------------------------------------
    def fresh(self, n: int) -> list[int]:
        start = len(self.parent)
        self.parent.extend(range(start, start + n))
        return list(range(start, start + n))

    def find(self, s: int) -> int:
        while self.parent[s] != s:
            self.parent[s] = self.parent[self.parent[s]]
            s = self.parent[s]
        return s

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def freeze(self, slots: Iterable[int], node: str, reason: str) -> None:
        slots = list(slots)
        if slots:
            self.unsupported.append((node, reason))
        for s in slots:
            self.frozen.setdefault(s, f"{node}: {reason}")

    # ---- queries -----------------------------------------------------------------------------------------
    def group(self, name: str) -> ChannelGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise CompressionError(f"no channel group named {name!r}; groups: {', '.join(g.name for g in self.groups)}")

    def cuttable(self) -> list[ChannelGroup]:
        """Groups a width method may shrink (not frozen, at least two channels)."""
        return [g for g in self.groups if not g.frozen and g.size >= 2]

    def channel_atoms(self, group: ChannelGroup, node: str) -> list[int]:
        """For each channel position of the value at ``node``: the index of its atom in ``group.atoms``."""
        index = {a: i for i, a in enumerate(group.atoms)}
        return [index[self.find(s)] for s in self.values[node].slots]

    def segments(self, group: ChannelGroup) -> list[list[int]]:
        """The group's atoms (indices into ``group.atoms``) split by the set of values they appear in.

        In a ResNet with option-A shortcuts one group spans the 16-, 32- and 64-channel streams; its segments
        are the 16 channels present everywhere, the 16 the second stage adds and the 32 the third adds. Every
        value's width is a sum of segment widths, so widths on a multiple per segment land on that multiple
        everywhere."""
        member: dict[int, list[int]] = {i: [] for i in range(group.size)}
        for k, node in enumerate(group.values):
            for i in set(self.channel_atoms(group, node)):
                member[i].append(k)
        for u in group.uses:  # parameters of heads or grouped rows that no value carries
            index = {a: i for i, a in enumerate(group.atoms)}
            for i in {index[self.find(s)] for s in u.slots}:
                if not member[i]:
                    member[i].append(-1)
        by_signature: dict[tuple[int, ...], list[int]] = {}
        for i in range(group.size):
            by_signature.setdefault(tuple(member[i]), []).append(i)
        return sorted(by_signature.values(), key=lambda seg: seg[0])

    def positions(self, slots: Sequence[int], removed: set[int]) -> list[int]:
        """Indices into ``slots`` whose atom survives."""
        return [i for i, s in enumerate(slots) if self.find(s) not in removed]
