"""Fake quantisation (minreal.compress.core.qat) against ONNX Runtime's own quantisation formulas."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType, quantize_data
from torch import nn

from minreal.compress.core.errors import CompressionError
from minreal.compress.core.qat import INT8_FORMATS, fake_quant, fake_quantize, quant_params, weight_scales

_ONNX_TYPES = {"uint8": onnx.TensorProto.UINT8, "int8": onnx.TensorProto.INT8}


@pytest.mark.parametrize("target", sorted(INT8_FORMATS))
def test_activation_scale_and_zero_point_are_ort_compute_scale_zp(target: str) -> None:
    fmt = INT8_FORMATS[target]
    qmin, qmax = get_qmin_qmax_for_qType(_ONNX_TYPES[fmt.activation_dtype], symmetric=fmt.symmetric)
    rng = np.random.default_rng(0)
    ends = np.sort(rng.standard_normal((2000, 2)) * 10.0 ** rng.uniform(-6, 3, (2000, 1)), axis=1).astype(np.float32)
    ends[:300] = np.abs(ends[:300])  # ranges that do not hold 0
    ends[300:310] = 0.0  # empty range: ORT's fallback scale 1
    for rmin, rmax in ends:
        zero, scale = compute_scale_zp(np.array(rmin), np.array(rmax), qmin, qmax, fmt.symmetric)
        ours = quant_params(float(rmin), float(rmax), fmt)
        assert ours == (float(scale), int(zero)) and scale.dtype == np.float32
    assert fmt.symmetric == (quant_params(-1.0, 3.0, fmt)[1] == 0)  # symmetric int8: zero point 0


def test_weight_fake_quant_is_round_w_over_s_times_s_with_ort_per_channel_scales() -> None:
    w = torch.randn(12, 5, 3, 3) * torch.rand(12, 1, 1, 1) * 10
    w[4] = 0.0  # an all-zero channel: ORT's scale 1
    scales = weight_scales(w)
    fq = fake_quantize(w, scales.reshape(-1, 1, 1, 1), 0, (-128, 127))
    for c in range(len(w)):
        zero, scale, q = quantize_data(w[c].numpy().ravel(), onnx.TensorProto.INT8, True)
        assert zero == 0 and np.float32(scales[c]) == scale
        assert np.array_equal(fq[c].numpy().ravel(), q.astype(np.float32) * scale)
        assert torch.equal(fq[c], torch.round(w[c] / scales[c]) * scales[c])


def test_activation_fake_quant_saturates_like_quantize_linear() -> None:
    x = torch.linspace(-3, 3, 101)
    y = fake_quantize(x, 0.01, 128, (0, 255))
    expected = (torch.clamp(torch.round(x / 0.01) + 128, 0, 255) - 128) * torch.tensor(0.01)
    assert torch.equal(y, expected) and float(y.min()) == pytest.approx(-1.28) and float(y.max()) == pytest.approx(1.27)


def test_straight_through_gradient_inside_the_range_zero_outside() -> None:
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0], requires_grad=True)
    fake_quantize(x, 1.0 / 127, 0, (-128, 127)).sum().backward()  # range [-128/127, 1]
    assert torch.equal(x.grad, torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0]))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=2),
                         nn.ReLU(), nn.Flatten(), nn.Linear(8 * 10 * 10, 4))


def test_model_is_exactly_restored_after_the_block(image_data) -> None:
    net = _net().eval()
    keys, types, x = list(net.state_dict()), [type(m) for m in net.modules()], image_data.x
    before = net(x)
    with fake_quant(net, "cpu-vnni", calibration=[x[:16], x[16:]]) as fq:
        assert set(fq.ranges()) == {"0", "3", "6"}
        quantised = net(x)
    assert not torch.equal(quantised, before)
    assert list(net.state_dict()) == keys and [type(m) for m in net.modules()] == types
    assert all("forward" not in m.__dict__ and not m._forward_pre_hooks and not m._forward_hooks for m in net.modules())
    assert torch.equal(net(x), before)


def test_ranges_start_as_exact_min_max_then_follow_the_moving_average_in_training_only(image_data) -> None:
    net, x = _net(), image_data.x
    with fake_quant(net, "cpu-vnni", calibration=[x[:16], x[16:]], momentum=0.25) as fq:
        first = fq.ranges()["0"]
        assert (first.min, first.max) == (float(x.min()), float(x.max()))
        assert (first.scale, first.zero_point) == quant_params(first.min, first.max, INT8_FORMATS["cpu-vnni"])
        net.eval()
        net(2 * x)  # eval mode: frozen
        assert fq.ranges()["0"] == first
        net.train()
        net(2 * x)
        moved = fq.ranges()["0"]
        assert moved.max == pytest.approx(first.max + 0.25 * (float(2 * x.max()) - first.max), rel=1e-6)
        assert moved.min == pytest.approx(first.min + 0.25 * (float(2 * x.min()) - first.min), rel=1e-6)


def test_gradients_pass_the_rounding_to_every_parameter(image_data) -> None:
    net, x = _net(), image_data.x
    with fake_quant(net, "tensorrt", calibration=[x]) as fq:
        net.train()
        net(x).square().mean().backward()
        assert fq.ranges()["3"].zero_point == 0 and fq.ranges()["3"].dtype == "int8"
    grads = [p.grad for p in net.parameters()]
    assert all(g is not None and bool(g.abs().sum() > 0) for g in grads)


def test_seeded_ranges_and_errors() -> None:
    net = nn.Sequential(nn.Linear(4, 3))
    with fake_quant(net, "cpu-vnni", ranges={"0": {"min": -1.0, "max": 3.0}}) as fq:
        assert fq.ranges()["0"].scale == quant_params(-1.0, 3.0, INT8_FORMATS["cpu-vnni"])[0]
        with pytest.raises(CompressionError, match="already has an instance-level forward"):
            with fake_quant(net):
                pass
    with pytest.raises(CompressionError, match="no INT8 format for target 'cuda'"):
        with fake_quant(net, "cuda"):
            pass
    with pytest.raises(CompressionError, match="no nn.Conv1d/2d/3d or nn.Linear"):
        with fake_quant(nn.Sequential(nn.ReLU())):
            pass


class _BuiltItsOwnWay(nn.Conv2d):
    """A 3×3 ``nn.Conv2d`` with a constructor of its own (as torchvision's video ``Conv3DSimple``), same computation."""

    def __init__(self, in_planes: int, out_planes: int) -> None:
        super().__init__(in_planes, out_planes, kernel_size=3, padding=1)


class _Standardised(nn.Conv2d):
    """A forward of its own (timm's ``StdConv2d``): not the layer ORT would quantise as a plain Conv."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return self._conv_forward(x, (w - w.mean((1, 2, 3), keepdim=True)) / w.std((1, 2, 3), keepdim=True), self.bias)


def test_a_subclass_computing_as_its_layer_is_fake_quantised_as_the_layer(image_data) -> None:
    """It exports as the same Conv node, so it is quantised like one: the same outputs, bit for bit, as nn.Conv2d
    with its weights under fake quantisation; a subclass with a forward of its own is left float."""
    torch.manual_seed(0)
    sub = nn.Sequential(_BuiltItsOwnWay(3, 8), nn.ReLU(), _Standardised(8, 4, 3), nn.Flatten(), nn.Linear(4 * 100, 2))
    plain = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), _Standardised(8, 4, 3), nn.Flatten(),
                          nn.Linear(4 * 100, 2))
    plain.load_state_dict(sub.state_dict())
    x = image_data.x
    with fake_quant(sub, "cpu-vnni", calibration=[x]) as fq_sub, fake_quant(plain, "cpu-vnni", calibration=[x]) as fq:
        assert set(fq_sub.ranges()) == set(fq.ranges()) == {"0", "4"}
        assert torch.equal(sub.eval()(x), plain.eval()(x))
