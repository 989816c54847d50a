"""Gramians of channel groups: which groups are state points, Gc as the sample covariance of the captured
states, Go against its closed form, and energy ranks of states confined to a known subspace."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.width import analyse, capture
from minreal.compress.methods.cbalanced import analyse_states, group_gramians, group_state_samples, select_groups


def test_user_resnet20_has_the_stream_group_and_one_group_per_block(resnet20_user, small_images) -> None:
    wg = analyse(resnet20_user, small_images.x[:2])
    groups = {g.name: g for g in select_groups(wg)}
    blocks = [f"layer{s}.{b}.conv1" for s in (1, 2, 3) for b in range(3)]
    assert list(groups) == ["conv1", *blocks]
    # option A: the 16-, 32- and 64-channel streams share their channels at the pad offsets, so the residual
    # stream of all three stages is one group of 64 channels, read at every block input and by the classifier
    stream = groups["conv1"]
    assert stream.size == 64 and len(stream.state_points()) == 10
    sizes = [len(wg.channel_atoms(stream, n)) for n in stream.state_points()]
    assert sizes == [16] * 4 + [32] * 3 + [64] * 3
    assert [groups[b].size for b in blocks] == [16] * 3 + [32] * 3 + [64] * 3
    assert all(len(groups[b].state_points()) == 1 for b in blocks)


def test_gc_is_the_sample_covariance_of_the_captured_states(resnet20_user, small_images) -> None:
    """Every spatial position of every state point is a sample (absent channels zero): Gc is exactly the
    covariance of those rows, streamed over uneven batches and combined over state points in float64."""
    model, x = resnet20_user.double(), small_images.x.double()
    wg = analyse(model, x[:2])
    groups = select_groups(wg, ["conv1", "layer2.1.conv1"])
    grams = group_gramians(wg, groups, Dataset(x), go_samples=4, batch_size=24)
    values = capture(wg.gm, x, {n for g in groups for n in g.state_points()})
    for g in groups:
        h = group_state_samples(wg, g, values).numpy()
        assert grams[g.name].samples_gc == len(h)
        np.testing.assert_allclose(grams[g.name].gc.numpy(), np.cov(h, rowvar=False), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(grams[g.name].mean.numpy(), h.mean(0), rtol=1e-9, atol=1e-12)
    # the layer-1 positions carry 16 of the stream's 64 channels; the others are zero there
    layer1 = group_state_samples(wg, groups[0], values)[: 64 * 16 * 16]  # the stem output, first state point
    assert layer1[:, 16:].abs().max() == 0 and layer1[:, :16].abs().max() > 0


def _rank_k_cnn(k: int) -> nn.Module:
    """conv0's 12 output channels are A·(k features): every state of its group lies in a k-dim subspace."""
    torch.manual_seed(5)
    net = nn.Sequential(nn.Conv2d(3, 12, 3, padding=1, bias=False), nn.Conv2d(12, 8, 3, padding=1), nn.Tanh(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 6)).double().eval()
    with torch.no_grad():
        a = torch.randn(12, k, dtype=torch.float64)
        b = torch.randn(k, 27, dtype=torch.float64)
        net[0].weight.copy_((a @ b).reshape(12, 3, 3, 3))
    return net


@pytest.mark.parametrize("k", [3, 5])
def test_states_in_a_k_dimensional_subspace_have_energy_rank_k(k: int) -> None:
    net = _rank_k_cnn(k)
    x = torch.randn(24, 3, 8, 8, dtype=torch.float64)
    wg = analyse(net, x[:2])
    group = select_groups(wg, ["0"])[0]
    analysis = analyse_states(group_gramians(wg, [group], Dataset(x)), eps=1e-10)["0"]
    assert analysis.dim == 12
    assert analysis.rank_a == k and analysis.rank_c == k
    assert analysis.rank_b > k  # the outputs see more than the subspace: the C test is what finds k


def test_go_is_the_mean_of_per_position_jacobian_products() -> None:
    """Go = (1/(N·H·W)) Σ_{n,p} J_{n,p}ᵀ J_{n,p}, J_{n,p} = ∂z_n/∂h_n[:, p], against autograd's full Jacobian of
    the network's tail (everything after the state point) per input."""
    net = _rank_k_cnn(4)
    x = torch.randn(5, 3, 6, 6, dtype=torch.float64)
    wg = analyse(net, x[:2])
    group = select_groups(wg, ["0"])[0]
    go = group_gramians(wg, [group], Dataset(x), batch_size=2)["0"].go
    expected = torch.zeros(12, 12, dtype=torch.float64)
    with torch.no_grad():
        states = net[0](x)
    for h in states:
        jac = torch.autograd.functional.jacobian(lambda v: net[1:](v[None])[0], h)  # [6, 12, 6, 6]
        rows = jac.permute(2, 3, 0, 1).reshape(36, 6, 12)
        expected += torch.einsum("poi,poj->ij", rows, rows)
    torch.testing.assert_close(go, expected / (5 * 36), rtol=1e-10, atol=1e-12)


def test_go_of_the_pooled_classifier_input_is_the_head_gram(tiny_cnn, image_data) -> None:
    """The last group's state point is the pooled vector the head reads: z = W h + b, so Go = WᵀW."""
    wg = analyse(tiny_cnn, image_data.x[:2])
    group = select_groups(wg, ["6"])[0]
    assert len(group.state_points()) == 1
    go = group_gramians(wg, [group], image_data)["6"].go
    w = tiny_cnn[-1].weight.detach().double()
    torch.testing.assert_close(go, w.T @ w, rtol=1e-6, atol=1e-8)


def test_naming_a_state_point_by_group_or_module(resnet20_user, small_images) -> None:
    wg = analyse(resnet20_user, small_images.x[:2])
    assert [g.name for g in select_groups(wg, ["layer1.0.bn1", "layer1.0.conv1"])] == ["layer1.0.conv1"]
    with pytest.raises(CompressionError, match="neither a channel group"):
        select_groups(wg, ["nope"])
    with pytest.raises(CompressionError, match="cannot be resized"):
        select_groups(wg, ["linear"])


class _InPlaceAfterRead(nn.Module):
    """``y`` is read by c2, then shifted in place and read by c3: two state points of one group."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.c3 = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 1), nn.Conv2d(6, 6, 1)
        self.fc = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(x))
        z = self.c2(y)
        y += 5.0
        return self.fc((self.c3(y) + z).mean((2, 3)))


def test_states_are_kept_before_later_in_place_operations() -> None:
    torch.manual_seed(6)
    net = _InPlaceAfterRead().double().eval()
    x = torch.randn(8, 3, 5, 5, dtype=torch.float64)
    wg = analyse(net, x[:2])
    group = select_groups(wg, ["c1"])[0]
    assert len(group.state_points()) == 2
    mean = group_gramians(wg, [group], Dataset(x))["c1"].mean
    with torch.no_grad():
        y = torch.relu(net.c1(x)).mean((0, 2, 3))
    torch.testing.assert_close(mean, y + 2.5, rtol=1e-12, atol=1e-12)  # half the samples before, half after +5
