"""Models, inputs and helpers shared by the width-core tests and the width ONNX parity tests.

Not a test module: the width tests' ``conftest.py`` and ``tests/export/test_width_parity.py`` load it by path
(the tests folder is not a package) as ``minreal_width_zoo``.

Every model is seeded, in eval mode, with BatchNorm statistics and affine parameters randomised (a freshly
built BatchNorm is the identity, which would hide a mis-cut BN) and inputs of at most 64×64.
"""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from minreal.compress.core.width import Cut, WidthGraph
from minreal.compress.models import mlp, small_cnn

ROOT = Path(__file__).resolve().parents[4]
UNIT_ROUNDOFF = 2.0**-24
"""float32's unit roundoff u: the relative error of rounding one real number to float32."""

TORCHVISION = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "densenet121",
               "regnet_x_400mf", "convnext_tiny", "vit_b_16")
SMALL = ("resnet20", "mlp", "small_cnn", "flat_cnn", "tiny_attention", "tiny_video")
MODELS = TORCHVISION + SMALL
BIG = frozenset({"resnet50", "densenet121", "convnext_tiny", "vit_b_16", "efficientnet_b0", "mobilenet_v2"})
"""The models whose ONNX parity test takes 20–40 s each on 2 cores (the largest, 25–86 M parameters, and
EfficientNet-B0's many small layers), and MobileNetV2 (16 s; its depthwise blocks are MobileNetV3-Small's too, which
stays): marked slow (``make test-all``)."""


def user_module(relative: str) -> ModuleType:
    """A user's model file (it imports only torch), loaded as ``minreal`` loads ``file.py:factory``."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(f"minreal_user_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FlatCNN(nn.Module):
    """Conv-BN-ReLU ×2, then a flatten straight into a Linear (channel × spatial blocks of its columns)."""

    def __init__(self, literal_view: bool = False) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 12, 3, stride=2, padding=1), nn.BatchNorm2d(12)
        self.fc = nn.Linear(12 * 4 * 4, 5)
        self.literal_view = literal_view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = x.view(x.size(0), 12 * 4 * 4) if self.literal_view else torch.flatten(x, 1)
        return self.fc(x)


class TinyAttention(nn.Module):
    """Linear embedding → self-attention (4 heads of 4) → Linear head, on ``[batch, tokens, 6]`` inputs."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=batch_first)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        out, _ = self.attn(h, h, h, need_weights=False)
        return self.head(out)


class SpatialConv3d(nn.Conv3d):
    """A 1×3×3 ``nn.Conv3d`` built by a constructor of its own that keeps ``nn.Conv3d.forward``, as torchvision's
    video ``Conv3DNoTemporal`` and ``Conv3DSimple`` are."""

    def __init__(self, in_planes: int, out_planes: int, stride: int = 1) -> None:
        super().__init__(in_planes, out_planes, kernel_size=(1, 3, 3), stride=(1, stride, stride),
                         padding=(0, 1, 1), bias=False)


class TinyVideo(nn.Module):
    """torchvision's ``VideoResNet`` in small (mc3_18's structure): a Conv3d stem, one basic block of two
    :class:`SpatialConv3d` with BatchNorm3d and a strided 1×1×1 shortcut, 3-D average pooling and a Linear head, on
    ``[batch, 3, frames, height, width]`` clips."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, (3, 3, 3), padding=1, bias=False), nn.BatchNorm3d(8), nn.ReLU())
        self.conv1 = nn.Sequential(SpatialConv3d(8, 12, stride=2), nn.BatchNorm3d(12), nn.ReLU())
        self.conv2 = nn.Sequential(SpatialConv3d(12, 12), nn.BatchNorm3d(12))
        self.downsample = nn.Sequential(nn.Conv3d(8, 12, 1, stride=(1, 2, 2), bias=False), nn.BatchNorm3d(12))
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(self.conv2(self.conv1(x)) + self.downsample(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def randomise_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """BatchNorm running statistics and affine parameters drawn at random, so BN is not the identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0.0, 0.2, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.normal_(0.0, 0.2, generator=g)
    return model


def _torchvision(name: str) -> nn.Module:
    import torchvision

    if name == "vit_b_16":
        model = torchvision.models.vit_b_16(image_size=64)
        nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision zero-inits the head: outputs would be 0
        return model
    return getattr(torchvision.models, name)()


def build(name: str, seed: int = 0) -> nn.Module:
    """Model ``name`` of :data:`MODELS`, seeded, randomised BN, eval mode."""
    torch.manual_seed(seed)
    if name in TORCHVISION:
        model = _torchvision(name)
    elif name == "resnet20":
        model = user_module("examples/resnet20_user.py").resnet20(num_classes=10)
    elif name == "mlp":
        model = mlp(12, [32, 24], 5)
    elif name == "small_cnn":
        model = small_cnn(3, (8, 16, 16), 4)
    elif name == "flat_cnn":
        model = FlatCNN()
    elif name == "tiny_attention":
        model = TinyAttention()
    elif name == "tiny_video":
        model = TinyVideo()
    else:
        raise KeyError(name)
    return randomise_norms(model, seed).eval()


def example(name: str, batch: int = 2, seed: int = 0) -> torch.Tensor:
    """A seeded standard-normal input for model ``name``."""
    shape = {"resnet20": (3, 32, 32), "mlp": (12,), "small_cnn": (3, 16, 16), "flat_cnn": (3, 8, 8),
             "tiny_attention": (5, 6), "tiny_video": (3, 4, 8, 8)}.get(name, (3, 64, 64))
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(seed))


def three_quarters(size: int) -> list[int]:
    """A keep set that removes ⌈size/4⌉ atoms (at least 25 %), spread over the group (every 4th, then the tail)."""
    keep = [i for i in range(size) if i % 4 != 1]
    return keep[:size - math.ceil(size / 4)]


def layer_norm_groups(wg: WidthGraph) -> set[str]:
    """Names of the groups whose channels a LayerNorm normalises over (cutting them is not exact, see tests)."""
    found = set()
    for g in wg.groups:
        for u in g.uses:
            owner = f"{u.target}.{u.param}".strip(".").rpartition(".")[0]
            if isinstance(wg.gm.get_submodule(owner), nn.LayerNorm):
                found.add(g.name)
    return found


def cuts_of(wg: WidthGraph, skip: set[str] = frozenset()) -> dict[str, Cut]:
    """:func:`three_quarters` of every cuttable group not in ``skip``."""
    return {g.name: Cut(three_quarters(g.size)) for g in wg.cuttable() if g.name not in skip}


def parameter(gm: nn.Module, target: str, param: str) -> torch.Tensor:
    path, _, attr = f"{target}.{param}".strip(".").rpartition(".")
    return getattr(gm.get_submodule(path), attr)


def dead_copy(wg: WidthGraph, cuts: dict[str, Cut]) -> WidthGraph:
    """A copy of ``wg`` whose traced model has the channels ``cuts`` remove made dead: their producer rows and
    per-channel affine parameters (BN/LayerNorm weight and bias, grouped-conv rows, head rows) are zero —
    running statistics stay as they are — so these channels are exactly 0 at every state point."""
    removed = set()
    for name, cut in cuts.items():
        keep = set(cut.keep)
        removed |= {a for i, a in enumerate(wg.group(name).atoms) if i not in keep}
    dead = copy.copy(wg)
    dead.gm = copy.deepcopy(wg.gm)
    with torch.no_grad():
        for u in wg.uses:
            if u.role in ("producer", "affine") and u.param not in ("running_mean", "running_var"):
                positions = [i for i, s in enumerate(u.slots) if wg.find(s) in removed]
                if positions:
                    parameter(dead.gm, u.target, u.param).index_fill_(u.dim, torch.tensor(positions), 0.0)
    return dead


def as_float64(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module).double()


def float32_error(module: nn.Module, *inputs: torch.Tensor) -> float:
    """max |float32 output − float64 output| of ``module`` over ``inputs``: the rounding error of one float32
    evaluation of this network on these inputs (float64's own error is ~2^-29 times smaller)."""
    wide = as_float64(module)
    with torch.no_grad():
        return max(float((module(x).double() - wide(x.double())).abs().max()) for x in inputs)


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
