"""The tiny case the checks shared by every method run fde on."""

from __future__ import annotations

import torch
from torch import nn

from ...core.smoke import SmokeCase, digits_subset


def duplicated_mlp() -> nn.Module:
    """64 → 48 → 10 ReLU MLP whose hidden layer is a 24-neuron layer with every neuron doubled (second copy
    perturbed by 1e-3, outgoing weights split), so ε-merging halves it with a tiny output change."""
    from ...models import mlp

    torch.manual_seed(11)
    base, model = mlp(64, [24], 10).eval(), mlp(64, [48], 10).eval()
    g = torch.Generator().manual_seed(12)
    with torch.no_grad():
        w, b = base[1].weight, base[1].bias
        model[1].weight.copy_(torch.cat([w, w + 1e-3 * torch.randn(w.shape, generator=g)]))
        model[1].bias.copy_(torch.cat([b, b]))
        model[3].weight.copy_(torch.cat([base[3].weight, base[3].weight], 1) / 2)
        model[3].bias.copy_(base[3].bias)
    return model


def smoke_case() -> SmokeCase:
    """The duplicated MLP on 240 digits, merge tolerance 0.05."""
    from .config import FDEConfig

    return SmokeCase(duplicated_mlp(), digits_subset(), FDEConfig(merge_eps=0.05))
