"""C-balanced method: ranks of the three tests, realised networks, exact limits, ONNX parity (Sequential MLPs on
their own realisation; CNNs and ResNets on the channel groups of their traced graph)."""

from __future__ import annotations

import re
from dataclasses import fields

import numpy as np
import pytest
import torch
from torch import nn

from minreal.compress.core.chain import mlp_params
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.width import analyse
from minreal.compress.methods.cbalanced import (
    CBalancedConfig,
    analyse_states,
    budget_ranks,
    closest_uniform_width,
    group_gramians,
    realise,
    realise_groups,
    select_groups,
)
from minreal.compress.methods.cbalanced.empirical_gramians import collect_gramians
from minreal.compress.methods.cbalanced.method import _c_states
from minreal.compress.methods.cbalanced.realise import (
    insert_projections,
    refit_linear_chain,
    resize_sequential,
    sequential_params,
    stage_producers,
)
from minreal.compress.models import mlp
from minreal.compress.registry import compress, get_method
from minreal.export.onnx_export import to_onnx
from minreal.export.verify import verify_parity

FAST = dict(controls=False)
TRAIN = RecoveryConfig(epochs=2)


def _analyses(model: nn.Module, data: Dataset, eps: float, budget: int | None = None):
    return analyse_states(collect_gramians(model, data), eps, budget)


def test_registered_with_cli_fields() -> None:
    m = get_method("cbalanced")
    names = {f.name for f in fields(m.config_cls)}
    assert {"energy_eps", "state_budget", "init", "selection", "controls"} <= names
    # its training is the run's recovery (the shared --recover-* knobs), not options of its own
    assert not {"epochs", "lr", "alpha", "temperature", "distill", "train_batch_size", "val_fraction"} & names
    assert m.takes_recovery


def test_subspace_data_gives_ra_equal_to_its_dimension() -> None:
    """Inputs x = Q a with Q of rank 3: every state of a linear network lies in a 3-dim affine subspace."""
    torch.manual_seed(0)
    net = mlp(10, [8, 6], 4, activation="identity").double().eval()
    q = torch.linalg.qr(torch.randn(10, 3, dtype=torch.float64)).Q
    data = Dataset(torch.randn(200, 3, dtype=torch.float64) @ q.T)
    for a in _analyses(net, data, eps=1e-12).values():
        assert a.rank_a == 3
        assert a.rank_c <= 3


def test_eps_zero_gives_full_rank(mlp_data) -> None:
    """Equal widths and smooth activations: every state is reachable and observable, so ε = 0 keeps all."""
    torch.manual_seed(0)
    net = mlp(12, [6, 6], 8, activation="tanh").eval()
    analyses = _analyses(net, mlp_data, eps=0.0)
    assert [(a.rank_a, a.rank_b, a.rank_c) for a in analyses.values()] == [(6, 6, 6)] * 2
    coarse = _analyses(net, mlp_data, eps=1e-2)
    assert all(coarse[p].rank_c < 6 for p in analyses)


def test_c_spectrum_is_the_product_gramian_spectrum(tiny_mlp, mlp_data) -> None:
    """eig(Gc^½ Go Gc^½) = eig(Gc Go) (similar matrices): the squared Hankel singular values."""
    grams = collect_gramians(tiny_mlp, mlp_data)
    for p, a in analyse_states(grams, 1e-4).items():
        direct = np.sort(np.linalg.eigvals((grams[p].gc @ grams[p].go).numpy()).real)[::-1]
        np.testing.assert_allclose(a.spectra["C"], np.clip(direct, 0, None), rtol=1e-6, atol=1e-9 * direct[0])


def test_budget_ranks_fit_the_budget_with_equal_energy() -> None:
    spectra = {"a": 0.5 ** np.arange(20), "b": 0.8 ** np.arange(30)}
    ranks = budget_ranks(spectra, 15)
    assert sum(ranks.values()) <= 15
    assert sum(budget_ranks(spectra, 16).values()) >= sum(ranks.values())
    energy = {n: spectra[n][: r].sum() / spectra[n].sum() for n, r in ranks.items()}
    minus_one = {n: spectra[n][: r - 1].sum() / spectra[n].sum() for n, r in ranks.items()}
    assert max(minus_one.values()) < min(energy.values()) + 1e-12  # one common energy threshold
    with pytest.raises(CompressionError, match="below one state"):
        budget_ranks(spectra, 1)


def test_realised_mlp_has_reported_widths_and_closed_form_params(tiny_mlp, mlp_data) -> None:
    new, rep = compress(tiny_mlp, mlp_data, "cbalanced", CBalancedConfig(energy_eps=1e-2, **FAST))
    widths = [m.out_features for m in new if isinstance(m, nn.Linear)][:-1]
    assert widths == rep.predicted["ranks_c"] == [layer.rank for layer in rep.layers]
    assert rep.params_after == sum(p.numel() for p in new.parameters()) == mlp_params(12, widths, 5)
    assert rep.predicted["state_order"] == sum(widths)
    assert rep.predicted["state_compression"] == pytest.approx(1 - sum(widths) / 56)
    assert np.isfinite(rep.measured["relative_output_error"])


def test_state_budget_sets_total_order(tiny_mlp, mlp_data) -> None:
    _, rep = compress(tiny_mlp, mlp_data, "cbalanced", CBalancedConfig(state_budget=20, **FAST))
    assert sum(rep.predicted["ranks_c"]) <= 20


def test_full_width_warm_start_with_refit_reproduces_the_original(tiny_mlp, mlp_data) -> None:
    analyses = _analyses(tiny_mlp, mlp_data, eps=0.0)
    full = {p: a.dim for p, a in analyses.items()}
    new = realise(tiny_mlp, analyses, full, "warm", mlp_data, ridge=0.0)
    torch.testing.assert_close(new(mlp_data.x), tiny_mlp(mlp_data.x), rtol=1e-4, atol=1e-4)


def test_unlabelled_data_is_enough(tiny_mlp, mlp_data) -> None:
    """Gramians need inputs only and the recovery distils from the original: unlabelled data gives the very
    network labelled data gives (labels play no part in the method), with or without a recovery after it."""
    unlabelled = Dataset(mlp_data.x)
    cfg = CBalancedConfig(energy_eps=1e-2, init="warm", controls=False)
    new, rep = compress(tiny_mlp, unlabelled, "cbalanced", cfg)
    same, _ = compress(tiny_mlp, mlp_data, "cbalanced", cfg)
    torch.testing.assert_close(new(mlp_data.x), same(mlp_data.x), rtol=0, atol=0)
    assert rep.params_after < rep.params_before and rep.recovery is None
    recovered, rep = compress(tiny_mlp, unlabelled, "cbalanced", cfg, TRAIN)
    assert rep.recovery["epochs"] == 2 and "accuracy" not in rep.recovery["after"]


def test_scratch_and_controls_need_the_runs_recovery(tiny_mlp, mlp_data) -> None:
    """A scratch start is an untrained network and the controls are trainings: without a recovery budget both are
    refused in one line naming the shared knob."""
    for cfg in (CBalancedConfig(init="scratch", controls=False), CBalancedConfig(controls=True)):
        with pytest.raises(CompressionError, match="--recover-epochs") as info:
            compress(tiny_mlp, mlp_data, "cbalanced", cfg)
        assert len(str(info.value).splitlines()) == 1
    new, rep = compress(tiny_mlp, mlp_data, "cbalanced", CBalancedConfig(init="scratch", controls=False), TRAIN)
    assert rep.recovery["epochs"] == 2


def test_a_chain_hands_its_recovery_to_cbalanced_as_its_last_step(tiny_mlp, mlp_data) -> None:
    """In a plan chain the recovery trains the last step's result: a scratch cbalanced runs there, and is refused
    earlier in the chain (a later method would read an untrained network)."""
    from minreal.compress.methods.fde import FDEConfig
    from minreal.compress.registry import compress_chain

    scratch = CBalancedConfig(init="scratch", controls=False)
    new, rep = compress_chain(tiny_mlp, mlp_data, [("fde", FDEConfig(merge_eps=0.0)), ("cbalanced", scratch)], TRAIN)
    assert rep.recovery["epochs"] == 2
    with pytest.raises(CompressionError, match="as its last step"):
        compress_chain(tiny_mlp, mlp_data, [("cbalanced", scratch), ("fde", FDEConfig(merge_eps=0.0))], TRAIN)


def test_gramians_never_see_the_recoverys_held_out_split(tiny_mlp, mlp_data) -> None:
    """With a recovery the Gramians come from its training split only: changing the held-out samples' inputs
    changes nothing the method computes."""
    from minreal.compress.core.recover import recovery_split

    cfg = CBalancedConfig(energy_eps=1e-2, controls=False)
    _, val, _ = recovery_split(mlp_data, TRAIN)
    held = {tuple(row.tolist()) for row in val.x}
    x = mlp_data.x.clone()
    for i in range(len(x)):
        if tuple(x[i].tolist()) in held:
            x[i] = 100.0 * torch.randn_like(x[i])
    moved = Dataset(x, mlp_data.y)
    assert not torch.equal(x, mlp_data.x)
    spec = get_method("cbalanced")  # the method alone: the recovery that follows it would train on the split
    a, _ = spec.run(tiny_mlp, mlp_data, cfg, TRAIN)
    b, _ = spec.run(tiny_mlp, moved, cfg, TRAIN)
    torch.testing.assert_close(a(mlp_data.x), b(mlp_data.x), rtol=0, atol=0)
    c, _ = spec.run(tiny_mlp, moved, cfg, None)  # without a recovery every sample counts
    assert not torch.equal(a(mlp_data.x), c(mlp_data.x))


def test_least_squares_refit_beats_copying_the_kept_neurons() -> None:
    """One hidden layer: the refitted output layer is the least-squares optimum on the calibration set."""
    torch.manual_seed(0)
    net = mlp(12, [40], 5, activation="tanh").eval()
    data = Dataset(torch.randn(300, 12))
    keep = {1: torch.arange(0, 40, 3)}
    copied = resize_sequential(net, {1: len(keep[1])}, keep)
    refitted = resize_sequential(net, {1: len(keep[1])}, keep)
    refit_linear_chain(net, refitted, data.x, [1], keep, ridge=0.0)
    ref = net(data.x)
    err = lambda m: float((m(data.x) - ref).detach().norm())  # noqa: E731
    assert err(refitted) < 0.9 * err(copied)


def test_projection_at_full_rank_is_the_identity(tiny_mlp, mlp_data) -> None:
    analyses = _analyses(tiny_mlp, mlp_data, eps=0.0)
    proj = insert_projections(tiny_mlp, {p: (a.basis(a.dim), a.mean) for p, a in analyses.items()})
    torch.testing.assert_close(proj(mlp_data.x), tiny_mlp(mlp_data.x), rtol=1e-4, atol=1e-4)
    assert sum(p.numel() for p in proj.parameters()) > sum(p.numel() for p in tiny_mlp.parameters())


def test_uniform_width_is_the_closest_parameter_match(tiny_mlp) -> None:
    prods = list(stage_producers(tiny_mlp, ["2", "4"]).values())
    target = sequential_params(tiny_mlp, {1: 9, 3: 4})
    w = closest_uniform_width(lambda v: sequential_params(tiny_mlp, {i: v for i in prods}), target, 4 * 32 + 1)
    gap = lambda v: abs(mlp_params(12, [v, v], 5) - target)  # noqa: E731
    assert gap(w) <= min(gap(w - 1), gap(w + 1))


def test_warm_report_lists_controls(tiny_mlp, mlp_data) -> None:
    """The controls (the other start, the uniform-width network) are trained by the run's own recovery config;
    the warm start itself is left to the recovery that follows the method."""
    cfg = CBalancedConfig(energy_eps=1e-2, controls=True)
    _, rep = compress(tiny_mlp, mlp_data, "cbalanced", cfg, TRAIN)
    variants = rep.measured["variants"]
    assert set(variants) == {"scratch", "warm_untrained", "uniform"}
    assert variants["scratch"]["epochs_run"] == variants["uniform"]["epochs_run"] == rep.recovery["epochs"] == 2
    target = rep.params_after
    assert abs(variants["uniform"]["params"] - target) <= 2 * (12 + 5 + 2) + target // 10
    assert rep.measured["projected"]["params"] > rep.params_before


def _cnn_closed_form(w: list[int], cin: int = 3, classes: int = 4) -> int:
    """small_cnn without conv biases: 9·c_{i−1}·c_i + 2c_i per Conv-BN stage, (c_3 + 1)·classes for the head."""
    return sum(9 * a * b + 2 * b for a, b in zip([cin, *w[:-1]], w)) + (w[-1] + 1) * classes


def test_realised_cnn_has_reported_channel_widths(tiny_cnn, image_data) -> None:
    cfg = CBalancedConfig(energy_eps=1e-2, init="scratch", width_multiple=1, **FAST)
    new, rep = compress(tiny_cnn, image_data, "cbalanced", cfg, TRAIN)
    assert isinstance(new, nn.Sequential) and rep.predicted["realisation"] == "channel groups"
    convs = [m.out_channels for m in new if isinstance(m, nn.Conv2d)]
    bns = [m.num_features for m in new if isinstance(m, nn.BatchNorm2d)]
    assert convs == bns == rep.predicted["ranks_c"] == rep.predicted["widths"]
    assert new[-1].in_features == convs[-1]
    assert rep.params_after == _cnn_closed_form(convs)


def test_wrapped_mlp_is_realised_on_its_channel_groups(mlp_data) -> None:
    """A model that is not a Sequential goes through the traced graph; its state point may name the activation
    module (whose output carries the hidden group), as on the Sequential path."""
    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = mlp(12, [8], 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    torch.manual_seed(0)
    new, rep = compress(Wrapped().eval(), mlp_data, "cbalanced", CBalancedConfig(state_points=("body.2",), **FAST))
    assert [layer.name for layer in rep.layers] == ["body.1"]
    assert new.get_submodule("body.1").out_features == rep.predicted["widths"][0]
    assert new.get_submodule("body.3").in_features == rep.predicted["widths"][0]
    with pytest.raises(CompressionError, match="neither a channel group"):
        compress(Wrapped(), mlp_data, "cbalanced", CBalancedConfig(state_points=("body.9",), **FAST))


@pytest.mark.parametrize("case", ["mlp", "cnn"])
def test_realised_models_export_with_parity(case, tiny_mlp, mlp_data, tiny_cnn, image_data, tmp_path) -> None:
    model, data = (tiny_mlp, mlp_data) if case == "mlp" else (tiny_cnn, image_data)
    new, _ = compress(model, data, "cbalanced", CBalancedConfig(energy_eps=1e-2, **FAST))
    path = tmp_path / "realised.onnx"
    to_onnx(new, data.x[:2], path)
    result = verify_parity(new, path, [data.x[:1], data.x[:7]], rtol=1e-4, atol=1e-5)
    assert result.passed


def test_demo_case_is_a_trained_mlp_with_a_cbalanced_run() -> None:
    from minreal.compress.core.evaluate import predict
    from minreal.compress.methods.cbalanced import demo_case

    case = demo_case(quick=True)
    assert [r.method for r in case.runs] == ["cbalanced"]
    acc = float((predict(case.model, case.test).argmax(1) == case.test.y).double().mean())
    assert acc > 0.9


@pytest.fixture
def tiny_resnet() -> nn.Module:
    from torchvision.models.resnet import BasicBlock, ResNet

    torch.manual_seed(7)
    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=4)
    with torch.no_grad():  # non-trivial BatchNorm statistics and affine maps, so copying must get them right
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return model.eval()


@pytest.fixture
def resnet_data() -> Dataset:
    g = torch.Generator().manual_seed(11)
    return Dataset(torch.randn(32, 3, 16, 16, generator=g), torch.randint(0, 4, (32,), generator=g))


def _group_analyses(model: nn.Module, data: Dataset, eps: float):
    wg = analyse(model, data.x[:2])
    return wg, analyse_states(group_gramians(wg, select_groups(wg), data, go_samples=8), eps)


#: The channel groups of torchvision's ResNet of [1, 1, 1, 1] basic blocks: the stem with layer1's stream
#: (identity shortcut), each block's inner width, and the stream of each later stage (projection shortcut).
RESNET_GROUPS = ["conv1", "layer1.0.conv1", "layer2.0.conv1", "layer2.0.conv2", "layer3.0.conv1", "layer3.0.conv2",
                 "layer4.0.conv1", "layer4.0.conv2"]


def _resnet_closed_form(w: dict[str, int], classes: int = 4) -> int:
    """Parameters of the [1,1,1,1] ResNet at group widths (no conv biases): stem 147·s₁ + 2s₁; per block with inner
    width b, input stream a and output stream s: 9ab + 2b + 9bs + 2s, plus 1·a·s + 2s for a projection (layer1's
    output stream is the stem's); head (s₄ + 1)·classes."""
    s = [w["conv1"], w["layer2.0.conv2"], w["layer3.0.conv2"], w["layer4.0.conv2"]]
    inner = [w["layer1.0.conv1"], w["layer2.0.conv1"], w["layer3.0.conv1"], w["layer4.0.conv1"]]
    total = 147 * s[0] + 2 * s[0]
    for i, b in enumerate(inner):
        a, out = s[max(i - 1, 0)] if i else s[0], s[i]
        total += 9 * a * b + 2 * b + 9 * b * out + 2 * out + (a * out + 2 * out if i else 0)
    return total + (s[-1] + 1) * classes


def test_resnet_closed_form_matches_the_original(tiny_resnet, resnet_data) -> None:
    wg = analyse(tiny_resnet, resnet_data.x[:2])
    assert [g.name for g in select_groups(wg)] == RESNET_GROUPS
    full = {g.name: g.size for g in select_groups(wg)}
    assert _resnet_closed_form(full) == sum(p.numel() for p in tiny_resnet.parameters())


def test_realised_resnet_has_group_widths_and_closed_form_params(tiny_resnet, resnet_data) -> None:
    wg, analyses = _group_analyses(tiny_resnet, resnet_data, 1e-2)
    widths = {p: a.rank_c for p, a in analyses.items()}
    assert all(0 < r < a.dim for r, a in zip(widths.values(), analyses.values()))
    new = realise_groups(tiny_resnet, wg, analyses, widths, "scratch")
    for s, stream in (("layer2", "layer2.0.conv2"), ("layer3", "layer3.0.conv2"), ("layer4", "layer4.0.conv2")):
        blk = new.get_submodule(f"{s}.0")
        assert blk.conv1.out_channels == blk.bn1.num_features == blk.conv2.in_channels == widths[f"{s}.0.conv1"]
        assert blk.conv2.out_channels == blk.bn2.num_features == widths[stream]
        assert blk.get_submodule("downsample.0").out_channels == widths[stream]
    assert new.conv1.out_channels == new.get_submodule("layer1.0.conv2").out_channels == widths["conv1"]
    assert new.fc.in_features == widths["layer4.0.conv2"]
    assert sum(p.numel() for p in new.parameters()) == _resnet_closed_form(widths)
    out = new(resnet_data.x[:5])
    assert out.shape == (5, 4) and torch.isfinite(out).all()


@pytest.mark.parametrize("selection", ["leverage", "magnitude"])
def test_full_width_resnet_warm_start_reproduces_the_original(selection, tiny_resnet, resnet_data) -> None:
    wg, analyses = _group_analyses(tiny_resnet, resnet_data, 0.0)
    full = {p: a.dim for p, a in analyses.items()}
    new = realise_groups(tiny_resnet, wg, analyses, full, "warm", selection=selection)
    with torch.no_grad():
        torch.testing.assert_close(new(resnet_data.x), tiny_resnet(resnet_data.x), rtol=1e-5, atol=1e-5)


def test_realised_resnet_exports_with_parity(tiny_resnet, resnet_data, tmp_path) -> None:
    cfg = CBalancedConfig(energy_eps=1e-2, controls=False, go_samples=8)
    new, rep = compress(tiny_resnet, resnet_data, "cbalanced", cfg)
    assert [layer.name for layer in rep.layers] == RESNET_GROUPS
    block = new.get_submodule("layer2.0")
    assert [block.conv1.out_channels, block.conv2.out_channels] == rep.predicted["widths"][2:4]
    assert all(w % 8 == 0 for w in rep.predicted["widths"])  # every group is at least 16 wide
    path = tmp_path / "resnet.onnx"
    to_onnx(new, resnet_data.x[:2], path)
    result = verify_parity(new, path, [resnet_data.x[:1], resnet_data.x[:6]], rtol=1e-4, atol=1e-5)
    assert result.passed


def _next_allocation(rep, full: int) -> int | None:
    """The smallest total state budget whose equal-energy ranks differ from the report's (None: none up to full
    width): the next network the budget search could have chosen."""
    spectra = {p: np.asarray(s["C"]) for p, s in rep.spectra.items()}
    ranks = dict(zip(spectra, rep.predicted["ranks_c"], strict=True))
    return next((t for t in range(sum(ranks.values()), full + 1) if budget_ranks(spectra, t) != ranks), None)


@pytest.mark.parametrize("kind, ratio", [("mac_ratio", 0.5), ("param_ratio", 0.4)])
def test_a_whole_model_budget_takes_the_largest_state_budget_that_meets_it(kind, ratio, tiny_cnn,
                                                                           image_data) -> None:
    """The realised network meets the budget as the report counts it, and the next larger equal-energy allocation
    (what ``--state-budget`` realises) does not: nothing bigger that meets it was left out."""
    opts = dict(controls=False, width_multiple=1)
    _, rep = compress(tiny_cnn, image_data, "cbalanced", CBalancedConfig(**{kind: ratio}, **opts))
    reached = rep.predicted.budget["achieved"]
    measured = rep.mac_ratio if kind == "mac_ratio" else rep.param_ratio
    assert rep.predicted.budget["kind"] == kind and reached == measured <= ratio
    # width multiple 1: the budget ranks themselves, grown where budget was left
    assert all(w >= r for w, r in zip(rep.predicted["widths"], rep.predicted["ranks_c"], strict=True))
    assert rep.predicted.budget_cost_ratio == pytest.approx(reached)
    bigger = _next_allocation(rep, rep.predicted["state_order_full"])
    assert bigger is not None  # 8/16/16 channels over 144 positions: no spectrum saturates here
    _, up = compress(tiny_cnn, image_data, "cbalanced", CBalancedConfig(state_budget=bigger, **opts))
    assert (up.mac_ratio if kind == "mac_ratio" else up.param_ratio) > ratio


def test_a_mac_budget_on_an_mlp_counts_its_linear_layers(tiny_mlp, mlp_data) -> None:
    """MLP path: the reached ratio is Σ in·out of the realised Linear layers over the original's, exactly."""
    new, rep = compress(tiny_mlp, mlp_data, "cbalanced", CBalancedConfig(mac_ratio=0.6, controls=False))
    widths = [m.out_features for m in new if isinstance(m, nn.Linear)][:-1]
    macs = lambda w: sum(a * b for a, b in zip([12, *w], [*w, 5]))  # noqa: E731
    reached = rep.predicted.budget["achieved"]
    assert reached == pytest.approx(macs(widths) / macs([32, 24])) and reached <= 0.6
    spectra = [np.asarray(s["C"]) for s in rep.spectra.values()]
    bigger = _next_allocation(rep, 56)
    ranks = budget_ranks(dict(zip(rep.spectra, spectra, strict=True)), bigger) if bigger is not None else {}
    capped = [min(r, _c_states(lam)) for r, lam in zip(ranks.values(), spectra, strict=False)]
    if capped and capped != rep.predicted["ranks_c"]:  # else the C ranks hold every state with C energy
        assert macs(capped) / macs([32, 24]) > 0.6
    # the budget left is filled: one more neuron anywhere that adds C or A (reachability) energy would miss it
    for i, (w, s) in enumerate(zip(widths, rep.spectra.values(), strict=True)):
        energy = [np.asarray(s[t]) for t in ("C", "A")]
        if w < len(energy[0]) and any(lam[w] > 1e-9 * lam.sum() for lam in energy):  # not a zero's rounding
            assert macs([*widths[:i], w + 1, *widths[i + 1:]]) / macs([32, 24]) > 0.6, (i, widths)
    assert reached > 0.6 - 24 / macs([32, 24])  # within one neuron's cost of the budget


def test_a_classifier_whose_last_layer_observes_few_directions_still_spends_its_budget(tiny_mlp, mlp_data) -> None:
    """Review: the layer feeding a 5-class head has C energy in about 5 states only, so every ratio below 1 gave the
    same network (0.48 of the MACs here whether 0.7 or 0.95 was asked); the budget left now goes by reachability."""
    for ratio in (0.7, 0.95):
        _, rep = compress(tiny_mlp, mlp_data, "cbalanced", CBalancedConfig(mac_ratio=ratio, controls=False))
        assert ratio - 0.05 < rep.predicted.budget["achieved"] <= ratio and "budget_overshot" not in rep.predicted
        notes = " ".join(rep.notes)
        floor = re.search(r"cost ratio ([0-9.]+) \(every state with C energy: a --mac-ratio down to ([0-9.]+) keeps",
                          notes)
        assert "A energy per cost)" in notes and floor and floor[1] == floor[2]
        last = rep.layers[-1]
        assert last.rank > last.details["rank_c"]
        assert last.reason == "width = C rank widened by the budget left (see the notes)"
        # second review: past the states with C energy, equal energy jumped a layer to full width; the C ranks stop
        # at those states, and what the budget leaves goes by reachability
        for layer, spectra in zip(rep.layers, rep.spectra.values(), strict=True):
            assert layer.details["rank_c"] <= _c_states(spectra["C"])


def test_a_budget_below_one_state_per_point_is_refused_before_realising(tiny_cnn, image_data) -> None:
    with pytest.raises(CompressionError) as err:
        compress(tiny_cnn, image_data, "cbalanced", CBalancedConfig(mac_ratio=0.001, controls=False))
    msg = str(err.value)
    assert msg.startswith("`mac_ratio` 0.001 cannot be met: cbalanced keeping one state per state point (3, ")
    assert "give `mac_ratio` >= " in msg and "\n" not in msg and err.value.fields == ("mac_ratio",)
    least = float(msg.rsplit(">= ", 1)[1])  # rounded up: the ratio it names is met (review: 0.155 was refused)
    _, rep = compress(tiny_cnn, image_data, "cbalanced", CBalancedConfig(mac_ratio=least, controls=False))
    assert rep.predicted.budget["achieved"] <= least
    with pytest.raises(CompressionError, match="give `state_budget` or `param_ratio`, not both"):
        CBalancedConfig(param_ratio=0.5, state_budget=10)


def test_the_budget_search_leaves_the_random_state_as_it_was(tiny_mlp, mlp_data) -> None:
    """Costing a width set builds fresh layers (MLP path); a seeded run must not depend on how many it costed: each
    network the search builds for its cost leaves the global generator as it was."""
    from minreal.compress.methods.cbalanced.method import _mlp_plan

    plan = _mlp_plan(tiny_mlp, mlp_data, CBalancedConfig(controls=False))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    for widths in ({"2": 8, "4": 4}, {"2": 30, "4": 20}):
        assert plan.params(widths) == mlp_params(12, list(widths.values()), 5)
    torch.testing.assert_close(torch.rand(3), expected)


@pytest.mark.parametrize("kind", ["mac_ratio", "param_ratio"])
def test_an_mlps_width_sets_are_costed_in_closed_form_as_the_built_network_counts_them(tiny_mlp, mlp_data,
                                                                                        kind: str) -> None:
    """The tool's own cost: the budget fill costs a network per one-neuron step on an MLP (hidden 1024: 1,066 width
    sets, 16 s, most of it building and initialising layers). A chain of Linears is costed in closed form, equal to
    the count of the network built at every width set tried, and the budget search gives the same widths; a chain
    holding a norm is built as before."""
    from minreal.compress.methods.cbalanced import method as cb

    plan = cb._mlp_plan(tiny_mlp, mlp_data, CBalancedConfig(controls=False))
    example = mlp_data.x[:8]
    closed = cb._Costed(tiny_mlp, plan, example, kind)
    assert closed.chain is not None
    plan_built = cb._Plan(**{f.name: getattr(plan, f.name) for f in fields(plan)} | {"chain": None})
    built = cb._Costed(tiny_mlp, plan_built, example, kind)
    rng = np.random.default_rng(0)
    for _ in range(20):
        widths = {"2": int(rng.integers(1, 33)), "4": int(rng.integers(1, 25))}
        assert closed(widths, {}) == built(widths, {})
    for budget in (0.3, 0.55, 0.8):
        cfg = CBalancedConfig(controls=False, **{kind: budget})
        fast, _ = compress(tiny_mlp, mlp_data, "cbalanced", cfg)
        original = cb._linear_chain
        try:
            cb._linear_chain = lambda *a: None
            slow, _ = compress(tiny_mlp, mlp_data, "cbalanced", cfg)
        finally:
            cb._linear_chain = original
        assert [m.out_features for m in fast if isinstance(m, nn.Linear)] == \
            [m.out_features for m in slow if isinstance(m, nn.Linear)]
    normed = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 5)).eval()
    assert cb._linear_chain(normed, {"2": 0}) is None


def test_tune_searches_only_methods_with_a_mac_budget_and_two_phases() -> None:
    from minreal.app.tune.search import default_methods

    assert get_method("cbalanced").budgets == ("mac_ratio", "param_ratio") and not get_method("cbalanced").searchable
    assert set(default_methods()) == {"svd", "factorize", "fde", "magnitude", "wanda", "depth"}


def test_an_mlp_without_biases_is_refit_as_linear_maps(mlp_data) -> None:
    """Review: the refit wrote a bias into Linear layers that have none (`'NoneType' object has no attribute
    'copy_'`). A bias-free layer is now fitted without an intercept: at full width the realised network is the
    original (a linear least-squares problem its own weights solve exactly), and no bias appears."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(12, 16, bias=False), nn.ReLU(), nn.Linear(16, 8, bias=False), nn.ReLU(),
                          nn.Linear(16 // 2, 5, bias=False)).eval()
    analyses = _analyses(model, mlp_data, eps=0.0)
    full = realise(model, analyses, {p: a.dim for p, a in analyses.items()}, "warm", mlp_data, ridge=0.0)
    assert all(m.bias is None for m in full if isinstance(m, nn.Linear))
    with torch.no_grad():
        torch.testing.assert_close(full(mlp_data.x), model(mlp_data.x), rtol=1e-4, atol=1e-5)
    new, rep = compress(model, mlp_data, "cbalanced", CBalancedConfig(mac_ratio=0.6, controls=False))
    assert rep.predicted.budget["achieved"] <= 0.6 and all(m.bias is None for m in new if isinstance(m, nn.Linear))


def test_a_ctrl_c_in_the_controls_is_the_first_in_compress_and_a_chain_keeps_them(tiny_mlp, mlp_data,
                                                                                 monkeypatch) -> None:
    """Review: cbalanced ends its controls' training at a Ctrl-C, but the final recovery of the same command still
    caught the next Ctrl-C (only ``run`` counted it), and a chain ending in cbalanced dropped the controls'
    measurements (and with them the Ctrl-C). Both keep them now: the final recovery lets the next Ctrl-C stop."""
    import dataclasses

    from minreal.compress import registry
    from minreal.compress.methods.cbalanced import method as cb
    from minreal.compress.methods.magnitude import MagnitudeConfig

    real_recover, real_apply = cb.recover, registry.apply_recovery
    monkeypatch.setattr(cb, "recover", lambda *a, **k: dataclasses.replace(real_recover(*a, **k), interrupted=True))
    caught: list[bool] = []

    def applied(report, model, new, data, recovery, *a, **k):
        caught.append(recovery.catch_interrupt)
        return real_apply(report, model, new, data, recovery, *a, **k)

    monkeypatch.setattr(registry, "apply_recovery", applied)
    recovery = RecoveryConfig(steps=2)
    _, report = registry.compress(tiny_mlp, mlp_data, "cbalanced", CBalancedConfig(controls=True), recovery)
    assert registry.controls_interrupted(report) and caught == [False]
    caught.clear()
    _, chained = registry.compress_chain(tiny_mlp, mlp_data, [("magnitude", MagnitudeConfig(mac_ratio=0.9)),
                                                              ("cbalanced", CBalancedConfig(controls=True))], recovery)
    assert chained.measured.get("variants") and registry.controls_interrupted(chained) and caught == [False]
    assert "cbalanced: its variants and projected compare with the model that step received (the previous step's " \
           "result), not with the original" in chained.notes
    assert registry.after_interrupts(recovery, chained).catch_interrupt is False and recovery.catch_interrupt
