"""benchmarks/int8_width.py's cuts, without exporting or timing anything (the benchmark needs ../shared/data and takes
minutes): on the built-in ResNet-20 with random weights, the uniform-fraction search reaches the MAC ratio it aims at
where the ladder allows it, every width sits on its ladder, and the predicted MAC ratio is the built model's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import int8_width as iw  # noqa: E402
from compress.core.costs import count_costs  # noqa: E402
from compress.core.width import WidthGraph, analyse  # noqa: E402
from compress.models import resnet20_cifar  # noqa: E402

X = torch.zeros(2, 3, 32, 32)


@pytest.fixture(scope="module")
def wg() -> WidthGraph:
    torch.manual_seed(0)
    return analyse(resnet20_cifar().eval(), X)


def test_ladders_step_by_their_multiple_down_to_their_floor() -> None:
    assert iw.Ladder(8, 8).widths(16) == [16, 8]
    assert iw.Ladder(16, 16).widths(16) == [16]
    assert iw.Ladder(16, 16).widths(64) == [64, 48, 32, 16]
    assert iw.Ladder(8, 16).widths(32) == [32, 24, 16]
    assert iw.Ladder(8, 8).nearest(16, 0.75) == 16  # 12 channels: a tie, the wider width
    assert iw.Ladder(8, 8).nearest(64, 0.3) == 16


def test_equal_segments_do_not_all_round_the_same_way() -> None:
    widths = iw.uniform_widths({f"g{i}/0": 16 for i in range(4)}, iw.LADDERS["m8"], 0.75)
    assert sorted(widths.values()) == [8, 8, 16, 16]  # 4 x 12 channels asked, 48 given


@pytest.mark.parametrize("ladder", ["m8", "m16"])
def test_search_reaches_the_target_on_the_ladder(wg: WidthGraph, ladder: str) -> None:
    multiple = iw.LADDERS[ladder].multiple
    full = count_costs(wg.gm, X).macs
    lowest = min(ratio for _, ratio, _ in iw.fraction_curve(wg, iw.LADDERS[ladder]))
    for cut in iw.plan_cuts(wg, [ladder], [0.7, 0.5]):
        assert all(w % multiple == 0 and w >= multiple for w in cut.widths.values()), cut.widths
        model = iw.narrowed(wg, cut.widths)
        assert all(m.out_channels % multiple == 0 for m in model.modules() if isinstance(m, nn.Conv2d))
        assert count_costs(model, X).macs / full == pytest.approx(cut.mac_ratio, rel=1e-9)
        if lowest <= cut.target - iw.REACHED:
            assert abs(cut.mac_ratio - cut.target) <= iw.REACHED, cut
        else:  # m16 keeps the 16-channel stage whole: the narrowest cut is the nearest
            assert cut.mac_ratio == lowest > cut.target
