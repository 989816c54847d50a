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

import int8_width as iw

from minreal.compress.core.costs import count_costs
from minreal.compress.core.width import WidthGraph, analyse
from minreal.compress.models import resnet20_cifar

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


def _cut(ladder: str, target: float, widths: dict[str, int]) -> "iw.UniformCut":
    return iw.UniformCut(ladder=ladder, target=target, fraction=0.5, mac_ratio=target, widths=widths)


def test_cuts_with_equal_widths_are_timed_once_as_the_first_of_them() -> None:
    cuts = [_cut("m16", 0.5, {"g/0": 16}), _cut("m16", 0.35, {"g/0": 16}), _cut("m8", 0.5, {"g/0": 8})]
    assert iw.unique_cuts(cuts) == {cuts[0].name: cuts[0].name, cuts[1].name: cuts[0].name,
                                    cuts[2].name: cuts[2].name}


def _rows(ratios: dict[str, dict[str, float]]) -> dict[str, dict]:
    """Latency rows with the given per-process median ratios to the original (min/max 5 % either side)."""
    out: dict[str, dict] = {}
    for name, by in ratios.items():
        for p in iw.PRECISIONS:
            out.setdefault(name, {})[p] = {
                str(b): {f"vs_{iw.ORIGINAL}_{p}": {"median": by[f"{p}/{b}"], "min": by[f"{p}/{b}"] * 0.95,
                                                   "max": by[f"{p}/{b}"] * 1.05}} for b in iw.BATCHES}
    return out


def test_goal_is_judged_at_the_mac_ratio_reached_and_m16_against_m8_at_equal_macs() -> None:
    """The goal bound is the built file's MAC ratio + 0.15 (and, separately, the target's); ``multiples`` puts
    each ladder's latency ratio over m8's interpolated at the same MAC ratio, with the original at (1, 1)."""
    cuts = [_cut("m8", 0.5, {"g/0": 8}), _cut("m16", 0.5, {"g/0": 16})]
    files = {iw.ORIGINAL: {"macs": 1000}, cuts[0].name: {"macs": 500}, cuts[1].name: {"macs": 600}}
    flat = {f"{p}/{b}": 1.0 for p in iw.PRECISIONS for b in iw.BATCHES}
    rows = _rows({iw.ORIGINAL: flat, cuts[0].name: {k: 0.6 for k in flat}, cuts[1].name: {k: 0.6 for k in flat}})
    goals = iw.goal_table(cuts, files, rows, iw.BATCHES)
    m8, m16 = goals
    assert m8["mac_ratio"] == 0.5 and m8["bound"] == pytest.approx(0.65) and m8["met"]
    assert m8["b32"]["met_in_every_process"]  # the slowest process, 0.63, is within 0.65 too
    assert m16["mac_ratio"] == 0.6 and not m16["reaches_target"] and m16["bound"] == pytest.approx(0.75)
    assert m16["met"] and m16["b32"]["met_at_target"]  # 0.6 <= 0.6 + 0.15 and <= 0.5 + 0.15
    compared = iw.multiples(goals, rows, iw.BATCHES)["int8/b32"]
    point = compared["m16"]["points"][0]
    # m8 at MAC 0.6 interpolates between (0.5, 0.6) and (1, 1): 0.68; m16's 0.6 is 0.6 / 0.68 of it
    assert point["m8_ratio"] == pytest.approx(0.68) and point["versus_m8"] == pytest.approx(0.6 / 0.68, abs=1e-4)


def test_sym_kernel_needs_16_output_channels_and_aligned_input_channels() -> None:
    """MlasConvSymPackWSize's x86 conditions: Cin % 4, Cout >= 16, Cout % 4 (AVX-512) or % 8 (AVX2), no groups; or
    depthwise on a multiple of 16 groups."""
    assert iw.sym_kernel_expected(16, 16, 1, avx512=False)
    assert not iw.sym_kernel_expected(16, 8, 1, avx512=True)  # 8 output channels: im2col and a GEMM
    assert not iw.sym_kernel_expected(3, 16, 1, avx512=True)  # the RGB stem
    assert iw.sym_kernel_expected(16, 20, 1, avx512=True) and not iw.sym_kernel_expected(16, 20, 1, avx512=False)
    assert iw.sym_kernel_expected(16, 16, 16, avx512=True)  # a depthwise conv of 16 groups: its own kernel
    assert iw.sym_kernel_expected(32, 32, 32, avx512=False) and not iw.sym_kernel_expected(24, 24, 24, avx512=True)
    assert not iw.sym_kernel_expected(32, 32, 2, avx512=True)  # grouped, not depthwise


def test_conv_rows_and_channel_groups_add_up_from_the_kernels() -> None:
    from minreal.runtime_bench.node_profile import KernelTime

    def k(name, cin, cout, hw, us):
        macs = 2 * cout * hw * hw * cin * 9
        return KernelTime(name, "QLinearConv", "CPU", 3, us, ((2, hw, hw, cin), (), (), (cout, cin, 3, 3)),
                          ((2, hw, hw, cout),), macs)

    kernels = [k("a", 16, 16, 8, 10.0), k("b", 16, 32, 8, 10.0), k("c", 32, 32, 4, 5.0),
               KernelTime("add", "QLinearAdd", "CPU", 3, 2.0, (), (), None)]
    rows = iw.conv_rows(kernels, batch=2, avx512=True)
    assert [(r["cin"], r["cout"], r["pixels"], r["kernel"]) for r in rows] == [(16, 16, 64, 9), (16, 32, 64, 9),
                                                                              (32, 32, 16, 9)]
    assert rows[0]["gmac_per_s"] == pytest.approx(2 * 16 * 64 * 16 * 9 / 10.0 / 1e3, abs=0.05)
    groups = iw.by_out_channels(rows)
    assert list(groups) == ["16", "32"] and groups["32"]["convs"] == 2 and groups["32"]["us"] == 15.0
    assert groups["32"]["macs"] == rows[1]["macs"] + rows[2]["macs"]


def test_conv_rows_read_the_layout_from_the_output_and_skip_what_they_cannot_read() -> None:
    """NCHW and NHWC kernels whose spatial size differs from their channels, an ``NhwcQLinearConv``, a kernel with
    no recorded weight shape (no row, not a guess) and one with a zero time (no rate, no division by zero)."""
    from minreal.runtime_bench.node_profile import KernelTime

    macs = 2 * 16 * 32 * 32 * 16 * 9
    nchw = KernelTime("nchw", "QLinearConv", "CPU", 3, 10.0, ((2, 16, 32, 32), (), (), (16, 16, 3, 3)),
                      ((2, 16, 32, 32),), macs)
    nhwc = KernelTime("nhwc", "NhwcQLinearConv", "CPU", 3, 10.0, ((2, 32, 32, 16), (), (), (16, 16, 3, 3)),
                      ((2, 32, 32, 16),), macs)
    blind = KernelTime("blind", "QLinearConv", "CPU", 3, 10.0, ((2, 16, 32, 32),), ((2, 16, 32, 32),), macs)
    instant = KernelTime("instant", "Conv", "CPU", 3, 0.0, ((2, 16, 32, 32), (16, 16, 3, 3)), ((2, 16, 32, 32),),
                         macs)
    square = KernelTime("square", "QLinearConv", "CPU", 3, 10.0, ((2, 16, 16, 8), (), (), (16, 8, 3, 3)),
                        ((2, 16, 16, 16),), 2 * 16 * 16 * 16 * 8 * 9)  # NHWC, height = channels: read from x
    assert iw.conv_rows([square], batch=2, avx512=True)[0]["cin"] == 8
    rows = iw.conv_rows([nchw, nhwc, blind, instant], batch=2, avx512=True)
    assert [(r["node"], r["cin"], r["group"], r["pixels"]) for r in rows] == [
        ("nchw", 16, 1, 1024), ("nhwc", 16, 1, 1024), ("instant", 16, 1, 1024)]
    assert rows[-1]["gmac_per_s"] is None and rows[0]["sym_kernel_expected"]
