"""Surgery for the C-balanced method on Sequential MLPs: resize the stages of a Linear + activation stack.

A *stage* of an ``nn.Sequential`` is the run of modules from a Linear (the producer) up to and including the
state point (its activation); its width is the producer's output features. Resizing either initialises fresh
layers (from scratch) or copies a kept subset of neurons (warm start), optionally refitting each following
Linear layer by least squares on calibration activations. Every other model is realised on the channel groups
of its traced graph (:mod:`.graph_realise`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ...core.errors import CompressionError
from ...core.linalg import ridge_lstsq

__all__ = ["is_mlp", "stage_producers", "resize_sequential", "sequential_params", "refit_linear_chain",
           "top_indices", "insert_projections"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_NORMS = (nn.BatchNorm1d,)


def is_mlp(model: nn.Module) -> bool:
    """Whether ``model`` is an ``nn.Sequential`` of Linear layers, activations and BatchNorm1d only (children)."""
    return isinstance(model, nn.Sequential) and any(isinstance(m, nn.Linear) for m in model) and \
        not any(isinstance(m, _CONVS) for m in model.modules()) and \
        all(not list(m.children()) for m in model)


def _sequential(model: nn.Module) -> nn.Sequential:
    if not is_mlp(model):
        raise CompressionError(f"this realisation supports nn.Sequential MLPs, got {type(model).__name__}; other "
                               "models are realised on the channel groups of their traced graph")
    return model


def stage_producers(model: nn.Module, points: Sequence[str]) -> dict[str, int]:
    """Map each state point (a direct child name) to the index of the Linear producing its width."""
    seq = _sequential(model)
    names = [n for n, _ in seq.named_children()]
    out = {}
    for p in points:
        if p not in names:
            raise CompressionError(f"state point {p!r} is not a direct child of the Sequential model")
        idx = names.index(p)
        prod = [i for i in range(idx) if isinstance(seq[i], nn.Linear)]
        if not prod:
            raise CompressionError(f"no Linear layer precedes state point {p!r}")
        out[p] = prod[-1]
    last = [i for i, m in enumerate(seq) if isinstance(m, nn.Linear)][-1]
    if last in out.values():
        raise CompressionError("the output layer cannot be a state point producer")
    return out


def _copy_slice(new: nn.Linear, old: nn.Linear, rows: torch.Tensor, cols: torch.Tensor | None) -> None:
    with torch.no_grad():
        w = old.weight[rows]
        new.weight.copy_(w if cols is None else w[:, cols])
        if old.bias is not None:
            new.bias.copy_(old.bias[rows])


def resize_sequential(model: nn.Module, widths: Mapping[int, int],
                      keep: Mapping[int, torch.Tensor] | None = None) -> nn.Sequential:
    """A new Sequential with Linear ``i`` emitting ``widths[i]`` features.

    Without ``keep`` the resized layers (and BatchNorms) are freshly initialised; with ``keep`` (producer index →
    kept output indices, ``len == widths[i]``) every layer copies the kept rows/columns of the original.
    """
    seq = _sequential(model)
    layers: list[nn.Module] = []
    cin_keep: torch.Tensor | None = None  # kept indices of the current feature axis (None = all)
    width: int | None = None
    for i, m in enumerate(seq):
        if isinstance(m, nn.Linear):
            cin = m.in_features if width is None else width
            cout = widths.get(i, m.out_features)
            new = nn.Linear(cin, cout, bias=m.bias is not None)
            if keep is not None:
                rows = keep[i] if i in keep else torch.arange(m.out_features)
                _copy_slice(new, m, rows, cin_keep)
                cin_keep = keep.get(i)
            width = cout
            layers.append(new)
        elif isinstance(m, _NORMS):
            new = type(m)(width, m.eps, m.momentum, m.affine, m.track_running_stats)
            if keep is not None:
                state = m.state_dict()
                new.load_state_dict(state if cin_keep is None else
                                    {k: (v[cin_keep] if v.dim() else v) for k, v in state.items()})
            layers.append(new)
        else:
            layers.append(copy.deepcopy(m))
    return nn.Sequential(*layers)


def sequential_params(model: nn.Module, widths: Mapping[int, int]) -> int:
    """Parameter count of ``resize_sequential(model, widths)`` without building it."""
    seq = _sequential(model)
    total, width = 0, None
    for i, m in enumerate(seq):
        if isinstance(m, nn.Linear):
            cin = m.in_features if width is None else width
            cout = widths.get(i, m.out_features)
            total += cin * cout + (cout if m.bias is not None else 0)
            width = cout
        elif isinstance(m, _NORMS):
            total += 2 * width if m.affine else 0
        else:
            total += sum(p.numel() for p in m.parameters())
    return total


def top_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest scores, in ascending index order."""
    return torch.topk(scores, k).indices.sort().values


@torch.no_grad()
def refit_linear_chain(original: nn.Sequential, realised: nn.Sequential, x: torch.Tensor,
                       producers: Sequence[int], keep: Mapping[int, torch.Tensor], ridge: float = 1e-6) -> None:
    """Least-squares refit, in place, of each Linear after the first so the realised pre-activations match
    the original's at the kept neurons (all outputs for the last layer); ridge λ = ridge·tr(AᵀA)/cols.

    Layer by layer: A = [h̃_{l−1}, 1] from the realised prefix (without the 1 for a Linear without a bias), target =
    original pre-activation[:, S_l].
    """
    linears = [i for i, m in enumerate(original) if isinstance(m, nn.Linear)]
    if len(linears) != len(producers) + 1 or any(not isinstance(original[i], nn.Linear) for i in producers):
        raise CompressionError("least-squares refit needs an MLP (Linear+activation stack)")
    h_orig, h_new = x, x
    start = 0
    for i in linears:
        h_orig_in, h_new_in = original[start:i](h_orig), realised[start:i](h_new)
        if i != linears[0]:
            target = original[i](h_orig_in)
            target = target[:, keep[i]] if i in keep else target
            bias = realised[i].bias  # a layer without one is fitted as a linear map: no bias is added
            w, b = ridge_lstsq(h_new_in.double(), target.double(), ridge, intercept=bias is not None)
            realised[i].weight.copy_(w.to(realised[i].weight.dtype))
            if bias is not None:
                bias.copy_(b.to(bias.dtype))
        h_orig, h_new = original[i](h_orig_in), realised[i](h_new_in)
        start = i + 1


def insert_projections(model: nn.Module, bases: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> nn.Module:
    """Diagnostic projected model: after each named state point ``p`` insert ĥ = μ + U Uᵀ(h − μ), ``bases[p] = (U, μ)``.

    Only for (N, d) states. Stored as two Linears per point, so it is *larger* than the original.
    """
    from ...core.surgery import get_module, replace_modules

    repl = {}
    for p, (u, mu) in bases.items():
        d, r = u.shape
        down, up = nn.Linear(d, r), nn.Linear(r, d)
        dtype = next(model.parameters()).dtype
        with torch.no_grad():
            down.weight.copy_(u.T.to(dtype))
            down.bias.copy_((-u.T @ mu).to(dtype))
            up.weight.copy_(u.to(dtype))
            up.bias.copy_(mu.to(dtype))
        repl[p] = nn.Sequential(copy.deepcopy(get_module(model, p)), down, up)
    return replace_modules(model, repl)
