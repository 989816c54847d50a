"""Recovery by distillation from the original (minreal.compress.core.recover) and its wiring into compress()."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import minreal.compress.core.recover as recover_mod
from minreal.compress import compress
from minreal.compress.core.batchnorm import recalibrate_batchnorm
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.recover import recover
from minreal.compress.core.recover_features import feature_points
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.smoke import digits_mlp, digits_subset
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.methods.svd import SVDConfig


@pytest.fixture(scope="module")
def teacher() -> nn.Module:
    """The digits MLP trained briefly (seeded), so that its outputs mean something."""
    model = digits_mlp()
    train(model, digits_subset(600), None, TrainConfig(epochs=8))
    return model.eval()


@pytest.fixture(scope="module")
def unlabelled() -> Dataset:
    return Dataset(digits_subset(256).x)


def _svd(teacher: nn.Module, data: Dataset) -> nn.Module:
    small, _ = compress(teacher, data, "svd", SVDConfig(mac_ratio=0.3, rank_multiple=1))
    return small


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_distillation_without_labels_lowers_kl(teacher: nn.Module, unlabelled: Dataset) -> None:
    small = _svd(teacher, unlabelled)
    shapes = {k: v.shape for k, v in small.state_dict().items()}
    res = recover(teacher, small, unlabelled, RecoveryConfig(epochs=5, alpha=0.0))
    assert res.held_out_samples == 51 and not res.held_out_is_training_data
    assert "accuracy" not in res.after  # no labels: no label metric
    assert res.after["kl"] < 0.6 * res.before["kl"]  # measured 0.091 -> 0.036
    assert res.after["agreement"] >= res.before["agreement"]
    assert res.epochs == 5 and res.steps == 20 and res.samples_seen == 5 * 205
    assert {k: v.shape for k, v in small.state_dict().items()} == shapes
    assert not small.training


def test_labels_add_accuracy_and_steps_budget(teacher: nn.Module) -> None:
    data = digits_subset(256)
    small = _svd(teacher, data)
    res = recover(teacher, small, data, RecoveryConfig(steps=7, alpha=0.5))
    assert res.steps == 7 and res.epochs == 2  # 4 batches per epoch: the second ends part-way
    assert "accuracy" in res.before and "accuracy" in res.after


def test_disabled_leaves_model_bit_identical(teacher: nn.Module, unlabelled: Dataset) -> None:
    small = _svd(teacher, unlabelled)
    before = copy.deepcopy(small)
    res = recover(teacher, small, unlabelled, RecoveryConfig(epochs=0))
    assert _same_weights(small, before) and res.steps == 0 and res.before == res.after


def test_early_stopping_restores_best_weights(teacher: nn.Module, unlabelled: Dataset) -> None:
    """A learning rate far too large only makes the held-out loss worse: the zero-shot weights are kept."""
    small = _svd(teacher, unlabelled)
    before = copy.deepcopy(small)
    res = recover(teacher, small, unlabelled, RecoveryConfig(epochs=20, lr=5.0, warmup=0.0, patience=2))
    assert res.stopped_early and res.best_epoch == 0 and res.epochs == 2
    assert _same_weights(small, before)
    assert res.after == res.before


def test_first_interrupt_keeps_best_weights(teacher: nn.Module, unlabelled: Dataset,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    small = _svd(teacher, unlabelled)
    step, calls, after_epoch_1 = recover_mod._step, [], {}

    def interrupting(*args: object) -> None:
        calls.append(1)
        if len(calls) == 5:  # 4 steps per epoch: the weights of epoch 1, the best so far
            after_epoch_1.update(copy.deepcopy(small.state_dict()))
        if len(calls) == 6:
            raise KeyboardInterrupt
        step(*args)

    monkeypatch.setattr(recover_mod, "_step", interrupting)
    res = recover(teacher, small, unlabelled, RecoveryConfig(epochs=5, alpha=0.0))
    assert res.interrupted and res.steps == 5 and res.epochs == 1 and res.best_epoch == 1
    assert res.after["kl"] < res.before["kl"]
    assert all(torch.equal(v, after_epoch_1[k]) for k, v in small.state_dict().items())


def test_second_interrupt_while_stopping_propagates(teacher: nn.Module, unlabelled: Dataset,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    small = _svd(teacher, unlabelled)

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(recover_mod, "_step", interrupt)
    monkeypatch.setattr(recover_mod, "log_progress", interrupt)  # the second one arrives while stopping
    with pytest.raises(KeyboardInterrupt):
        recover(teacher, small, unlabelled, RecoveryConfig(epochs=2))


def test_batchnorm_recalibration_gives_exact_statistics() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4)).eval()
    data = Dataset(torch.randn(40, 5) * 3 + 1)
    recalibrate_batchnorm(net, data, batch_size=40)
    with torch.no_grad():
        h = net[0](data.x)
    assert torch.allclose(net[1].running_mean, h.mean(0), atol=1e-5)
    assert torch.allclose(net[1].running_var, h.var(0, unbiased=True), atol=1e-4)
    assert net[1].momentum == 0.1 and not net.training


@pytest.mark.parametrize("kwargs, flag", [
    ({"epochs": -1}, "--recover-epochs"), ({"steps": -2}, "--recover-steps"),
    ({"epochs": 1, "steps": 3}, "--recover-steps"), ({"alpha": 1.5}, "--recover-alpha"),
    ({"lr": 0.0}, "--recover-lr"), ({"temperature": 0.0}, "--recover-temperature"),
    ({"val_fraction": 1.0}, "--recover-val-fraction"), ({"patience": 0}, "--recover-patience"),
])
def test_config_validation_names_the_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(CompressionError, match=flag):
        RecoveryConfig(**kwargs)


def test_compress_records_recovery_and_keeps_zero_shot(teacher: nn.Module, unlabelled: Dataset) -> None:
    cfg = SVDConfig(mac_ratio=0.3, rank_multiple=1)
    plain, zero = compress(teacher, unlabelled, "svd", cfg)
    assert zero.recovery is None and "recovered" not in zero.measured
    small, rep = compress(teacher, unlabelled, "svd", cfg, RecoveryConfig(epochs=3, alpha=0.0))
    assert rep.measured["top1_agreement"] == zero.measured["top1_agreement"]  # zero-shot kept as it was
    assert rep.measured["recovered"]["relative_output_error"] < rep.measured["relative_output_error"]
    assert rep.recovery["epochs"] == 3 and "recover" in rep.timings_s
    assert {k: v.shape for k, v in small.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}


def test_feature_points_keep_same_shape_outputs_and_name_the_rest(teacher: nn.Module, unlabelled: Dataset) -> None:
    small = _svd(teacher, unlabelled)  # factorised Linear layers: same output shapes at the same names
    names = [n for n, m in teacher.named_modules() if isinstance(m, nn.Linear)]
    kept, skipped = feature_points(teacher, small, names + ["nowhere"], unlabelled.x[:2])
    assert kept == names and set(skipped) == {"nowhere"}
    narrow = nn.Sequential(nn.Linear(64, 5), nn.ReLU(), nn.Linear(5, 10))
    wide = nn.Sequential(nn.Linear(64, 7), nn.ReLU(), nn.Linear(7, 10))
    kept, skipped = feature_points(wide, narrow, ["0", "2"], torch.randn(2, 64))
    assert kept == ["2"] and "output shape differs" in skipped["0"]


def test_feature_term_is_normalised_mse() -> None:
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3))
    student = copy.deepcopy(teacher)
    x = torch.randn(16, 6)
    with recover_mod._FeatureMatch(teacher, student, ["0", "2"]) as fm, torch.no_grad():
        teacher(x), student(x)
        assert float(fm.loss()) == 0.0
        student[2].bias.add_(0.5)
        student(x)
        t = teacher(x)
        expected = 0.5 * (0.0 + float(((0.25 * torch.ones_like(t)).mean()) / t.var()))
        assert float(fm.loss()) == pytest.approx(expected, rel=1e-5)
    assert not teacher[0]._forward_hooks and not student[2]._forward_hooks  # hooks removed on exit


def test_feature_matching_pulls_the_matched_point_towards_the_teacher(teacher: nn.Module, unlabelled: Dataset) -> None:
    def point_error(small: nn.Module) -> float:
        with recover_mod._FeatureMatch(teacher, small, ["1"]) as fm, torch.no_grad():
            teacher(unlabelled.x), small(unlabelled.x)
            return float(fm.loss())

    base = _svd(teacher, unlabelled)
    plain, matched = copy.deepcopy(base), copy.deepcopy(base)
    recover(teacher, plain, unlabelled, RecoveryConfig(epochs=3, alpha=0.0))
    res = recover(teacher, matched, unlabelled, RecoveryConfig(epochs=3, alpha=0.0, features=("1",),
                                                                feature_weight=10.0))
    assert res.feature_points == ["1"]  # the first factorised layer
    assert point_error(matched) < point_error(plain) and point_error(matched) < point_error(base)


def test_multi_output_regressor_with_float_labels_is_distilled_by_mse() -> None:
    """Four float outputs are not logits: the loss and the metrics are those of a regressor."""
    torch.manual_seed(3)
    x = torch.randn(120, 5)
    data = Dataset(x, torch.stack([x.sum(1), x[:, 0], x[:, 1] * 2, -x[:, 2]], 1))
    teacher = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 4))
    train(teacher, data, None, TrainConfig(epochs=30, lr=1e-2))
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        student[2].bias.add_(1.0)  # a constant shift: invisible to a softmax KL, plain to an MSE
    res = recover(teacher, student, data, RecoveryConfig(epochs=20, lr=1e-2, alpha=0.0))
    assert "agreement" not in res.before and "kl" not in res.before
    assert res.before["mse_to_original"] == pytest.approx(1.0, rel=1e-4)  # the shift, exactly
    assert res.after["mse_to_original"] < 0.1 * res.before["mse_to_original"]


def test_unknown_feature_point_and_label_only_loss_without_labels_are_refused(teacher: nn.Module,
                                                                              unlabelled: Dataset) -> None:
    small = _svd(teacher, unlabelled)
    with pytest.raises(CompressionError, match="--recover-features 'nowhere'"):
        recover(teacher, small, unlabelled, RecoveryConfig(epochs=1, features=("nowhere",)))
    with pytest.raises(CompressionError, match="--recover-alpha 1"):
        recover(teacher, small, unlabelled, RecoveryConfig(epochs=1, alpha=1.0))


def test_a_one_sample_tail_batch_does_not_break_batchnorm() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).eval()
    data = Dataset(torch.randn(25, 6))  # 20 for training after the 20 % split: batches of 19 + 1
    res = recover(net, copy.deepcopy(net), data, RecoveryConfig(epochs=2, batch_size=19))
    assert res.epochs == 2 and res.samples_seen == 2 * 19  # the lone sample is skipped, never a 1-row BN batch


def test_same_seed_gives_identical_weights(teacher: nn.Module, unlabelled: Dataset) -> None:
    runs = []
    for _ in range(2):
        small = _svd(teacher, unlabelled)
        recover(teacher, small, unlabelled, RecoveryConfig(epochs=2, seed=5))
        runs.append(small)
    assert _same_weights(*runs)


def test_without_catching_the_first_interrupt_aborts(teacher: nn.Module, unlabelled: Dataset,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller that already had a Ctrl-C (another variant's recovery) turns catching off: the next one aborts."""
    small = _svd(teacher, unlabelled)

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(recover_mod, "_step", interrupt)
    with pytest.raises(KeyboardInterrupt):
        recover(teacher, small, unlabelled, RecoveryConfig(epochs=2, catch_interrupt=False))


def _held_out_split(data: Dataset, cfg: RecoveryConfig) -> Dataset:
    return recover_mod.recovery_split(data, cfg)[1]


def test_cached_teacher_outputs_give_the_same_recovery(teacher: nn.Module, unlabelled: Dataset,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The teacher's outputs computed once per split train the same model as the teacher run at every step and
    every validation, and the metrics taken from the training's own passes are those measured afresh."""
    cfg = RecoveryConfig(epochs=3, alpha=0.0)
    cached, fresh = _svd(teacher, unlabelled), _svd(teacher, unlabelled)
    start = copy.deepcopy(cached)
    res_cached = recover(teacher, cached, unlabelled, cfg)
    monkeypatch.setattr(recover_mod, "CACHE_LIMIT", 0)  # nothing fits: the teacher runs on every batch
    res_fresh = recover(teacher, fresh, unlabelled, cfg)
    for k, v in cached.state_dict().items():
        assert torch.allclose(v, fresh.state_dict()[k], rtol=1e-4, atol=1e-6), k
    val = _held_out_split(unlabelled, cfg)
    for res in (res_cached, res_fresh):
        assert res.before == pytest.approx(recover_mod.held_out_metrics(teacher, start, val), rel=1e-5, abs=1e-7)
        assert res.after == pytest.approx(recover_mod.held_out_metrics(teacher, cached, val), rel=1e-4, abs=1e-6)


def test_one_progress_line_per_epoch_with_losses_and_metrics(teacher: nn.Module, caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    from minreal.facts import DETAIL_KEY, PROGRESS_KEY

    data = digits_subset(256)
    with caplog.at_level("INFO", logger="minreal.compress.core.recover"):
        recover(teacher, _svd(teacher, data), data, RecoveryConfig(epochs=3))
    epochs = [r for r in caplog.records if getattr(r, PROGRESS_KEY, ("",))[0] == recover_mod.EPOCH_TASK]
    assert [getattr(r, PROGRESS_KEY)[1:] for r in epochs] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    for record in epochs[1:]:
        detail = getattr(record, DETAIL_KEY)
        for part in ("training loss", "validation loss", "agreement", "kl", "accuracy", " s"):
            assert part in detail and detail in record.getMessage()
    steps = [getattr(r, PROGRESS_KEY)[1:] for r in caplog.records
             if getattr(r, PROGRESS_KEY, ("",))[0] == recover_mod.TASK]
    assert steps == [(i, 12) for i in range(1, 13)]  # 4 steps per epoch, the last one once


def test_early_stop_closes_the_epoch_task_and_says_why(teacher: nn.Module, unlabelled: Dataset,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    from minreal.facts import DETAIL_KEY, PROGRESS_KEY

    with caplog.at_level("INFO", logger="minreal.compress.core.recover"):
        recover(teacher, _svd(teacher, unlabelled), unlabelled,
                RecoveryConfig(epochs=20, lr=5.0, warmup=0.0, patience=2))
    last = [r for r in caplog.records if getattr(r, PROGRESS_KEY, ("",))[0] == recover_mod.EPOCH_TASK][-1]
    assert getattr(last, PROGRESS_KEY)[1:] == (20, 20)
    assert getattr(last, DETAIL_KEY).startswith("stopped early after epoch 2; weights of epoch 0 kept")


def test_batchnorm_is_recalibrated_on_a_bounded_seeded_subset(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).eval()
    data = Dataset(torch.randn(100, 6))  # 80 for training
    passes: list[torch.Tensor] = []
    recalibrate = recover_mod.recalibrate_batchnorm

    def recording(model: nn.Module, part: Dataset, batch_size: int) -> None:
        passes.append(part.x)
        recalibrate(model, part, batch_size)

    monkeypatch.setattr(recover_mod, "recalibrate_batchnorm", recording)
    recover(net, copy.deepcopy(net), data, RecoveryConfig(epochs=2, batch_size=16))
    assert len(passes) == 2 and all(len(x) == 80 for x in passes)  # fewer than the bound: all of them
    monkeypatch.setattr(recover_mod, "RECALIBRATION_SAMPLES", 30)
    passes.clear()
    recover(net, copy.deepcopy(net), data, RecoveryConfig(epochs=2, batch_size=16, freeze_batchnorm=True))
    assert len(passes) == 3 and all(torch.equal(x, passes[0]) for x in passes)  # before the first epoch, after each
    train = recover_mod.recovery_split(data, RecoveryConfig(epochs=1))[0]
    assert len(passes[0]) == 30 and all(any(torch.equal(row, t) for t in train.x) for row in passes[0])


@pytest.mark.parametrize("n, steps", [(12, 5), (30, 3), (256, 1)])
def test_a_steps_budget_on_a_small_subsample(teacher: nn.Module, n: int, steps: int) -> None:
    """Short recoveries on subsamples (as a search ranks candidates): the step budget is met exactly, a sample
    too small to split validates on its training data, and the metrics stay finite."""
    data = digits_subset(n)
    res = recover(teacher, _svd(teacher, digits_subset(256)), data, RecoveryConfig(steps=steps, patience=10))
    assert res.steps == steps and res.held_out_is_training_data == (n < recover_mod.MIN_SPLIT)
    assert res.held_out_samples == (n if n < recover_mod.MIN_SPLIT else round(0.2 * n))
    assert all(math.isfinite(v) for v in [*res.before.values(), *res.after.values()])
