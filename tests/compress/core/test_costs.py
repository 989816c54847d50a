"""Parameter and MAC counts against closed forms."""

import torch
from torch import nn

from compress import count_costs
from compress.core.surgery import replace_modules


def test_closed_form_counts() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.Flatten(), nn.Linear(8 * 5 * 5, 10))
    table = count_costs(model, torch.randn(4, 3, 10, 10))
    assert table.layers["0"].macs == 5 * 5 * 8 * 3 * 9
    assert table.layers["3"].macs == 5 * 5 * 8 * 4 * 9
    assert table.layers["5"].macs == 200 * 10
    assert table.layers["0"].params == 8 * 3 * 9 + 8
    assert table.not_counted == ["1"]
    assert table.total_params == sum(p.numel() for p in model.parameters())


def test_linear_over_tokens_counts_every_position() -> None:
    table = count_costs(nn.Sequential(nn.Linear(6, 4)), torch.randn(2, 7, 6))
    assert table.layers["0"].macs == 7 * 6 * 4 and table.layers["0"].positions == 7


def test_replace_modules_works_on_a_copy() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    new = replace_modules(model, {"1": nn.Tanh()})
    assert isinstance(model[1], nn.ReLU) and isinstance(new[1], nn.Tanh)


def test_ssm_layers_counted_by_their_registered_rule() -> None:
    from compress.methods.ssm import DenseSSM, RotationSSM

    n, h, length = 8, 5, 13
    rot = RotationSSM(h, n)
    table = count_costs(nn.Sequential(rot), torch.randn(3, length, h))
    assert table.layers["0"].macs == length * (n * h + 2 * n + n * h + h)  # 2×2 rotation blocks: 2 per state
    dense = DenseSSM(torch.eye(4) * 0.5, torch.randn(4, h), torch.randn(h, 4), torch.zeros(h, h))
    table = count_costs(nn.Sequential(dense), torch.randn(2, length, h))
    assert table.layers["0"].macs == length * (4 * h + 16 + 4 * h + h)
    assert "0" not in table.not_counted


def test_duplicate_mac_rule_is_an_error() -> None:
    import pytest

    from compress.core.costs import register_mac_rule

    with pytest.raises(ValueError, match="already registered"):
        register_mac_rule(nn.Linear, lambda m, out: 0)
