"""A factorised layer keeps working for a model whose own ``forward`` reads the replaced layer's ``weight`` for its
dtype and device (as transformers' ViT reads ``patch_embeddings.projection.weight.dtype``)."""

from __future__ import annotations

import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.lowrank import build_pair
from minreal.compress.methods.factorize import FactorizeConfig


class _ReadsProjDtype(nn.Module):
    """A patch embedding (stride-4 conv) whose ``forward`` casts its input to ``proj.weight.dtype``, then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, 16, 4, stride=4)
        self.head = nn.Linear(16 * 9, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(dtype=self.proj.weight.dtype, device=self.proj.weight.device)
        return self.head(self.proj(x).flatten(1))


def test_a_model_reading_the_replaced_layers_weight_dtype_still_runs() -> None:
    torch.manual_seed(0)
    model = _ReadsProjDtype().eval()
    g = torch.Generator().manual_seed(1)
    data = Dataset(torch.randn(32, 3, 12, 12, generator=g), torch.randint(0, 5, (32,), generator=g))
    new, report = compress(model, data, "factorize", FactorizeConfig(layer_mac_ratio=0.5))
    assert isinstance(new.proj, nn.Sequential) and len(new.proj) == 2  # factorised
    assert new.proj.weight.dtype == torch.float32
    out = new(data.x[:4].double())  # the forward's cast to the weight's dtype runs; a float64 input is cast back
    assert out.shape == (4, 5) and out.dtype == torch.float32 and torch.isfinite(out).all()


def test_pair_weight_is_an_empty_unsaved_buffer_of_the_layers_dtype_and_the_pair_reproduces_at_full_rank() -> None:
    layer = nn.Linear(6, 4).double()
    u, s, vh = torch.linalg.svd(layer.weight.detach(), full_matrices=False)
    pair = build_pair(layer, vh.unsqueeze(0), (u * s).unsqueeze(0))  # full rank 4: W = (U S) Vh
    assert pair.weight.dtype == torch.float64 and pair.weight.device == layer.weight.device
    assert pair.weight.numel() == 0 and "weight" not in pair.state_dict()
    assert pair.half().weight.dtype == torch.float16  # cast with the pair
    pair = build_pair(layer, vh.unsqueeze(0), (u * s).unsqueeze(0))
    x = torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(pair(x), layer(x), rtol=1e-12, atol=1e-12)
