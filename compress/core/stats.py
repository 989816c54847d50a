"""Second moments E[x xᵀ] of layer input rows, per group, collected with forward hooks.

A Linear layer's rows are all leading positions of its input; a ConvNd layer's rows are its im2col patches
(batch × output positions, stride/padding/dilation respected). Rows are unfolded in chunks so the extra
memory stays under a cap; each chunk's product XᵀX runs in :data:`DEFAULT_STATS_DTYPE` unless asked otherwise, and
the chunks are accumulated in float64 on the CPU. Under a process group
(:mod:`compress.core.distributed`) each rank runs its shard of the data and the sums and row counts are
all-reduced, so every rank ends with the statistics of all the data.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .options import DEFAULT_STATS_DTYPE, STATS_DTYPE_NAMES
from .data import Dataset
from .distributed import all_reduce_max, all_reduce_sum, shard, sum_count
from .errors import require_finite
from .evaluate import eval_mode, hooks_removed
from .lowrank import matrix_view
from .progress import tracked
from .inputs import call

__all__ = ["MomentStats", "conv_patches", "layer_rows", "collect_moments", "STATS_DTYPES", "DEFAULT_STATS_DTYPE"]

log = logging.getLogger(__name__)

STATS_DTYPES = {name: getattr(torch, name) for name in STATS_DTYPE_NAMES}


@dataclass
class MomentStats:
    """Running sum of xxᵀ per group, shape (groups, d, d) float64, over ``rows`` rows."""

    groups: int
    fan_in: int
    total: torch.Tensor = None  # type: ignore[assignment]
    rows: int = 0
    chunks: int = 0
    over_cap: bool = False

    def __post_init__(self) -> None:
        if self.total is None:
            self.total = torch.zeros(self.groups, self.fan_in, self.fan_in, dtype=torch.float64)

    @property
    def moment(self) -> torch.Tensor:
        """E[xxᵀ] per group."""
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


def _samples_per_chunk(layer: nn.Module, x: torch.Tensor, cap: int, dtype: torch.dtype) -> int:
    """How many samples of ``x`` to unfold at once so the unfolded rows (and their cast) stay under ``cap``."""
    rows = layer_rows(layer, x[:1])
    per_sample = rows.numel() * (x.element_size() + torch.finfo(dtype).bits // 8)
    return max(1, cap // max(per_sample, 1))


def _accumulate(stats: MomentStats, layer: nn.Module, x: torch.Tensor, cap: int, dtype: torch.dtype) -> None:
    x = x.detach()
    if x.dim() == 0 or len(x) == 0:
        return
    step = _samples_per_chunk(layer, x, cap, dtype)
    g, d = stats.groups, stats.fan_in
    for start in range(0, len(x), step):
        rows = layer_rows(layer, x[start:start + step]).to(dtype)
        stats.over_cap |= step == 1 and rows.numel() * (x.element_size() + rows.element_size()) > cap
        grouped = rows.reshape(-1, g, d).transpose(0, 1)  # (g, n, d)
        stats.total += torch.bmm(grouped.transpose(1, 2), grouped).double()
        stats.rows += rows.shape[0]
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

    def hook(self, name: str):
        layer = self.layers[name]

        def pre_hook(_mod: nn.Module, args: tuple) -> None:
            require_finite(args[0], name, "input activations")
            _accumulate(self.stats[name], layer, args[0], self.cap, self.dtype)
        return pre_hook


@torch.no_grad()
def collect_moments(model: nn.Module, layers: dict[str, nn.Module], data: Dataset, batch_size: int = 32,
                    memory_cap_bytes: int = 1 << 30, dtype: str = DEFAULT_STATS_DTYPE) -> dict[str, MomentStats]:
    """Uncentered second moments of each named layer's input rows over ``data`` (model in eval mode).

    Args:
        model: the model to run; ``layers`` are its submodules by qualified name.
        batch_size: samples per forward pass.
        memory_cap_bytes: bound on the unfolded rows (and their cast) held at once per layer.
        dtype: precision of the per-chunk products XᵀX (default :data:`DEFAULT_STATS_DTYPE`; "float64" where an
            identity is checked); accumulation across chunks is always float64.

    Under a process group each rank runs its :func:`~compress.core.distributed.shard` of ``data`` and the
    sums and counts are all-reduced (every rank must call this with the same arguments).
    """
    if dtype not in STATS_DTYPES:
        raise ValueError(f"unknown statistics dtype {dtype!r}; choose one of {sorted(STATS_DTYPES)}")
    col = _Collector(layers, memory_cap_bytes, STATS_DTYPES[dtype])
    for name, layer in layers.items():
        v = matrix_view(layer)
        col.stats[name] = MomentStats(v.groups, v.fan_in)
    hooks = [layer.register_forward_pre_hook(col.hook(name)) for name, layer in layers.items()]
    local = shard(data)
    with hooks_removed(hooks), eval_mode(model):
        total = -(-len(local) // batch_size)
        for xb in tracked(local.inputs(batch_size), total, "input statistics (batches)", log):
            call(model, xb)
    for name, st in col.stats.items():
        _all_reduce(st)
        require_finite(st.total, name, f"input second moments ({dtype} products)")
    return col.stats
