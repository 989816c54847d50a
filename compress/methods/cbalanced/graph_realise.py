"""Realisation on channel groups: each analysed group of the traced graph shrinks to its width through the one
cut of :mod:`minreal.compress.core.width` — a warm start (atoms kept by balanced leverage, every consumer refitted by
least squares) or a fresh initialisation of the cut network. No model family needs surgery of its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch
from torch import fx, nn

from ...core.errors import CompressionError
from ...core.linalg import balanced_basis
from ...core.width import ChannelGroup, Cut, WidthGraph, apply_cuts
from ...core.width.allocate import allowed_widths
from ...core.width.importance import magnitude_importance
from .analysis import StateAnalysis
from .realise import top_indices

__all__ = ["round_width", "balanced_leverage", "ls_merge", "group_cuts", "group_keep",
           "realise_groups", "reinitialise", "as_sequential", "group_params", "count_params"]


def round_width(rank: int, size: int, multiple: int, minimum: int = 0) -> int:
    """The narrowest width on the provider's fast multiple (and not below its ``minimum``) that holds ``rank``
    channels: the smallest of :func:`~minreal.compress.core.width.allocate.allowed_widths` ``(size, multiple, minimum)``
    that is at least ``rank``."""
    return min(w for w in allowed_widths(size, multiple, minimum) if w >= min(rank, size))


def balanced_leverage(gc_root: torch.Tensor, vb: torch.Tensor, rank: int) -> torch.Tensor:
    """Balanced leverage of every atom: ℓ_i = ‖U_r[i, :]‖², U_r = orth(Gc^½ V_b[:, :r]) (Moore 1981).

    With B = Gc^½ Go Gc^½ = V_b Λ V_bᵀ, the balancing transformation is T = Gc^½ V_b Λ^{-1/4}: the state
    deviation is h − h̄ = T ξ with balanced coordinates ξ whose Gramians are both Λ^½, and truncating to the
    r dominant balanced states keeps h − h̄ ≈ T[:, :r] ξ[:r]. Those states live in the column span of
    Gc^½ V_b[:, :r] (Λ^{-1/4} only rescales columns); U_r is an orthonormal basis of it, in atom coordinates.
    ℓ_i = e_iᵀ U_r U_rᵀ e_i is the squared length of atom axis e_i projected on that span — the row norm of the
    top r balanced directions mapped back to channels — with 0 ≤ ℓ_i ≤ 1 and Σ_i ℓ_i = r. Atoms of large
    leverage carry the dominant balanced states; an atom the span ignores (dead, or invisible at the outputs)
    has ℓ_i = 0.
    """
    return balanced_basis(gc_root, vb, rank).pow(2).sum(1)


def ls_merge(gc: torch.Tensor, mean: torch.Tensor, keep: Sequence[int], ridge: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Affine least-squares expression of every atom through the kept ones, from the state moments.

    The minimiser of E‖h_R − M_R h_K − o_R‖² over (M_R, o_R) is M_R = Σ_RK Σ_KK⁻¹, o_R = h̄_R − M_R h̄_K
    (Σ the covariance ``gc``, R the removed atoms, K the kept ones; the normal equations of ordinary least
    squares with an intercept). Σ_KK is ridge-regularised, Σ_KK + λI with λ = ``ridge``·tr(Σ_KK)/|K|
    (Hoerl & Kennard 1970), so a rank-deficient kept set still has a solution. Rows of kept atoms are the
    identity and their offsets zero, exactly.

    Returns
    -------
    merge : torch.Tensor
        M (d × |K|), float64.
    offset : torch.Tensor
        o (d,), float64.
    """
    gc, mean = gc.double(), mean.double()
    d = gc.shape[0]
    keep_t = torch.tensor(sorted(keep))
    removed = torch.tensor([i for i in range(d) if i not in set(keep)], dtype=torch.long)
    s_kk = gc[keep_t[:, None], keep_t]
    lam = ridge * float(torch.diagonal(s_kk).sum()) / len(keep_t)
    reg = s_kk + lam * torch.eye(len(keep_t), dtype=torch.float64)
    merge = torch.zeros(d, len(keep_t), dtype=torch.float64)
    offset = torch.zeros(d, dtype=torch.float64)
    merge[keep_t, torch.arange(len(keep_t))] = 1.0
    if len(removed):
        m_r = torch.linalg.lstsq(reg, gc[keep_t[:, None], removed]).solution.T  # Σ_KK is symmetric
        merge[removed] = m_r
        offset[removed] = mean[removed] - m_r @ mean[keep_t]
    return merge, offset


def group_cuts(wg: WidthGraph, analyses: Mapping[str, StateAnalysis], widths: Mapping[str, int], selection: str,
               refit: bool, ridge: float) -> dict[str, Cut]:
    """The warm start's cut of every group: the ``widths[g]`` atoms of highest score, and with ``refit`` the
    :func:`ls_merge` compensation of the removed ones. Scores: :func:`balanced_leverage` in the span of the
    C-rank dominant balanced directions (the exact rank; a width rounded up to the fast multiple keeps the
    extra atoms that best cover that same span), or
    :func:`~minreal.compress.core.width.importance.magnitude_importance`."""
    cuts = {}
    for name, width in widths.items():
        group, a = wg.group(name), analyses[name]
        keep = group_keep(wg, a, width, selection)
        merge, offset = ls_merge(a.gc, a.mean, keep, ridge) if refit and width < group.size else (None, None)
        cuts[name] = Cut(keep, merge, offset)
    return cuts


def group_keep(wg: WidthGraph, analysis: StateAnalysis, width: int, selection: str, rank: int | None = None
               ) -> list[int]:
    """The ``width`` atoms a warm start keeps of the analysed group: highest :func:`balanced_leverage` at the C rank
    (``rank``, else the analysis's; capped at ``width``), or highest magnitude importance. Which atoms matter to the
    cost where a group spans streams of different widths (an option-A ResNet's 16/32/64 segments)."""
    a = analysis
    scores = balanced_leverage(a.gc_root, a.vb, min(a.rank_c if rank is None else rank, width)) \
        if selection == "leverage" else magnitude_importance(wg, wg.group(a.name))
    return top_indices(scores, width).tolist()


def reinitialise(module: nn.Module, seed: int) -> None:
    """Fresh parameters (and statistics) for every layer of ``module`` that has torch's ``reset_parameters``."""
    torch.manual_seed(seed)
    for m in module.modules():
        if m is not module and callable(getattr(m, "reset_parameters", None)):
            m.reset_parameters()


def as_sequential(model: nn.Module, gm: fx.GraphModule) -> nn.Module:
    """The cut ``gm`` as an ``nn.Sequential`` of its resized layers when ``model`` is a Sequential whose trace is
    the plain chain of its children; otherwise ``gm`` itself (a plain torch module either way)."""
    if not isinstance(model, nn.Sequential):
        return gm
    names = [n for n, _ in model.named_children()]
    calls = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    prev = next((n for n in gm.graph.nodes if n.op == "placeholder"), None)
    for node, name in zip(calls, names):
        if node.op != "call_module" or node.target != name or list(node.all_input_nodes) != [prev]:
            return gm
        prev = node
    if len(calls) != len(names):
        return gm
    return nn.Sequential(OrderedDict((n, gm.get_submodule(n)) for n in names))


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def group_params(module: nn.Module, group: ChannelGroup) -> int:
    """Parameters of the layers that write the group's channels (its producers) in ``module``."""
    targets = sorted({u.target for u in group.uses if u.role == "producer" and u.target})
    return sum(count_params(module.get_submodule(t)) for t in targets)


def realise_groups(model: nn.Module, wg: WidthGraph, analyses: Mapping[str, StateAnalysis],
                   widths: Mapping[str, int], init: str, selection: str = "leverage", refit: bool = True,
                   ridge: float = 1e-6, seed: int = 0) -> nn.Module:
    """``model`` with group ``g`` ``widths[g]`` atoms wide (eval mode).

    ``init="warm"``: :func:`group_cuts` (keeping everything reproduces the original); ``init="scratch"``: the
    first ``widths[g]`` atoms, then every layer freshly initialised (:func:`reinitialise`, seeded).
    """
    if init == "scratch":
        cut = apply_cuts(wg, {n: Cut(list(range(w))) for n, w in widths.items()})
        reinitialise(cut, seed)
    elif init == "warm":
        cuts = group_cuts(wg, analyses, widths, selection, refit, ridge)
        cut = apply_cuts(wg, cuts)
    else:
        raise CompressionError(f"init must be 'warm' or 'scratch', got {init!r}")
    return as_sequential(model, cut).eval()
