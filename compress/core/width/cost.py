"""Predicted cost of a resized model from the channel analysis alone (no surgery, no forward pass).

Every dense or grouped convolution, Linear layer and attention layer is a :class:`Term`: its multiply-
accumulates and parameters are bilinear in the surviving output and input positions, so a candidate set of
removed atoms is priced in microseconds — what an allocator needs inside its loop. Per-channel layers
(BatchNorm, activations) are not counted (the same convention as :func:`minreal.compress.core.costs.count_macs_torch`
for MACs: convolutions, matrix products and attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import fx, nn

from .graph import WidthGraph, _shape

__all__ = ["Term", "cost_terms"]


@dataclass
class Term:
    """``macs = out·in·mac_unit + out·extra_macs``, ``params = out·in·param_unit + out·bias`` over the surviving
    positions (``out_atoms``/``in_atoms``: the atom of each position; ``in_atoms`` empty: the input width is fixed at
    ``in_fixed``)."""

    node: str
    out_atoms: list[int]
    in_atoms: list[int]
    in_fixed: int
    mac_unit: float
    param_unit: float
    bias: int
    extra_macs: float = 0.0


def cost_terms(wg: WidthGraph) -> list[Term]:
    """One term per convolution, Linear and attention node of the traced model (per sample)."""
    terms: list[Term] = []
    modules = dict(wg.gm.named_modules())
    by_node: dict[str, dict[tuple[str, int], list[int]]] = {}
    for u in wg.uses:
        by_node.setdefault(u.node, {})[(u.param, u.dim)] = u.slots
    for node in wg.gm.graph.nodes:
        if node.op != "call_module":
            continue
        mod = modules[node.target]
        uses = by_node.get(node.name, {})
        out_shape = _shape(node)
        if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and out_shape:
            spatial = math.prod(out_shape[2:])
            k = math.prod(mod.kernel_size)
            out = uses.get(("weight", 0), [])
            if mod.groups == 1:
                ins = uses.get(("weight", 1), [])
                terms.append(Term(node.name, out, ins, mod.in_channels, k * spatial, k,
                                  int(mod.bias is not None)))
            else:  # grouped: each output reads a fixed number of inputs
                a = mod.in_channels // mod.groups
                terms.append(Term(node.name, out, [], a, k * spatial, k, int(mod.bias is not None)))
        elif isinstance(mod, nn.Linear) and out_shape:
            rows = math.prod(out_shape[1:-1]) if len(out_shape) > 2 else 1
            terms.append(Term(node.name, uses.get(("weight", 0), []), uses.get(("weight", 1), []),
                              mod.in_features, rows, 1, int(mod.bias is not None)))
        elif isinstance(mod, nn.MultiheadAttention):
            x_shape = _shape(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
            if not x_shape:
                continue
            tokens = x_shape[0 if not mod.batch_first else 1] if len(x_shape) == 3 else 1
            rows = uses.get(("in_proj_weight", 0), [])
            terms.append(Term(node.name, rows, uses.get(("in_proj_weight", 1), []), mod.embed_dim, tokens, 1,
                              int(mod.in_proj_bias is not None),
                              extra_macs=2 * tokens * tokens / 3))  # q·kᵀ and attn·v: per inner channel
            terms.append(Term(node.name + ".out_proj", uses.get(("out_proj.weight", 0), []),
                              uses.get(("out_proj.weight", 1), []), mod.embed_dim, tokens, 1,
                              int(mod.out_proj.bias is not None)))
    for t in terms:
        t.out_atoms = [wg.find(s) for s in t.out_atoms]
        t.in_atoms = [wg.find(s) for s in t.in_atoms]
    return terms
