"""Surgery for the C-balanced method: resize the stages of a plain sequential network to new widths.

A *stage* of an ``nn.Sequential`` is the run of modules from a Linear/Conv (the producer) up to and
including the state point (its activation); its width is the producer's output features/channels.
Supported: MLPs (``[Flatten], (Linear, act)*, Linear``) and plain CNNs (``(Conv, [BN], act)*, pool, Flatten,
Linear``), and torchvision-style ResNets of basic blocks, resized per stage (``layer1…layer4``).
Resizing either initialises fresh layers (from scratch) or copies a kept subset of neurons
(warm start), optionally refitting each following Linear layer by least squares on calibration activations.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import nn

from ...core.errors import CompressionError
from ...core.linalg import ridge_lstsq

__all__ = ["stage_producers", "resize_sequential", "sequential_params", "uniform_width",
           "refit_linear_chain", "top_indices", "insert_projections", "RESNET_STAGES", "is_basic_resnet",
           "resnet_stage_width", "resize_resnet", "resnet_params"]

_PRODUCERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
RESNET_STAGES = ("layer1", "layer2", "layer3", "layer4")
_BASIC_PARTS = ("conv1", "bn1", "conv2", "bn2", "downsample")


def _sequential(model: nn.Module) -> nn.Sequential:
    if not isinstance(model, nn.Sequential):
        raise CompressionError(f"realisation supports nn.Sequential MLPs and plain CNNs, got {type(model).__name__};"
                               " ResNets of basic blocks are realised too; other graphs are not yet"
                               " (use the Gramian analysis only)")
    return model


def stage_producers(model: nn.Module, points: Sequence[str]) -> dict[str, int]:
    """Map each state point (a direct child name) to the index of the Linear/Conv producing its width."""
    seq = _sequential(model)
    names = [n for n, _ in seq.named_children()]
    out = {}
    for p in points:
        if p not in names:
            raise CompressionError(f"state point {p!r} is not a direct child of the Sequential model")
        idx = names.index(p)
        prod = [i for i in range(idx) if isinstance(seq[i], _PRODUCERS)]
        if not prod:
            raise CompressionError(f"no Linear/Conv layer precedes state point {p!r}")
        out[p] = prod[-1]
    last = [i for i, m in enumerate(seq) if isinstance(m, _PRODUCERS)][-1]
    if last in out.values():
        raise CompressionError("the output layer cannot be a state point producer")
    return out


def _out_width(m: nn.Module) -> int:
    return m.out_features if isinstance(m, nn.Linear) else m.out_channels


def _new_producer(m: nn.Module, cin: int, cout: int) -> nn.Module:
    if isinstance(m, nn.Linear):
        return nn.Linear(cin, cout, bias=m.bias is not None)
    if m.groups != 1:
        raise CompressionError(f"grouped convolution {m} cannot be resized; only groups=1 is supported")
    return type(m)(cin, cout, m.kernel_size, m.stride, m.padding, m.dilation, 1, m.bias is not None, m.padding_mode)


def _copy_slice(new: nn.Module, old: nn.Module, rows: torch.Tensor, cols: torch.Tensor | None) -> None:
    with torch.no_grad():
        w = old.weight[rows]
        new.weight.copy_(w if cols is None else w[:, cols])
        if old.bias is not None:
            new.bias.copy_(old.bias[rows])


def resize_sequential(model: nn.Module, widths: Mapping[int, int],
                      keep: Mapping[int, torch.Tensor] | None = None) -> nn.Sequential:
    """A new Sequential with producer ``i`` emitting ``widths[i]`` features/channels.

    Without ``keep`` the resized layers (and BatchNorms) are freshly initialised; with ``keep`` (producer index →
    kept output indices, ``len == widths[i]``) every layer copies the kept rows/columns of the original.
    """
    seq = _sequential(model)
    layers: list[nn.Module] = []
    cin_keep: torch.Tensor | None = None  # kept indices of the current feature axis (None = all)
    width: int | None = None
    spatial = False
    for i, m in enumerate(seq):
        if isinstance(m, _PRODUCERS):
            cin = m.in_features if isinstance(m, nn.Linear) else m.in_channels
            cin = cin if width is None else width
            cout = widths.get(i, _out_width(m))
            new = _new_producer(m, cin, cout)
            if keep is not None:
                rows = keep[i] if i in keep else torch.arange(_out_width(m))
                _copy_slice(new, m, rows, cin_keep)
                cin_keep = keep.get(i)
            width = cout
            layers.append(new)
        elif isinstance(m, _NORMS):
            new = type(m)(width, m.eps, m.momentum, m.affine, m.track_running_stats)
            if keep is not None and cin_keep is not None:
                new.load_state_dict({k: (v[cin_keep] if v.dim() else v) for k, v in m.state_dict().items()})
            elif keep is not None:
                new.load_state_dict(m.state_dict())
            layers.append(new)
        elif isinstance(m, nn.Flatten) and spatial:
            raise CompressionError("a Flatten after a feature map needs a global pool before it to be resized")
        else:
            layers.append(copy.deepcopy(m))
        spatial = _spatial_after(m, spatial)
    return nn.Sequential(*layers)


def _spatial_after(m: nn.Module, spatial: bool) -> bool:
    """Whether the tensor after ``m`` still has spatial axes (a global pool to size 1 removes them)."""
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return True
    pools = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)
    if isinstance(m, pools):
        sizes = m.output_size if isinstance(m.output_size, tuple) else (m.output_size,)
        return not all(s == 1 for s in sizes)
    return spatial


def sequential_params(model: nn.Module, widths: Mapping[int, int]) -> int:
    """Parameter count of ``resize_sequential(model, widths)`` without building it."""
    seq = _sequential(model)
    total, width = 0, None
    for i, m in enumerate(seq):
        if isinstance(m, _PRODUCERS):
            cin = (m.in_features if isinstance(m, nn.Linear) else m.in_channels) if width is None else width
            cout = widths.get(i, _out_width(m))
            k = 1 if isinstance(m, nn.Linear) else int(torch.tensor(m.kernel_size).prod())
            total += cin * cout * k + (cout if m.bias is not None else 0)
            width = cout
        elif isinstance(m, _NORMS):
            total += 2 * width if m.affine else 0
        else:
            total += sum(p.numel() for p in m.parameters())
    return total


def uniform_width(model: nn.Module, producers: Sequence[int], target_params: int) -> int:
    """The single width for all ``producers`` whose parameter count is closest to ``target_params``."""
    hi = 4 * max(_out_width(_sequential(model)[i]) for i in producers) + 1
    cost = lambda w: abs(sequential_params(model, {i: w for i in producers}) - target_params)  # noqa: E731
    return min(range(1, hi + 1), key=cost)


def top_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest scores, in ascending index order."""
    return torch.topk(scores, k).indices.sort().values


@torch.no_grad()
def refit_linear_chain(original: nn.Sequential, realised: nn.Sequential, x: torch.Tensor,
                       producers: Sequence[int], keep: Mapping[int, torch.Tensor], ridge: float = 1e-6) -> None:
    """Least-squares refit, in place, of each Linear after the first so the realised pre-activations match
    the original's at the kept neurons (all outputs for the last layer); ridge λ = ridge·tr(AᵀA)/cols.

    Layer by layer: A = [h̃_{l−1}, 1] from the realised prefix, target = original pre-activation[:, S_l].
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
            w, b = ridge_lstsq(h_new_in.double(), target.double(), ridge)
            realised[i].weight.copy_(w.to(realised[i].weight.dtype))
            realised[i].bias.copy_(b.to(realised[i].bias.dtype))
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


def is_basic_resnet(model: nn.Module) -> bool:
    """Whether ``model`` is laid out like torchvision's ResNet with ``BasicBlock`` (stem, layer1…4, fc)."""
    kids = dict(model.named_children())
    if not all(k in kids for k in ("conv1", "bn1", "fc", *RESNET_STAGES)):
        return False
    blocks = [b for s in RESNET_STAGES for b in kids[s].children()]
    return bool(blocks) and all(all(hasattr(b, a) for a in _BASIC_PARTS) and not hasattr(b, "conv3") for b in blocks)


def _basic_resnet(model: nn.Module) -> nn.Module:
    if not is_basic_resnet(model):
        raise CompressionError(f"{type(model).__name__} is not a ResNet of basic blocks (stem, layer1…layer4, fc)")
    return model


def resnet_stage_width(model: nn.Module, stage: str) -> int:
    """Output channels of a ResNet stage (its last block's second BatchNorm)."""
    return list(model.get_submodule(stage).children())[-1].bn2.num_features


@dataclass(frozen=True)
class _Resize:
    """One parameterised module of a resized ResNet: new sizes and the keep keys of its output/input channels."""

    path: str
    old: nn.Module
    cin: int
    cout: int
    rows: str | None
    cols: str | None


def _resnet_plan(model: nn.Module, widths: Mapping[str, int]) -> list[_Resize]:
    """Every Conv/BN/Linear of the resized ResNet. A stage's width is shared by all its blocks (inner conv1
    width included), their projections and the residual stream; an identity-shortcut first block of layer1
    ties the stem to that width. Keep keys: stage name (stream channels), block path (inner channels)."""
    width = {s: widths.get(s, resnet_stage_width(model, s)) for s in RESNET_STAGES}
    tied = model.layer1[0].downsample is None
    stem_w, key = (width["layer1"], "layer1") if tied else (model.conv1.out_channels, None)
    plan = [_Resize("conv1", model.conv1, model.conv1.in_channels, stem_w, key, None),
            _Resize("bn1", model.bn1, stem_w, stem_w, key, None)]
    c = stem_w
    for s in RESNET_STAGES:
        w = width[s]
        for j, blk in enumerate(model.get_submodule(s).children()):
            p = f"{s}.{j}"
            if blk.downsample is None and c != w:
                raise CompressionError(f"block {p} has an identity shortcut from {c} to {w} channels; "
                                       "give its stage the width of the stream entering it")
            plan += [_Resize(f"{p}.conv1", blk.conv1, c, w, p, key), _Resize(f"{p}.bn1", blk.bn1, w, w, p, None),
                     _Resize(f"{p}.conv2", blk.conv2, w, w, s, p), _Resize(f"{p}.bn2", blk.bn2, w, w, s, None)]
            if blk.downsample is not None:
                conv, norm = blk.downsample[0], blk.downsample[1]
                plan += [_Resize(f"{p}.downsample.0", conv, c, w, s, key),
                         _Resize(f"{p}.downsample.1", norm, w, w, s, None)]
            c, key = w, s
    return plan + [_Resize("fc", model.fc, c, model.fc.out_features, None, key)]


def _fresh(m: nn.Module, cin: int, cout: int) -> nn.Module:
    if isinstance(m, _NORMS):
        return type(m)(cout, m.eps, m.momentum, m.affine, m.track_running_stats)
    return _new_producer(m, cin, cout)


def _count(m: nn.Module, cin: int, cout: int) -> int:
    if isinstance(m, _NORMS):
        return 2 * cout if m.affine else 0
    k = 1 if isinstance(m, nn.Linear) else int(torch.tensor(m.kernel_size).prod())
    return cin * cout * k + (cout if m.bias is not None else 0)


def _copy_into(new: nn.Module, old: nn.Module, rows: torch.Tensor | None, cols: torch.Tensor | None) -> None:
    if isinstance(old, _NORMS):
        state = old.state_dict()
        new.load_state_dict({k: (v[rows] if v.dim() and rows is not None else v) for k, v in state.items()})
    else:
        _copy_slice(new, old, torch.arange(_out_width(old)) if rows is None else rows, cols)


def resize_resnet(model: nn.Module, widths: Mapping[str, int],
                  keep: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
    """A copy of a basic-block ResNet with stage ``s`` (``layer1``…) ``widths[s]`` channels wide.

    Without ``keep`` every Conv/BN/Linear is freshly initialised; with ``keep`` (stage name → kept stream
    channels, block path such as ``"layer2.0"`` → kept inner channels; a missing key keeps all) each copies
    the kept rows/columns of the original, so keeping every channel reproduces the original function.
    """
    plan = _resnet_plan(_basic_resnet(model), widths)
    new = copy.deepcopy(model)
    for r in plan:
        m = _fresh(r.old, r.cin, r.cout)
        if keep is not None:
            _copy_into(m, r.old, keep.get(r.rows) if r.rows else None, keep.get(r.cols) if r.cols else None)
        parent, _, name = r.path.rpartition(".")
        setattr(new.get_submodule(parent), name, m)
    return new


def resnet_params(model: nn.Module, widths: Mapping[str, int]) -> int:
    """Parameter count of ``resize_resnet(model, widths)`` without building it."""
    return sum(_count(r.old, r.cin, r.cout) for r in _resnet_plan(_basic_resnet(model), widths))
