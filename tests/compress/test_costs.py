"""Parameter and MAC counts against closed forms."""

import torch
from torch import nn

from compress import count_costs
from compress.surgery import replace_modules


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
