"""The shared training loop's hooks: the extra loss reaches the gradient, every step is seen, and only the epochs a
hook allows are selected (the last epoch's weights when it allows none)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.train import TrainConfig, train


class _Hooks:
    def __init__(self, allowed: set[int], pull: float = 0.0) -> None:
        self.allowed, self.pull, self.steps, self.snapshots = allowed, pull, 0, []

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        return self.pull * model.weight.square().sum() if self.pull else None

    def after_step(self, out, y, loss, extra) -> None:
        assert out.shape == (len(y), 1) and loss.ndim == 0 and (extra is None) == (not self.pull)
        self.steps += 1

    def after_epoch(self, model: nn.Module, epoch: int, val_loss: float) -> bool:
        self.snapshots.append(model.weight.detach().clone())
        return epoch in self.allowed


def _data() -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    return Dataset(x, x @ torch.tensor([1.0, -2.0, 0.5]))


def _run(hooks: _Hooks, epochs: int = 4) -> tuple[nn.Linear, object]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    cfg = TrainConfig(epochs=epochs, batch_size=8, lr=5e-2, patience=epochs + 1)
    return model, train(model, _data(), None, cfg, hooks=hooks)


def test_only_allowed_epochs_are_selected() -> None:
    hooks = _Hooks(allowed={1})
    model, result = _run(hooks)
    assert hooks.steps == 4 * 5 and len(hooks.snapshots) == 4
    assert result.best_epoch == 1 and torch.equal(model.weight, hooks.snapshots[1])  # later epochs fit better


def test_no_allowed_epoch_keeps_the_last_weights() -> None:
    hooks = _Hooks(allowed=set())
    model, result = _run(hooks)
    assert result.best_epoch == 3 and torch.equal(model.weight, hooks.snapshots[-1])


def test_extra_loss_is_in_the_gradient() -> None:
    plain, _ = _run(_Hooks(allowed={0, 1, 2, 3}))
    pulled, _ = _run(_Hooks(allowed={0, 1, 2, 3}, pull=5.0))
    assert pulled.weight.norm() < 0.8 * plain.weight.norm()  # a strong L2 pull shrinks the weights


def test_extra_loss_callable_is_the_hooks_extra_loss() -> None:
    torch.manual_seed(0)
    by_callable = nn.Linear(3, 1)
    cfg = TrainConfig(epochs=3, batch_size=8, lr=5e-2, patience=4)
    train(by_callable, _data(), None, cfg, extra_loss=lambda m: 5.0 * m.weight.square().sum())
    by_hooks, _ = _run(_Hooks(allowed={0, 1, 2}, pull=5.0), epochs=3)
    assert torch.equal(by_callable.weight, by_hooks.weight)
    with pytest.raises(ValueError, match="not both"):
        train(by_callable, _data(), None, cfg, extra_loss=lambda m: m.weight.sum(), hooks=_Hooks(set()))
