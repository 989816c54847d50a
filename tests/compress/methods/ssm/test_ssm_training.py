"""The SSM training helper: weight schedule values, the energy-target controller's direction on tiny runs, the
per-epoch report and the choice of the returned epoch."""

from __future__ import annotations

import pytest
import torch

from minreal.compress.core.data import Dataset
from minreal.compress.methods.ssm import (
    HankelRegularisation,
    SSMTrainSpec,
    controlled_weight,
    scheduled_weight,
    tail_energies,
    train_ssm_classifier,
)


def test_schedule_is_zero_through_warmup_then_linear_to_the_weight() -> None:
    got = [scheduled_weight(k, 10, 2.0, warmup=0.2, ramp=0.4) for k in range(10)]
    assert got == pytest.approx([0, 0, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 2.0, 2.0])
    assert [scheduled_weight(k, 4, 3.0, 0.0, 0.0) for k in range(4)] == [3.0] * 4  # constant
    assert [scheduled_weight(k, 4, 3.0, 0.5, 0.0) for k in range(4)] == [0.0, 0.0, 3.0, 3.0]  # step


def test_controller_step_is_proportional_in_log_weight_and_clipped() -> None:
    assert controlled_weight(1.0, tail=0.05, target_tail=0.01, gain=2.0) == 2.0  # far above: clipped at ×gain
    assert controlled_weight(1.0, tail=0.015, target_tail=0.01, gain=2.0) == pytest.approx(1.5)
    assert controlled_weight(1.0, tail=0.008, target_tail=0.01, gain=2.0) == pytest.approx(0.8)
    assert controlled_weight(1.0, tail=0.001, target_tail=0.01, gain=2.0) == 0.5  # far below: clipped at ÷gain
    assert controlled_weight(1.0, tail=0.01, target_tail=0.01, gain=2.0) == 1.0


def test_regularisation_options_are_checked() -> None:
    with pytest.raises(ValueError, match="needs target_order"):
        HankelRegularisation(target_energy=0.99)
    with pytest.raises(ValueError, match="fractions"):
        HankelRegularisation(warmup=0.7, ramp=0.5)
    with pytest.raises(ValueError, match="gain"):
        HankelRegularisation(target_order=2, target_energy=0.9, gain=1.0)


def _data(n: int = 48) -> Dataset:
    g = torch.Generator().manual_seed(0)
    return Dataset(torch.randn(n, 12, 1, generator=g), torch.randint(0, 3, (n,), generator=g))


def _spec(target_energy: float, warmup: float = 0.0) -> SSMTrainSpec:
    reg = HankelRegularisation(target_order=2, relative=True, warmup=warmup, target_energy=target_energy)
    return SSMTrainSpec(features=4, state=8, depth=1, reg_weight=0.1, epochs=4, batch_size=16, regularisation=reg)


def test_controller_raises_the_weight_while_the_tail_is_above_target() -> None:
    data = _data()
    model, res = train_ssm_classifier(data, None, _spec(target_energy=1 - 1e-9, warmup=0.25))
    weights = [e.weight for e in res.history]
    assert weights == pytest.approx([0.0, 0.1, 0.2, 0.4]) and res.final_weight == pytest.approx(0.8)
    assert all(set(e.tail_energy) == {"blocks.0.ssm"} and e.orders == {"blocks.0.ssm": 2} for e in res.history)
    assert all(e.tail_energy["blocks.0.ssm"] > 1e-9 for e in res.history)
    assert all(0.0 <= e.train_accuracy <= 1.0 and 0.0 <= e.val_accuracy <= 1.0 for e in res.history)
    assert res.history[0].penalty == 0.0 and res.history[1].penalty > 0.0
    # No epoch met the (unreachable) target: the last epoch is kept.
    assert res.selected_epoch == 3
    final = tail_energies(model, target_order=2)[0]
    assert final == pytest.approx(res.history[-1].tail_energy)


def test_controller_lowers_the_weight_while_the_tail_is_below_target() -> None:
    model, res = train_ssm_classifier(_data(), None, _spec(target_energy=1e-6))
    weights, tails = [e.weight for e in res.history], [e.tail_energy["blocks.0.ssm"] for e in res.history]
    assert weights[0] == 0.1 and all(t < 1 - 1e-6 for t in tails)
    expected = [max(0.5, t / (1 - 1e-6)) for t in tails]  # every step lowers the weight by tail / target
    assert [b / a for a, b in zip(weights, weights[1:] + [res.final_weight])] == pytest.approx(expected)
    assert all(f < 1 for f in expected)
    best = min(res.history, key=lambda e: e.val_loss)  # every epoch meets the target: best validation loss
    assert res.selected_epoch == best.epoch


def test_constant_weight_full_norm_reports_no_tails() -> None:
    spec = SSMTrainSpec(features=4, state=8, depth=1, reg_weight=0.01, epochs=2, batch_size=16)
    _, res = train_ssm_classifier(_data(), None, spec)
    assert [e.weight for e in res.history] == [0.01, 0.01]
    assert all(e.tail_energy == {} and e.penalty > 0 for e in res.history)


def test_controller_steps_every_layer_by_its_own_tail() -> None:
    reg = HankelRegularisation(target_order=2, relative=True, target_energy=0.6, gain=4.0)
    spec = SSMTrainSpec(features=4, state=8, depth=2, reg_weight=0.1, epochs=3, batch_size=16, regularisation=reg)
    _, res = train_ssm_classifier(_data(), None, spec)
    names = ["blocks.0.ssm", "blocks.1.ssm"]
    steps = [e.layer_weights for e in res.history] + [res.final_weights]
    for before, after, epoch in zip(steps, steps[1:], res.history):
        assert set(before) == set(names) and epoch.weight == max(before.values())
        for n in names:  # w_l ← w_l · clip(tail_l / 0.4, 1/4, 4), from that layer's own tail alone
            assert after[n] / before[n] == pytest.approx(min(4.0, max(0.25, epoch.tail_energy[n] / 0.4)))
    assert res.final_weight == max(res.final_weights.values())
    w0, w1 = (res.final_weights[n] for n in names)
    assert abs(w0 / w1 - 1) > 0.1  # the layers' tails differ, so one shared weight could not have followed both
