"""Reference architectures: the CIFAR ResNet-20 (He et al. 2016, §4.2) as a plain torch module."""

from __future__ import annotations

import torch
from torch import nn

from minreal.compress.datasets import digits32
from minreal.compress.models import CifarResNet, resnet20_cifar


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet20_parameter_count_matches_the_paper() -> None:
    # He et al. (2016) Table 6: ResNet-20 has 0.27M parameters
    assert _params(resnet20_cifar()) == 269_722
    assert _params(resnet20_cifar(num_classes=7)) == 269_722 - 3 * 65


def test_resnet20_layout() -> None:
    model = resnet20_cifar()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(convs) + len(linears) == 20  # 1 stem conv + 3 stages × 3 blocks × 2 convs + the head
    assert sorted({c.out_channels for c in convs}) == [16, 32, 64]
    assert [c.stride[0] for c in convs if c.stride != (1, 1)] == [2, 2]
    assert all(c.kernel_size == (3, 3) and c.bias is None for c in convs)  # option A: no projection convs
    assert len([m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]) == 19


def test_resnet20_forward_on_digits32() -> None:
    calib, _ = digits32(0)
    model = resnet20_cifar(num_classes=10).eval()
    with torch.no_grad():
        out = model(calib.x[:8])
    assert out.shape == (8, 10) and torch.isfinite(out).all()


def test_option_a_shortcut_subsamples_and_zero_pads() -> None:
    block = resnet20_cifar().layer2[0]
    x = torch.randn(2, 16, 8, 8)
    out = block.shortcut(x)
    assert out.shape == (2, 32, 4, 4)
    assert torch.equal(out[:, 8:24], x[:, :, ::2, ::2])
    assert not out[:, :8].any() and not out[:, 24:].any()


def test_resnet20_is_plain_torch_and_traceable() -> None:
    model = resnet20_cifar().eval()
    assert isinstance(model, CifarResNet)
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    x = torch.randn(2, 3, 32, 32)
    program = torch.export.export(model, (x,))
    assert torch.allclose(program.module()(x), model(x), atol=1e-5)


def test_kaiming_init_of_conv_weights() -> None:
    torch.manual_seed(0)
    conv = resnet20_cifar().layer3[1].conv1  # fan_in 64·9, gain √2: std = √(2 / 576)
    assert abs(float(conv.weight.detach().std()) - (2 / 576) ** 0.5) < 0.005
