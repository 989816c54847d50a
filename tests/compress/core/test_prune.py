"""Structured magnitude/Wanda pruning: scores, parameter targets, exact widths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.chain import mlp_params
from minreal.compress.core.data import Dataset
from minreal.compress.core.prune import prune_chain, widths_for_params
from minreal.compress.methods.fde import chain_forward, extract_chain
from minreal.compress.methods.magnitude import MagnitudeConfig, magnitude_scores
from minreal.compress.methods.wanda import WandaConfig, wanda_scores
from minreal.compress.models import mlp


@pytest.fixture
def model() -> nn.Sequential:
    torch.manual_seed(31)
    return mlp(8, [40, 30], 3).eval()


@pytest.fixture
def data() -> Dataset:
    g = torch.Generator().manual_seed(32)
    x = torch.randn(200, 8, generator=g)
    return Dataset(x, torch.randn(200, 3, generator=g))


@pytest.mark.parametrize("ratio", [0.2, 0.37, 0.5, 0.8])
@pytest.mark.parametrize("method", ["magnitude", "wanda"])
def test_parameter_target_met(method: str, ratio: float, model: nn.Sequential, data: Dataset) -> None:
    cfg = MagnitudeConfig(param_ratio=ratio) if method == "magnitude" else WandaConfig(param_ratio=ratio)
    new, rep = compress(model, data, method, cfg)
    real = sum(p.numel() for p in new.parameters())
    assert rep.params_after == real <= ratio * rep.params_before
    widest_neuron = (8 + 1) + (40 + 1) + 3  # a neuron's incoming row, bias and outgoing column, either layer
    assert real >= ratio * rep.params_before - 2 * widest_neuron


def test_widths_for_params_is_largest_uniform_fit() -> None:
    widths = widths_for_params(10, [100, 50], 4, 0.4)
    assert mlp_params(10, widths, 4) <= 0.4 * mlp_params(10, [100, 50], 4)
    bigger = [w + 1 for w in widths]
    assert mlp_params(10, bigger, 4) > 0.4 * mlp_params(10, [100, 50], 4)


def test_magnitude_keeps_largest_l1_rows(model: nn.Sequential, data: Dataset) -> None:
    new, _ = compress(model, data, "magnitude", MagnitudeConfig(widths=(10, 5)))
    w1 = model[1].weight.detach()
    expected = torch.sort(torch.topk(w1.abs().sum(1), 10).indices).values
    assert torch.equal(new[1].weight.detach(), w1[expected])
    assert [m.out_features for m in new if isinstance(m, nn.Linear)] == [10, 5, 3]


def test_wanda_score_is_activation_norm_times_outgoing_weights(model: nn.Sequential, data: Dataset) -> None:
    chain = extract_chain(model)
    with torch.no_grad():
        h1 = torch.relu(model[1](data.x)).double()
    expected = h1.norm(dim=0) * model[3].weight.detach().double().abs().sum(0)
    assert torch.allclose(wanda_scores(chain, data.x)[0], expected, rtol=1e-6)


def test_wanda_prunes_dead_neurons_first_and_keeps_outputs_exact(model: nn.Sequential, data: Dataset) -> None:
    with torch.no_grad():
        model[1].bias[:12] = -100.0  # 12 dead neurons in layer 1
    chain = extract_chain(model)
    pruned = prune_chain(chain, wanda_scores(chain, data.x), [28, 30])
    assert all(g[0] >= 12 for g in pruned.groups[0])
    assert torch.allclose(chain_forward(pruned, data.x), chain_forward(chain, data.x), atol=1e-12)
    by_mag = prune_chain(chain, magnitude_scores(chain), [28, 30])
    assert any(g[0] < 12 for g in by_mag.groups[0])  # magnitude does not see that they are dead


def test_an_mlp_chain_says_the_channel_multiple_was_not_applied(model: nn.Sequential, data: Dataset) -> None:
    """The report's config said width_multiple 16 while the chain was cut to widths off that multiple, in silence."""
    _, rep = compress(model, data, "magnitude", MagnitudeConfig(param_ratio=0.3, width_multiple=16, width_min=16))
    widths = rep.predicted["hidden_widths"]
    assert any(w % 16 for w in widths), widths  # the budget, met neuron by neuron
    assert [n for n in rep.notes if n.startswith("an MLP chain is cut neuron by neuron")] == [
        f"an MLP chain is cut neuron by neuron to meet the budget (hidden widths {widths}): the channel multiple 16 "
        "and floor 16 (--width-multiple, --width-min) are for traced graphs' convolution kernels and were not "
        "applied; give the hidden widths themselves with --widths"]
    _, exact = compress(model, data, "magnitude", MagnitudeConfig(widths=(16, 16), width_multiple=16))
    assert not [n for n in exact.notes if "neuron by neuron" in n]  # widths given: nothing to say
