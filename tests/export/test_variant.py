"""minreal.export.variant's refusals: a model whose exported graph ONNX Runtime cannot run at another batch size
than the one it was exported at is refused in one line of ours, not ONNX Runtime's exception."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.export.errors import ExportError
from minreal.export.settings import VariantConfig
from minreal.export.variant import export_variant


class LoopsOverTheBatch(nn.Module):
    """Runs its convolution on one image at a time, as torchvision's detection models take a list of images: the
    loop over the batch is unrolled at export, so the graph runs at the exported batch size only."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.conv(image.unsqueeze(0))[0] for image in x])


def test_a_forward_that_fixes_the_batch_size_is_refused_in_one_line(tmp_path: Path) -> None:
    """zoo (issue 44): fasterrcnn_mobilenet_v3_large_320_fpn's export ended in ONNX Runtime's own ``Fail`` (a Split
    node fixed at the exported batch of 2 fed a batch of 3), recorded as a failed stage with ONNX Runtime's words."""
    out = tmp_path / "loops.onnx"
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ExportError) as refused:
        export_variant(LoopsOverTheBatch().eval(), x, out, VariantConfig())
    line = str(refused.value)
    assert line.startswith("LoopsOverTheBatch exported at batch 2 does not run at batch 3 in ONNX Runtime: its "
                           "forward fixes the batch size")
    assert "give a forward that takes the batch as one tensor" in line and "\n" not in line
    assert not out.exists() and list(tmp_path.iterdir()) == []
