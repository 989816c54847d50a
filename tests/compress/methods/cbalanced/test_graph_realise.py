"""Realisation on channel groups: widths, balanced leverage, the least-squares refit of consumers, exact limits,
and cbalanced end to end on a user-code ResNet-20 (no hand-written surgery) with ONNX parity."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minreal.app.models import load_model
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.width import analyse, apply_cuts
from minreal.compress.methods.cbalanced import (
    CBalancedConfig,
    analyse_states,
    balanced_leverage,
    group_cuts,
    group_gramians,
    ls_merge,
    realise_groups,
    round_width,
    select_groups,
)
from minreal.compress.registry import compress
from minreal.export.onnx_export import to_onnx
from minreal.export.verify import verify_parity


def _analysed(model: nn.Module, data: Dataset, eps: float, names: tuple[str, ...] = ()):
    wg = analyse(model, data.x[:2])
    groups = select_groups(wg, names)
    return wg, analyse_states(group_gramians(wg, groups, data, go_samples=16), eps)


def test_round_width_to_the_fast_multiple() -> None:
    assert [round_width(r, 64, 8) for r in (1, 8, 9, 20, 63, 64)] == [8, 8, 16, 24, 64, 64]
    assert round_width(5, 12, 8) == 8 and round_width(9, 12, 8) == 12  # the allowed widths of 12 are 12, 8
    assert round_width(5, 16, 16) == 8 and round_width(9, 16, 16) == 16  # 16 at multiple 16: 16, 8
    assert round_width(13, 16, 8) == 16 and round_width(13, 64, 1) == 13
    assert round_width(2, 3, 8) == 2  # tiny groups: every width
    assert CBalancedConfig().width_multiple == 8  # the shared default of width methods on channel groups


def test_round_width_never_goes_below_the_minimum() -> None:
    assert [round_width(r, 64, 8, 16) for r in (1, 8, 9, 17, 64)] == [16, 16, 16, 24, 64]
    assert [round_width(r, 64, 16, 16) for r in (1, 17, 33)] == [16, 32, 48]
    assert round_width(3, 12, 8, 16) == 12  # no wider than the minimum: stays whole
    assert round_width(3, 64, 16, 20) == 32  # a minimum off the multiple acts as the next multiple up


def test_layer_note_names_what_moved_the_width() -> None:
    from minreal.compress.methods.cbalanced.method import _rounding

    assert _rounding(16, 16, 64, 16, 16) == ""
    assert _rounding(5, 16, 64, 16, 16) == " rounded up to the width multiple"  # 16 is the first multiple anyway
    assert _rounding(5, 16, 64, 8, 16) == " raised to the width minimum (16)"  # 8 without the minimum
    assert _rounding(3, 12, 12, 8, 16) == " raised to the width minimum (16)"  # kept whole: no wider than it
    assert _rounding(3, 32, 64, 16, 20) == " raised to the width minimum (20)"  # 16 without it
    assert _rounding(20, 32, 64, 16, 16) == " rounded up to the width multiple"


def test_balanced_leverage_is_a_projector_diagonal() -> None:
    torch.manual_seed(0)
    a = torch.randn(9, 9, dtype=torch.float64)
    gc, go = a @ a.T, torch.diag(torch.rand(9, dtype=torch.float64))
    from minreal.compress.core.linalg import balanced_gramian, sym_eig_desc

    b, root = balanced_gramian(gc, go)
    _, vb = sym_eig_desc(b)
    for r in (1, 4, 9):
        lev = balanced_leverage(root, vb, r)
        assert float(lev.sum()) == pytest.approx(r) and float(lev.min()) >= -1e-12 and float(lev.max()) <= 1 + 1e-12


def test_ls_merge_is_the_affine_regression_of_removed_on_kept() -> None:
    g = torch.Generator().manual_seed(1)
    h = torch.randn(500, 6, generator=g, dtype=torch.float64) @ torch.randn(6, 6, generator=g, dtype=torch.float64)
    h += torch.randn(6, generator=g, dtype=torch.float64)
    keep = [0, 2, 3]
    merge, offset = ls_merge(torch.cov(h.T), h.mean(0), keep, ridge=0.0)
    design = torch.cat([h[:, keep], torch.ones(500, 1, dtype=torch.float64)], 1)
    sol = torch.linalg.lstsq(design, h).solution  # [4, 6]
    torch.testing.assert_close(merge, sol[:3].T, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(offset[[1, 4, 5]], sol[3, [1, 4, 5]], rtol=1e-8, atol=1e-10)
    assert torch.equal(merge[keep], torch.eye(3, dtype=torch.float64)) and not offset[keep].any()


def test_keeping_every_channel_reproduces_the_user_resnet(resnet20_user, small_images) -> None:
    wg, analyses = _analysed(resnet20_user, small_images, 0.0)
    full = {n: a.dim for n, a in analyses.items()}
    x = small_images.x[:8]
    with torch.no_grad():
        ref = resnet20_user(x)
        for init_kw in ({"selection": "leverage"}, {"selection": "magnitude", "refit": False}):
            new = realise_groups(resnet20_user, wg, analyses, full, "warm", **init_kw)
            torch.testing.assert_close(new(x), ref, rtol=1e-5, atol=1e-5)


def _redundant_net() -> nn.Module:
    """conv0's channel 5 is exactly 0.5·ch0 − 2·ch3 + 0.3 (weights and bias), read by an unpadded conv."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(3, 6, 3), nn.Conv2d(6, 5, 3), nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(5, 4)).double().eval()
    with torch.no_grad():
        w, b = net[0].weight, net[0].bias
        w[5] = 0.5 * w[0] - 2 * w[3]
        b[5] = 0.5 * b[0] - 2 * b[3] + 0.3
    return net


def test_refit_with_a_redundant_channel_is_exact() -> None:
    """Gc is singular along (ch5 − 0.5·ch0 + 2·ch3); leverage drops a channel of that relation (ch3, whose
    component along the null direction is largest) and the least-squares merge re-expresses it exactly."""
    net = _redundant_net()
    data = Dataset(torch.randn(32, 3, 10, 10, dtype=torch.float64))
    wg, analyses = _analysed(net, data, 0.0, ("0",))
    cuts = group_cuts(wg, analyses, {"0": 5}, "leverage", refit=True, ridge=0.0)
    assert list(cuts["0"].keep) == [0, 1, 2, 4, 5]
    cut = apply_cuts(wg, cuts)
    assert cut.get_submodule("0").out_channels == 5 and cut.get_submodule("1").in_channels == 5
    with torch.no_grad():
        torch.testing.assert_close(cut(data.x), net(data.x), rtol=1e-10, atol=1e-10)
        plain = apply_cuts(wg, {"0": type(cuts["0"])(cuts["0"].keep)})
        assert (plain(data.x) - net(data.x)).abs().max() > 1e-3  # without the refit the cut is not exact


def test_scratch_reinitialises_every_layer(resnet20_user, small_images) -> None:
    wg, analyses = _analysed(resnet20_user, small_images, 1e-2)
    widths = {n: a.rank_c for n, a in analyses.items()}
    new = realise_groups(resnet20_user, wg, analyses, widths, "scratch", seed=4)
    bn = new.get_submodule("layer1.0.bn1")
    assert torch.equal(bn.running_var, torch.ones_like(bn.running_var))
    assert torch.equal(bn.weight, torch.ones_like(bn.weight))
    assert new.get_submodule("layer1.0.conv1").out_channels == widths["layer1.0.conv1"]
    again = realise_groups(resnet20_user, wg, analyses, widths, "scratch", seed=4)
    assert all(torch.equal(p, q) for p, q in zip(new.parameters(), again.parameters()))


def _group_widths(original: nn.Module, x: torch.Tensor, new: nn.Module, names: list[str]) -> list[int]:
    """Per group: the widest layer writing it (a group's producers may each write only part of it)."""
    wg = analyse(original, x[:2])
    return [max(new.get_submodule(u.target).out_channels for u in wg.group(n).uses if u.role == "producer")
            for n in names]


def test_cbalanced_realises_the_user_resnet_with_onnx_parity(resnet20_user, small_images, tmp_path) -> None:
    """No hand-written surgery: the traced graph's groups are resized, widths rounded up to multiples of 8."""
    cfg = CBalancedConfig(energy_eps=1e-2, controls=False, width_multiple=8, go_samples=16)
    new, rep = compress(resnet20_user, small_images, "cbalanced", cfg)
    assert rep.predicted["realisation"] == "channel groups"
    names = [layer.name for layer in rep.layers]
    assert names[0] == "conv1" and len(names) == 10
    widths, ranks = rep.predicted["widths"], rep.predicted["ranks_c"]
    assert widths == _group_widths(resnet20_user, small_images.x, new, names) == [layer.rank for layer in rep.layers]
    assert all(w % 8 == 0 and r <= w < r + 8 for w, r in zip(widths, ranks))
    assert new.get_submodule("linear").in_features == widths[0]
    assert rep.params_after < rep.params_before
    path = tmp_path / "resnet20.onnx"
    to_onnx(new, small_images.x[:2], path)
    assert verify_parity(new, path, [small_images.x[:1], small_images.x[:5]], rtol=1e-4, atol=1e-5).passed


def test_uniform_control_on_groups(resnet20_user, small_images) -> None:
    cfg = CBalancedConfig(energy_eps=1e-2, controls=True, go_samples=8, state_points=("conv1", "layer3.0.conv1"))
    _, rep = compress(resnet20_user, small_images, "cbalanced", cfg, RecoveryConfig(epochs=1))
    variants = rep.measured["variants"]
    assert set(variants) == {"scratch", "warm_untrained", "uniform"}
    assert rep.measured.get("projected") is None
    assert abs(variants["uniform"]["params"] - rep.params_after) < 0.1 * rep.params_before


def test_torch_export_programs_are_refused_in_one_line(tmp_path) -> None:
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)).eval()
    x = torch.randn(12, 3, 8, 8)
    torch.export.save(torch.export.export(net, (x[:2],)), tmp_path / "net.pt2")
    program = load_model(str(tmp_path / "net.pt2"))  # as `minreal` loads a .pt2 model spec
    data = Dataset(x, torch.randint(0, 3, (12,)))
    with pytest.raises(CompressionError, match=r"torch.export program") as info:
        compress(program, data, "cbalanced", CBalancedConfig(controls=False))
    assert len(str(info.value).splitlines()) == 1 and "file.py:factory" in str(info.value)


def test_option_a_stream_cut_keeps_the_pad_offsets_consistent(resnet20_user, small_images) -> None:
    """Cutting only the stream group: every layer reading the stream reads exactly the kept channels among those
    its input carries (16 of the 64 in stage 1, 32 in stage 2), so the channel pads shrink to match."""
    wg, analyses = _analysed(resnet20_user, small_images, 1e-2, ("conv1",))
    new = realise_groups(resnet20_user, wg, analyses, {"conv1": 40}, "warm")
    kept = set(group_cuts(wg, analyses, {"conv1": 40}, "leverage", False, 0.0)["conv1"].keep)
    stream = wg.group("conv1")
    readers = [u for u in stream.uses if u.role == "consumer"]
    assert len(readers) == 10
    for u in readers:
        layer = new.get_submodule(u.target)
        width = layer.in_channels if isinstance(layer, nn.Conv2d) else layer.in_features
        assert width == len([a for a in wg.channel_atoms(stream, u.source) if a in kept])
    out = new(small_images.x[:3])
    assert out.shape == (3, 10) and bool(torch.isfinite(out).all())
