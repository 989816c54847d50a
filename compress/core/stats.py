"""Second moments E[x xᵀ] of layer input rows, or E[y₀ y₀ᵀ] of bias-free output rows, per group, collected with
forward hooks.

A Linear layer's rows are all leading positions of its input; a ConvNd layer's rows are its im2col patches
(batch × output positions, stride/padding/dilation respected). A stride-1, zero-padded, ungrouped convolution's
patch moments are summed from shifted views of its input instead (:func:`shifted_moments`: exact, 1.3–2.4× faster
on ResNet-20's layers); the others are unfolded. A layer asked for on the output side gets the Gram of its output
rows without the bias instead, y₀ = W x (out/groups per group and row, one row per output position): W E[x xᵀ] Wᵀ
from its forward output, without the d × d moment or the im2col rows. Samples are processed in chunks so the extra
memory stays under a cap; each chunk's products run in :data:`DEFAULT_STATS_DTYPE` unless asked otherwise, and the
chunks are accumulated in float64 on the CPU. Under a process group
(:mod:`minreal.compress.core.distributed`) each rank runs its shard of the data and the sums and row counts are
all-reduced, so every rank ends with the statistics of all the data.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from .data import Dataset
from .distributed import all_reduce_max, all_reduce_sum, shard, sum_count
from .errors import require_finite
from .evaluate import eval_mode, hooks_removed
from .inputs import call
from .lowrank import matrix_view
from .options import DEFAULT_STATS_DTYPE, STATS_DTYPE_NAMES
from .progress import tracked

__all__ = ["MomentStats", "conv_patches", "layer_rows", "layer_output_rows", "shifted_moments", "collect_moments",
           "SIDES", "STATS_DTYPES"]

log = logging.getLogger(__name__)

STATS_DTYPES = {name: getattr(torch, name) for name in STATS_DTYPE_NAMES}
SIDES = ("input", "output")
"""What a :class:`MomentStats` sums: the layer's input rows x (size fan_in) or its bias-free output rows y₀ = W x
(size out/groups)."""


@dataclass
class MomentStats:
    """Running sum of zzᵀ per group, shape (groups, size, size) float64, over ``rows`` rows z: the layer's input rows
    (``side`` "input", size = fan_in) or its bias-free output rows (``side`` "output", size = out/groups)."""

    groups: int
    size: int
    side: str = "input"
    total: torch.Tensor = None  # type: ignore[assignment]
    rows: int = 0
    chunks: int = 0
    over_cap: bool = False

    def __post_init__(self) -> None:
        if self.side not in SIDES:
            raise ValueError(f"MomentStats side must be one of {SIDES}, got {self.side!r}")
        if self.total is None:
            self.total = torch.zeros(self.groups, self.size, self.size, dtype=torch.float64)

    @property
    def moment(self) -> torch.Tensor:
        """E[zzᵀ] per group: E[xxᵀ] on the input side, the output Gram E[y₀y₀ᵀ] = W E[xxᵀ] Wᵀ on the output side."""
        return self.total / max(self.rows, 1)


def _conv_padding(layer: nn.modules.conv._ConvNd) -> list[int]:
    """F.pad amounts (last spatial dim first) for int or 'same'/'valid' padding."""
    k, dil = layer.kernel_size, layer.dilation
    if isinstance(layer.padding, str):
        if layer.padding == "valid":
            return [0] * (2 * len(k))
        pads = [(dil[i] * (k[i] - 1) // 2, dil[i] * (k[i] - 1) - dil[i] * (k[i] - 1) // 2) for i in range(len(k))]
    else:
        pads = [(p, p) for p in layer.padding]
    return [v for pair in reversed(pads) for v in pair]


def conv_patches(layer: nn.modules.conv._ConvNd, x: torch.Tensor) -> torch.Tensor:
    """im2col of a Conv1d/2d/3d input: (batch · output positions, C_in · prod(kernel)), weight column order."""
    nd = len(layer.kernel_size)
    pad = _conv_padding(layer)
    if any(pad):
        mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
        x = F.pad(x, pad, mode=mode)
    for i in range(nd):
        span = layer.dilation[i] * (layer.kernel_size[i] - 1) + 1
        x = x.unfold(2 + i, span, layer.stride[i])  # appends a window dim
        if layer.dilation[i] > 1:
            x = x[..., :: layer.dilation[i]]
    # x: (B, C, O_1..O_nd, k_1..k_nd) -> (B, O_1..O_nd, C, k_1..k_nd)
    perm = [0, *range(2, 2 + nd), 1, *range(2 + nd, 2 + 2 * nd)]
    x = x.permute(perm)
    return x.reshape(-1, layer.in_channels * math.prod(layer.kernel_size))


def layer_rows(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The rows each output row of ``layer`` is computed from: (rows, groups · fan_in)."""
    if isinstance(layer, nn.Linear):
        return x.reshape(-1, layer.in_features)
    return conv_patches(layer, x)


def layer_output_rows(layer: nn.Module, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bias-free output rows y₀ = y − b of a Linear (any leading dims) or ConvNd output ``y``, in ``dtype``:
    (rows, out_features) or (batch · output positions, out_channels), rows in the order of :func:`layer_rows`."""
    if isinstance(layer, nn.Linear):
        rows = y.reshape(-1, layer.out_features).to(dtype)
    else:
        rows = y.movedim(1, -1).reshape(-1, layer.out_channels).to(dtype)
    return rows if layer.bias is None else rows - layer.bias.detach().to(dtype)


def _shift_structured(layer: nn.Module) -> bool:
    """Whether ``layer``'s patch moments are summed from shifted views of its input (:func:`shifted_moments`): a
    stride-1, zero-padded, ungrouped ConvNd whose kernel covers more than one position."""
    return (isinstance(layer, nn.modules.conv._ConvNd) and not layer.transposed and layer.padding_mode == "zeros"
            and layer.groups == 1 and all(s == 1 for s in layer.stride) and math.prod(layer.kernel_size) > 1)


@dataclass(frozen=True)
class _Axis:
    """One spatial axis of a stride-1 convolution: input size, left zero padding, output size, dilation."""

    size: int
    left: int
    out: int
    dilation: int

    def common(self, shift: int) -> tuple[int, int]:
        """Input positions i with i and i + shift both inside the input: [lo, hi)."""
        return max(0, -shift), min(self.size, self.size - shift)

    def trimmed(self, offset: int, shift: int) -> list[int] | None:
        """Positions of :meth:`common` that kernel offset ``offset`` never reads for any output position, or
        ``None`` when it reads none of them."""
        lo, hi = self.common(shift)
        first = offset * self.dilation - self.left  # the input position read at output position 0
        start, stop = max(lo, first), min(hi, first + self.out)
        if start >= stop:
            return None
        return [*range(lo, start), *range(stop, hi)]


def _axes(layer: nn.modules.conv._ConvNd, spatial: Sequence[int]) -> list[_Axis]:
    """The :class:`_Axis` of each spatial axis of ``layer`` on inputs of size ``spatial``."""
    pad, nd = _conv_padding(layer), len(spatial)  # F.pad order: last axis first, (left, right) pairs
    return [_Axis(size, pad[2 * (nd - 1 - i)], max(0, size + pad[2 * (nd - 1 - i)] + pad[2 * (nd - 1 - i) + 1]
                                                   - layer.dilation[i] * (layer.kernel_size[i] - 1)), layer.dilation[i])
            for i, size in enumerate(spatial)]


@dataclass(frozen=True)
class _Slab:
    """Edge positions of a shift to subtract (or add back) for a subset of axes: per axis of ``axes``, the positions
    and each kernel offset pair's membership of them (pairs × positions)."""

    axes: tuple[int, ...]
    positions: tuple[torch.Tensor, ...]
    members: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class _Shift:
    """One kernel shift Δ ≥ 0 of :func:`shifted_moments`: its flat row offset, the kernel offset pairs (δ, δ+Δ) it
    fills (flat indices), which of them read any position, and its edge slabs (one per subset of the axes with
    trimmed edges)."""

    offset: int
    pairs: tuple[tuple[int, int], ...]
    valid: torch.Tensor
    slabs: tuple[_Slab, ...]


@functools.lru_cache(maxsize=256)  # a pure function of hashable geometry: one plan per layer shape, not per batch
def _shift_plan(kernel: tuple[int, ...], axes: tuple[_Axis, ...],
                dtype: torch.dtype) -> tuple[tuple[int, ...], tuple[_Shift, ...]]:
    """The padded spatial shape and the shifts of a stride-1 convolution on inputs of one spatial size (cached:
    every batch of a layer has the same)."""
    reach = [(n - 1) * a.dilation for n, a in zip(kernel, axes)]
    padded = [a.size + r for a, r in zip(axes, reach)]  # reach zeros after each line keep shifts off other lines
    strides = [math.prod(padded[i + 1:]) for i in range(len(kernel))]
    offsets = list(itertools.product(*(range(n) for n in kernel)))
    index = {o: i for i, o in enumerate(offsets)}
    shifts = []
    for shift in itertools.product(*(range(1 - n, n) for n in kernel)):
        if shift < (0,) * len(kernel):
            continue
        pix = [t * a.dilation for t, a in zip(shift, axes)]
        starts = [o for o in offsets if tuple(map(sum, zip(o, shift))) in index]
        trims = [[ax.trimmed(o, p) for ax, o, p in zip(axes, off, pix)] for off in starts]
        edges = [sorted({i for ts in trims if ts[n] is not None for i in ts[n]}) for n in range(len(axes))]
        slabs = tuple(_Slab(sub, tuple(torch.tensor(edges[n]) for n in sub),
                            tuple(torch.tensor([[float(e in (ts[n] or ())) for e in edges[n]] for ts in trims],
                                               dtype=dtype) for n in sub))
                      for sub in _subsets([n for n, e in enumerate(edges) if e]))
        shifts.append(_Shift(sum(p * st for p, st in zip(pix, strides)),
                             tuple((index[o], index[tuple(map(sum, zip(o, shift)))]) for o in starts),
                             torch.tensor([all(t is not None for t in ts) for ts in trims], dtype=dtype), slabs))
    return tuple(padded), tuple(shifts)


def shifted_moments(layer: nn.modules.conv._ConvNd, x: torch.Tensor,
                    dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, int]:
    """Σ ppᵀ over the im2col patches p of a stride-1, zero-padded, ungrouped ConvNd input, without unfolding.

    The block of kernel offsets (δ, δ+Δ) is Σ x(i) x(i+Δ)ᵀ over the input positions i that offset δ reads and
    whose shift by Δ lies inside the input. The input is followed by the kernel's reach of zeros along every axis
    and flattened channels-last, so every shift Δ is one offset s of the flat rows that lands on a zero wherever
    i+Δ leaves the input: the sum over all common positions is a single product X[:R]ᵀ X[s:s+R], and the edge
    slabs an offset δ never reads are subtracted by inclusion–exclusion over the axes. Only shifts Δ ≥ 0
    (lexicographically) are computed; the others are transposes. Cost: about (2k−1)ⁿ/2 products of C×C over the
    input instead of one (Ckⁿ)² over the patches.

    Returns
    -------
    tuple[torch.Tensor, int]
        The sum, (1, fan_in, fan_in) in ``dtype`` in the column order of :func:`conv_patches`, and the number of
        patches summed.
    """
    if not _shift_structured(layer):
        raise ValueError(f"shifted_moments takes a stride-1, zero-padded, ungrouped convolution with a kernel of more "
                         f"than one position, not {layer}; use layer_rows")
    ks, c = tuple(layer.kernel_size), x.shape[1]
    axes = tuple(_axes(layer, x.shape[2:]))
    padded, shifts = _shift_plan(ks, axes, dtype)
    shape = (len(x), *padded)
    rows = math.prod(shape)
    flat = x.new_zeros(rows + max(s.offset for s in shifts) + 1, c, dtype=dtype)  # zeros: padding and tail
    flat[:rows].view(*shape, c)[(slice(None), *(slice(0, n) for n in x.shape[2:]))] = x.movedim(1, -1)
    k = math.prod(ks)
    total = torch.empty(k, k, c, c, dtype=dtype)  # every block is written below
    for shift in shifts:
        blocks = _shift_blocks(flat[:rows], flat[shift.offset:shift.offset + rows], shape, shift)
        i, j = (torch.tensor(v) for v in zip(*shift.pairs))
        total[j, i] = blocks.transpose(1, 2)
        total[i, j] = blocks
    return total.permute(2, 0, 3, 1).reshape(1, c * k, c * k), len(x) * math.prod(a.out for a in axes)


def _shift_blocks(a: torch.Tensor, b: torch.Tensor, shape: tuple[int, ...], shift: _Shift) -> torch.Tensor:
    """Σ x(i) x(i+Δ)ᵀ (pairs, C, C) over the positions each kernel offset pair of ``shift`` reads; ``a`` and ``b``
    are the flat padded rows at i and at i+Δ, ``shape`` their batch and padded spatial shape."""
    out = (a.T @ b).expand(len(shift.pairs), -1, -1)
    grid_a, grid_b = a.reshape(*shape, -1), b.reshape(*shape, -1)
    letters = "hijklm"[: len(shape) - 1]
    for edge in shift.slabs:
        sa, sb = grid_a, grid_b
        for n, p in zip(edge.axes, edge.positions):
            sa, sb = sa.index_select(1 + n, p), sb.index_select(1 + n, p)
        slab = torch.einsum(f"z{letters}c,z{letters}d->{''.join(letters[n] for n in edge.axes)}cd", sa, sb)
        for step, member in enumerate(edge.members):  # sum each pair's trimmed positions, one axis at a time
            slab = torch.einsum("e...,oe->o..." if step == 0 else "oe...,oe->o...", slab, member)
        out = out + (-1) ** len(edge.axes) * slab
    return out * shift.valid[:, None, None]


def _subsets(axes: list[int]) -> list[tuple[int, ...]]:
    """Every non-empty subset of ``axes``, smallest first."""
    return [sub for r in range(1, len(axes) + 1) for sub in itertools.combinations(axes, r)]


def _bytes_per_sample(layer: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> int:
    """Extra memory one sample of ``x`` takes while its moments are summed: its rows and their cast, or for a
    shift-structured convolution (:func:`shifted_moments`) its zero-padded channels-last copy."""
    width = torch.finfo(dtype).bits // 8
    if _shift_structured(layer):
        reach = [(n - 1) * d for n, d in zip(layer.kernel_size, layer.dilation)]
        return x.shape[1] * math.prod(n + r for n, r in zip(x.shape[2:], reach)) * width
    return layer_rows(layer, x[:1]).numel() * (x.element_size() + width)


def _accumulate(stats: MomentStats, layer: nn.Module, x: torch.Tensor, cap: int, dtype: torch.dtype) -> None:
    """Add the rows of ``x`` (the layer's input, or its output for ``side`` "output") to ``stats``, in chunks of
    samples whose extra memory stays under ``cap``."""
    x = x.detach()
    if x.dim() == 0 or len(x) == 0:
        return
    output = stats.side == "output"
    shifted = not output and _shift_structured(layer)
    if output:  # the cast rows and the bias-free copy
        per_sample = x[:1].numel() * (x.element_size() + 2 * (torch.finfo(dtype).bits // 8))
    else:
        per_sample = _bytes_per_sample(layer, x, dtype)
    step = max(1, cap // max(per_sample, 1))
    stats.over_cap |= step == 1 and per_sample > cap
    g, d = stats.groups, stats.size
    for start in range(0, len(x), step):
        chunk = x[start:start + step]
        if shifted:
            total, rows = shifted_moments(layer, chunk, dtype)
        else:
            flat = layer_output_rows(layer, chunk, dtype) if output else layer_rows(layer, chunk).to(dtype)
            grouped = flat.reshape(-1, g, d).transpose(0, 1)  # (g, n, d)
            total, rows = torch.bmm(grouped.transpose(1, 2), grouped), grouped.shape[1]
        stats.total += total.double()
        stats.rows += rows
        stats.chunks += 1


def _all_reduce(stats: MomentStats) -> None:
    """Sums, row and chunk counts over the ranks (a no-op in one process)."""
    all_reduce_sum(stats.total)
    stats.rows, stats.chunks = sum_count(stats.rows), sum_count(stats.chunks)
    stats.over_cap = bool(all_reduce_max(torch.tensor([int(stats.over_cap)], dtype=torch.int64)).item())


@dataclass
class _Collector:
    layers: dict[str, nn.Module]
    cap: int
    dtype: torch.dtype
    stats: dict[str, MomentStats] = field(default_factory=dict)

    def hook(self, name: str) -> RemovableHandle:
        """Register on ``name``'s layer the pre-hook (input side) or forward hook (output side) that adds each call's
        rows to its sums; returns the hook's handle."""
        layer, stats = self.layers[name], self.stats[name]

        def pre_hook(_mod: nn.Module, args: tuple) -> None:
            require_finite(args[0], name, "input activations")
            _accumulate(stats, layer, args[0], self.cap, self.dtype)

        def out_hook(_mod: nn.Module, _args: tuple, out: torch.Tensor) -> None:
            require_finite(out, name, "output activations")
            unbatched = out.dim() == (1 if isinstance(layer, nn.Linear) else 1 + len(layer.kernel_size))
            _accumulate(stats, layer, out[None] if unbatched else out, self.cap, self.dtype)

        if stats.side == "output":
            return layer.register_forward_hook(out_hook)
        return layer.register_forward_pre_hook(pre_hook)


@torch.no_grad()
def collect_moments(model: nn.Module, layers: dict[str, nn.Module], data: Dataset, batch_size: int = 32,
                    memory_cap_bytes: int = 1 << 30, dtype: str = DEFAULT_STATS_DTYPE,
                    output_side: Collection[str] = ()) -> dict[str, MomentStats]:
    """Uncentered second moments of each named layer's input rows over ``data`` (model in eval mode), or for the
    layers named in ``output_side`` the Gram of their bias-free output rows, in the same pass.

    Parameters
    ----------
    model : nn.Module
        the model to run; ``layers`` are its submodules by qualified name.
    batch_size : int
        samples per forward pass.
    memory_cap_bytes : int
        bound on the extra memory held at once per layer (unfolded rows and their cast, or a
        padded copy of the input; for the output side, the output rows cast and without the bias).
    dtype : str
        precision of the per-chunk products XᵀX (default :data:`DEFAULT_STATS_DTYPE`; "float64" where an
        identity is checked); accumulation across chunks is always float64.
    output_side : Collection[str]
        names of ``layers`` whose output Gram E[y₀y₀ᵀ] (groups, out/groups, out/groups) is summed from a forward
        hook instead (:attr:`MomentStats.side` "output"): no d × d moment, no im2col rows.

    Under a process group each rank runs its :func:`~minreal.compress.core.distributed.shard` of ``data`` and the
    sums and counts are all-reduced (every rank must call this with the same arguments).
    """
    if dtype not in STATS_DTYPES:
        raise ValueError(f"unknown statistics dtype {dtype!r}; choose one of {sorted(STATS_DTYPES)}")
    unknown = sorted(set(output_side) - layers.keys())
    if unknown:
        raise ValueError(f"output_side names layers not in `layers`: {', '.join(unknown)}")
    col = _Collector(layers, memory_cap_bytes, STATS_DTYPES[dtype])
    for name, layer in layers.items():
        v = matrix_view(layer)
        col.stats[name] = (MomentStats(v.groups, v.out_per_group, "output") if name in output_side
                           else MomentStats(v.groups, v.fan_in))
    hooks = [col.hook(name) for name in layers]
    local = shard(data)
    with hooks_removed(hooks), eval_mode(model):
        total = -(-len(local) // batch_size)
        for xb in tracked(local.inputs(batch_size), total, "input statistics (batches)", log):
            call(model, xb)
    for name, st in col.stats.items():
        _all_reduce(st)
        require_finite(st.total, name, f"{st.side} second moments ({dtype} products)")
    return col.stats
