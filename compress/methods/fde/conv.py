"""Channel view of a plain sequential CNN (``Conv2d [BN] act [pool] … Flatten Linear act … Linear``) for ``fde``.

A conv output channel is a "neuron" whose incoming coefficients are its whole filter ``W[i] ∈ R^{C_in×k×k}``
and bias (BatchNorm2d folded first): equal filters give equal feature maps, so :func:`~.partition.value_merge`
lumps channels exactly as it lumps neurons, summing the next layer's input blocks (a conv's input-channel
slices, or the ``H·W`` columns a Linear after Flatten reads from the channel). Everything between two layers
acts channelwise; the scaled criterion σ(ρz) = ρσ(z) needs it positively homogeneous: ReLU/LeakyReLU/identity,
MaxPool, AvgPool and AdaptiveAvgPool all are (MaxPool only for ρ > 0).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...core.chain import ACT_KINDS, ActSpec, _flat_modules, fold_bn_after
from ...core.errors import CompressionError
from ...core.report import LayerReport
from .partition import MergeStep, RefineResult, from_input_blocks, input_blocks

__all__ = ["ConvGeometry", "ConvChain", "is_conv_chain", "extract_conv_chain", "conv_chain_forward",
           "build_conv_sequential", "remove_zero_channels", "conv_layer_reports"]

_POOLS = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)
_BN = (nn.BatchNorm1d, nn.BatchNorm2d)


@dataclass(frozen=True)
class ConvGeometry:
    """Everything of a ``groups=1``, zero-padded Conv2d but its weights."""

    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int] | str
    dilation: tuple[int, int]

    @staticmethod
    def of(conv: nn.Conv2d) -> "ConvGeometry":
        if conv.groups != 1 or conv.padding_mode != "zeros":
            raise CompressionError(f"fde merges channels of Conv2d with groups=1 and zero padding; got groups="
                                   f"{conv.groups}, padding_mode={conv.padding_mode!r}")
        return ConvGeometry(conv.kernel_size, conv.stride, conv.padding, conv.dilation)


@dataclass
class ConvChain:
    """Layers ``l`` (Conv2d where ``geometry[l]`` is set, else Linear) with float64 ``weights``/``biases``;
    ``posts[l]`` are the modules between layer ``l`` and ``l + 1`` (its activation ``acts[l]``, pools,
    Flatten). ``groups[l][k]`` lists the original channels/neurons of layer ``l`` kept as its ``k``-th."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor]
    acts: list[ActSpec]
    posts: list[list[nn.Module]]
    geometry: list[ConvGeometry | None]
    groups: list[list[list[int]]]
    dtype: torch.dtype = torch.float32

    @property
    def widths(self) -> list[int]:
        """Channels of each hidden conv, then widths of the hidden Linears."""
        return [w.shape[0] for w in self.weights[:-1]]

    def merge_modes(self, l: int) -> tuple[bool, bool]:
        """(positively homogeneous, homogeneous for any sign) for the map after layer ``l``."""
        has_max = any(isinstance(m, nn.MaxPool2d) for m in self.posts[l])
        return self.acts[l].homogeneous, self.acts[l].linear and not has_max

    def copy(self) -> "ConvChain":
        return ConvChain([w.clone() for w in self.weights], [b.clone() for b in self.biases], list(self.acts),
                         self.posts, self.geometry, [[list(g) for g in layer] for layer in self.groups], self.dtype)


def is_conv_chain(model: nn.Module) -> bool:
    """Whether ``model`` has a Conv2d (and so takes the channel path of ``fde``)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def _layer(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor, ConvGeometry | None]:
    w = m.weight.detach().double().clone()
    b = m.bias.detach().double().clone() if m.bias is not None else torch.zeros(len(w), dtype=torch.float64)
    return w, b, ConvGeometry.of(m) if isinstance(m, nn.Conv2d) else None


def _place(m: nn.Module, post: list[nn.Module], acts: list[nn.Module | None], ws: list, bs: list,
           flat: bool) -> None:
    """Put a non-layer module after the last layer: fold BN, note the activation, keep pools/Flatten."""
    if isinstance(m, _BN) and not post:
        ws[-1], bs[-1] = fold_bn_after(ws[-1], bs[-1], m)
    elif type(m) in ACT_KINDS and acts[-1] is None:
        acts[-1] = m
        post.append(copy.deepcopy(m))
    elif isinstance(m, _POOLS + (nn.Flatten,)) and not flat:
        post.append(copy.deepcopy(m))
    elif not isinstance(m, nn.Dropout):
        raise CompressionError(f"fde merges channels of plain sequential CNNs (Conv2d [BatchNorm right after] "
                               f"activation [pool] … Flatten Linear …); cannot place {type(m).__name__}")


def extract_conv_chain(model: nn.Module) -> ConvChain:
    """Read a (nested) ``nn.Sequential`` CNN into a :class:`ConvChain`, folding BatchNorm into the layer before it."""
    ws, bs, geo, posts, acts = [], [], [], [], []
    for m in _flat_modules(model):
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            flat = any(isinstance(p, nn.Flatten) for post in posts for p in post)
            if isinstance(m, nn.Conv2d) == flat or (not ws and isinstance(m, nn.Linear)):
                raise CompressionError("expected Conv2d layers first, then Flatten, then Linear layers")
            w, b, g = _layer(m)
            ws.append(w); bs.append(b); geo.append(g); posts.append([]); acts.append(None)
        elif not ws:
            raise CompressionError(f"the CNN must start with a Conv2d, not {type(m).__name__}")
        else:
            _place(m, posts[-1], acts, ws, bs, any(isinstance(p, nn.Flatten) for post in posts for p in post))
    if geo[-1] is not None or posts[-1]:
        raise CompressionError("the CNN must end with an nn.Linear output layer")
    return ConvChain(ws, bs, [ActSpec.of(a) for a in acts[:-1]], posts[:-1], geo,
                     [[[i] for i in range(len(w))] for w in ws[:-1]], next(model.parameters()).dtype)


def conv_chain_forward(chain: ConvChain, x: torch.Tensor, hidden: bool = False
                       ) -> torch.Tensor | list[torch.Tensor]:
    """Evaluate in float64; with ``hidden`` return every layer's output after its post-modules."""
    h, states = x.double(), []
    for l, (w, b, g) in enumerate(zip(chain.weights, chain.biases, chain.geometry)):
        h = F.linear(h, w, b) if g is None else F.conv2d(h, w, b, g.stride, g.padding, g.dilation)
        for m in chain.posts[l] if l < len(chain.posts) else ():
            h = m(h)
        states.append(h)
    return states if hidden else h


def build_conv_sequential(chain: ConvChain) -> nn.Sequential:
    """Plain ``Conv2d``/``Linear`` layers with the chain's weights (in its dtype) and copies of the post-modules."""
    layers: list[nn.Module] = []
    for l, (w, b, g) in enumerate(zip(chain.weights, chain.biases, chain.geometry)):
        layer = nn.Linear(w.shape[1], len(w)) if g is None else nn.Conv2d(
            w.shape[1], len(w), g.kernel_size, g.stride, g.padding, g.dilation)
        with torch.no_grad():
            layer.weight.copy_(w)
            layer.bias.copy_(b)
        layers.append(layer.to(chain.dtype))
        layers += [copy.deepcopy(m) for m in (chain.posts[l] if l < len(chain.posts) else ())]
    return nn.Sequential(*layers).eval()


def remove_zero_channels(chain: ConvChain, x: torch.Tensor) -> RefineResult:
    """Drop channels/neurons that are exactly 0 (after their post-modules) everywhere on ``x`` (dead ReLUs).

    Exact on ``x`` for any next layer. Non-zero constant channels are kept: the next conv's zero padding
    makes folding a constant into its bias inexact at the borders.
    """
    result = RefineResult(chain)
    for l in range(len(chain.acts)):
        h = conv_chain_forward(chain, x, hidden=True)[l]
        zero = h.reshape(len(h), len(chain.weights[l]), -1).abs().amax((0, 2)) == 0
        zero[0] &= not bool(zero.all())  # keep one channel so the layer stays
        if not bool(zero.any()):
            continue
        keep = torch.nonzero(~zero).flatten()
        new = chain.copy()
        new.weights[l], new.biases[l] = chain.weights[l][keep], chain.biases[l][keep]
        c = input_blocks(chain.weights[l + 1], len(zero))
        new.weights[l + 1] = from_input_blocks(c[:, keep], chain.weights[l + 1])
        new.groups[l] = [chain.groups[l][int(k)] for k in keep]
        result.steps.append(MergeStep("constant", l, len(zero), len(keep)))
        chain = new
    result.chain = chain
    return result


def conv_layer_reports(before: ConvChain, after: ConvChain, details: list[dict]) -> list[LayerReport]:
    """One report per Conv2d/Linear of the emitted stack (``rank`` = output channels/width after)."""
    reports = []
    for l, (wb, wa, g) in enumerate(zip(before.weights, after.weights, before.geometry)):
        pb, pa = wb.numel() + len(wb), wa.numel() + len(wa)
        kind = "Linear" if g is None else "Conv2d"
        reports.append(LayerReport(f"{l}", kind, "merged" if wa.shape != wb.shape else "kept", "", pb, pa,
                                   wb.numel(), wa.numel(), len(wa), len(wb), details[l] if l < len(details) else {}))
    return reports
