"""The width allocator's importance weighting across channel groups (``--importance-weighting``)."""

from __future__ import annotations

import pytest
import torch

from minreal.compress.core.errors import CompressionError
from minreal.compress.core.width import analyse
from minreal.compress.core.width.allocate import allocate_widths
from minreal.compress.core.width.cost import cost_terms
from minreal.compress.models import CifarResNet


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    model = CifarResNet(blocks_per_stage=3).eval()  # ResNet-20: the stream feeds three blocks a stage
    wg = analyse(model, torch.randn(2, 3, 16, 16))
    groups = wg.cuttable()
    stream = next(g for g in groups if len(wg.segments(g)) > 1)  # the option-A 16/32/64 stream
    return wg, groups, stream


def _macs(wg, keep: dict[str, list[int]]) -> float:
    """MACs of the cut model, counted from the cost terms (the allocator's own pricing, computed afresh)."""
    kept = {a for name, k in keep.items() for a in (wg.group(name).atoms[i] for i in k)}
    cut = {a for g in wg.groups for a in g.atoms if g.name in keep} - kept
    total = 0.0
    for t in cost_terms(wg):
        n_out = sum(a not in cut for a in t.out_atoms)
        n_in = sum(a not in cut for a in t.in_atoms) if t.in_atoms else t.in_fixed
        total += n_out * n_in * t.mac_unit + n_out * t.extra_macs
    return total


def _scores(groups, stream) -> dict[str, torch.Tensor]:
    """The stream's channels all equally important (relative score 1); every other group has a weak half
    (relative score 0.5) and a strong half (1.5)."""
    out = {}
    for g in groups:
        s = torch.ones(g.size, dtype=torch.float64)
        if g is not stream:
            s[: g.size // 2], s[g.size // 2:] = 0.5, 1.5
        out[g.name] = s
    return out


def test_cost_weighting_drops_the_least_important_channels_wherever_they_are(resnet) -> None:
    """With the weak halves of the block-internal groups enough for the budget, ``cost`` cuts only weak channels
    and leaves the stream (relative importance 1 throughout) whole; ``none`` narrows the stream first: its
    channels feed three blocks a stage, so they save about three times the MACs of a block-internal channel,
    more than the weak half's relative importance (0.5 against 1) makes up. Both meet the budget, counted
    afresh from the cost terms."""
    wg, groups, stream = resnet
    scores = _scores(groups, stream)
    full = _macs(wg, {g.name: list(range(g.size)) for g in groups})
    weak_only = _macs(wg, {g.name: list(range(g.size // 2, g.size)) if g is not stream else list(range(g.size))
                           for g in groups})
    ratio = (1 + weak_only / full) / 2  # half-way to cutting every weak channel
    cost = allocate_widths(wg, scores, "mac_ratio", ratio, multiple=8, weighting="cost")
    none = allocate_widths(wg, scores, "mac_ratio", ratio, multiple=8, weighting="none")
    for keep in (cost, none):
        assert _macs(wg, keep) <= ratio * full * (1 + 1e-9)
    assert cost[stream.name] == list(range(stream.size))
    for g in groups:
        dropped = set(range(g.size)) - set(cost[g.name])
        assert all(scores[g.name][i] == 0.5 for i in dropped), g.name
    assert len(none[stream.name]) < stream.size


def test_unknown_weighting_is_refused_naming_the_option(resnet) -> None:
    wg, groups, stream = resnet
    with pytest.raises(CompressionError, match="--importance-weighting"):
        allocate_widths(wg, _scores(groups, stream), "mac_ratio", 0.8, weighting="flat")


@pytest.mark.parametrize("method, expected", [("magnitude", "cost"), ("wanda", "none")])
def test_auto_weighting_is_the_measured_best_of_each_method(method: str, expected: str) -> None:
    """``auto`` (the default) cuts exactly as IMPORTANCE_WEIGHTING_AUTO's choice given explicitly, and the report
    says which; the weighting is a realise-only field: one prepared state serves both weightings."""
    from minreal.compress.core.data import Dataset
    from minreal.compress.core.options import IMPORTANCE_WEIGHTING_AUTO
    from minreal.compress.registry import get_method, prepare, prepared_key, realise

    assert IMPORTANCE_WEIGHTING_AUTO[method] == expected
    torch.manual_seed(0)
    model, data = CifarResNet(blocks_per_stage=1).eval(), Dataset(torch.randn(16, 3, 16, 16))
    config = get_method(method).config_cls
    prepared = prepare(model, data, method, config(mac_ratio=0.7))
    other = "none" if expected == "cost" else "cost"
    assert prepared_key(method, config(mac_ratio=0.7, importance_weighting=other)) == prepared.key
    (auto, auto_rep), (given, given_rep) = (realise(prepared, config(mac_ratio=0.7, importance_weighting=w))
                                            for w in ("auto", expected))
    assert config().importance_weighting == "auto" and auto_rep.predicted["importance_weighting"] == expected
    a, b = auto.state_dict(), given.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    _, other_rep = realise(prepared, config(mac_ratio=0.7, importance_weighting=other))
    assert other_rep.predicted["importance_weighting"] == other


def test_cost_weight_is_the_whole_ladder_saving_per_channel() -> None:
    """A unit whose first step down saves nothing (a latency table where 56 channels cost what 64 cost) keeps a
    positive weight: its saving over the whole ladder per channel removed; a unit that saves nothing anywhere, or
    cannot narrow, weighs 0."""
    from minreal.compress.core.width.allocate import _cost_weights

    flat_first = [64, 56, 48, 32]
    units = [("a", [], None, flat_first), ("b", [], None, [16, 8]), ("c", [], None, [8]), ("d", [], None, [32, 16])]
    saving = {"a": {64: 0.0, 56: 0.0, 48: 2.0, 32: 4.0}, "b": {16: 0.0, 8: 1.0}, "d": {32: 0.0, 16: 0.0}}

    def price(widths: list[int]) -> float:
        return 10.0 - sum(saving[u[0]][w] for u, w in zip(units, widths) if u[0] in saving)

    assert _cost_weights(units, price, 10.0) == [4.0 / 32, 1.0 / 8, 0.0, 0.0]


@pytest.mark.parametrize(("size", "multiple", "minimum", "expected"), [
    (16, 16, 0, [16, 8]),  # a segment no wider than the multiple halves it
    (16, 16, 16, [16]),  # ... unless the minimum keeps it whole
    (64, 16, 16, [64, 48, 32, 16]),
    (24, 8, 16, [24, 16]),
    (10, 16, 16, [10]),  # narrower than the minimum: stays whole
    (5, 1, 3, [5, 4, 3]),
])
def test_allowed_widths_step_by_the_multiple_and_stop_at_the_minimum(size: int, multiple: int, minimum: int,
                                                                     expected: list[int]) -> None:
    from minreal.compress.core.width.allocate import allowed_widths

    assert allowed_widths(size, multiple, minimum) == expected


def test_minimum_width_keeps_every_segment_at_or_above_it_and_names_the_option_when_unreachable(resnet) -> None:
    """ResNet-20's channels are 16/32/64: with minimum 16 on multiples of 16 no kept segment is narrower than 16,
    the 16-channel segments stay whole, and a budget below what that allows is refused naming --width-min."""
    from minreal.compress.core.width.allocate import segment_ladders

    wg, groups, stream = resnet
    keep = allocate_widths(wg, _scores(groups, stream), "mac_ratio", 0.75, multiple=16, minimum=16)
    assert _macs(wg, keep) <= 0.75 * _macs(wg, {g.name: list(range(g.size)) for g in groups}) * (1 + 1e-9)
    for g in groups:
        kept = set(keep[g.name])  # indices into the group, as its segments hold them
        for seg, ladder in zip(wg.segments(g), segment_ladders(wg, g, 16, 16)):
            width = len(kept & set(seg))
            assert width in ladder and (width >= 16 or width == len(seg))
    with pytest.raises(CompressionError, match=r"--width-min 16: --width-min 0 --width-multiple 8 cuts further, but "
                                               r"on the CPU an INT8 convolution narrower than 16 channels"):
        allocate_widths(wg, _scores(groups, stream), "mac_ratio", 0.2, multiple=16, minimum=16)


def test_segments_of_a_several_segment_group_step_by_the_multiple_down_to_the_minimum(resnet) -> None:
    """The option-A stream of ResNet-20 has several segments (16, then 16 more, then 32 more channels): each steps
    by the multiple itself (no halving, so every value width stays on it), none below the minimum, and a segment
    no wider than the minimum stays whole."""
    from minreal.compress.core.width.allocate import segment_ladders

    wg, groups, _ = resnet
    several = [g for g in groups if len(wg.segments(g)) > 1]
    assert several
    for g in several:
        sizes = [len(seg) for seg in wg.segments(g)]
        assert segment_ladders(wg, g, 8, 16) == [[n, *range((n - 1) // 8 * 8, 15, -8)] for n in sizes]
        assert segment_ladders(wg, g, 8, 0) == [[n, *range((n - 1) // 8 * 8, 0, -8)] for n in sizes]
        assert segment_ladders(wg, g, 16, 32) == [[n, *range((n - 1) // 16 * 16, 31, -16)] for n in sizes]
        assert all(ladder == [16] for n, ladder in zip(sizes, segment_ladders(wg, g, 8, 16)) if n == 16)


def test_cpu_defaults_are_multiples_of_16_at_least_16_and_gpus_keep_8() -> None:
    from minreal.compress.core.options import width_multiple_defaults

    assert width_multiple_defaults(("cpu",)) == {"width_multiple": 16, "width_min": 16}
    assert width_multiple_defaults(("cuda",)) == {"width_multiple": 8, "width_min": 0}
    assert width_multiple_defaults(("cuda", "cpu")) == {"width_multiple": 16, "width_min": 16}
    assert width_multiple_defaults(()) == {}


@pytest.mark.parametrize("budget", ["mac_ratio", "param_ratio"])
def test_a_moved_unit_is_priced_exactly_as_a_full_evaluation(resnet, budget: str) -> None:
    """The greedy allocator prices one unit's move by recounting only the terms that unit touches: the same float as
    pricing every term afresh (so its choices cannot depend on which one priced a move), and for MACs the count of
    the cut model's own cost terms (:func:`_macs`)."""
    import random

    from minreal.compress.core.width.allocate import _pricer, segment_key, segment_ladders

    wg, groups, stream = resnet
    scores = _scores(groups, stream)
    units, keys = [], []
    for g in groups:
        for k, (seg, ladder) in enumerate(zip(wg.segments(g), segment_ladders(wg, g, 8))):
            keys.append(segment_key(g.name, k))
            units.append((g.name, sorted(seg, key=lambda i: -float(scores[g.name][i])), scores[g.name], ladder))
    price = _pricer(wg, units, keys, budget, None)
    rng = random.Random(0)
    for _ in range(20):
        widths = [rng.choice(u[3]) for u in units]
        price.set(widths)
        for u, unit in enumerate(units):
            for w in unit[3]:
                moved = widths.copy()
                moved[u] = w
                assert price.moved(u, w) == price(moved)  # bit for bit
        if budget == "mac_ratio":
            keep = {g.name: [] for g in groups}
            for (name, ranked, _, _), w in zip(units, widths):
                keep[name] += ranked[:w]
            assert price(widths) == pytest.approx(_macs(wg, keep), rel=1e-12)
        for u, unit in enumerate(units):  # every width of a unit priced at once: the same floats, bit for bit
            assert price.moved_all(u, unit[3]).tolist() == [price.moved(u, w) for w in unit[3]]


def test_incremental_pricing_chooses_what_full_pricing_chooses(resnet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The allocator's keep sets with every move priced in full (the base ``_Price``) are the incremental ones."""
    import minreal.compress.core.width.allocate as allocate

    wg, groups, stream = resnet
    scores = _scores(groups, stream)
    runs = [("mac_ratio", 0.6, "cost"), ("mac_ratio", 0.5, "none"), ("param_ratio", 0.5, "cost")]
    incremental = [allocate_widths(wg, scores, b, r, multiple=8, weighting=w) for b, r, w in runs]
    real = allocate._pricer
    monkeypatch.setattr(allocate, "_pricer", lambda *a: allocate._Price(real(*a).__call__))
    assert [allocate_widths(wg, scores, b, r, multiple=8, weighting=w) for b, r, w in runs] == incremental


class _Attending(torch.nn.Module):
    """Token products no layer computes (x xᵀ x, as a Swin's attention), then an MLP: a third of the MACs lies
    outside the cost terms."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = (x @ x.transpose(1, 2)) @ x / x.shape[1]
        return self.fc2(torch.relu(self.fc1(mixed))).mean(1)


@pytest.mark.parametrize("method", ["wanda", "magnitude"])
def test_a_mac_budget_is_of_the_whole_model_when_products_lie_outside_the_layers(method: str) -> None:
    """MACs no cost term prices (the token products: 2·32·32·16 of the 98,304 a sample) are fixed under width cuts,
    so the allocator budgets ``ratio · whole − fixed`` of the terms: the measured whole-model ratio meets 0.7 and
    equals the allocator's prediction (budgeting the terms alone reached (0.7·65,536 + 32,768) / 98,304 = 0.80)."""
    from minreal.compress import compress, get_method
    from minreal.compress.core.data import Dataset

    config = get_method(method).config_cls
    torch.manual_seed(0)
    model = _Attending().eval()
    data = Dataset(torch.randn(16, 32, 16))
    _, report = compress(model, data, method, config(mac_ratio=0.7, width_multiple=8))
    assert report.macs_before == 2 * 32 * 32 * 16 + 32 * (16 * 64 + 64 * 16)
    assert report.mac_ratio <= 0.7 + 1e-12 and not report.predicted.get("budget_missed")
    assert report.predicted.allocator_mac_ratio == pytest.approx(report.mac_ratio, abs=1e-12)
    # the narrowest hidden width, 8 of 64: (8/64 · 65,536 + 32,768) / 98,304 = 0.4167
    with pytest.raises(CompressionError, match=r"smallest predicted ratio is 0\.4167 \(33\.3% of the model's cost "
                                                r"lies outside the layers that cuts narrow"):
        compress(model, data, method, config(mac_ratio=0.2, width_multiple=8))
