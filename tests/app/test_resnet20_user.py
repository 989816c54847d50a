"""A CIFAR ResNet-20 written as user code (examples/resnet20_user.py) and the built-in ``resnet20_cifar``/``digits32``
load through the application's input edge, old checkpoints without ``num_batches_tracked`` included."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.app.callables import SpecError
from minreal.app.data import load_data
from minreal.app.models import load_model

ROOT = Path(__file__).resolve().parents[2]
USER_SPEC = f"{ROOT / 'examples' / 'resnet20_user.py'}:resnet20"


def _trained_like(model: nn.Module) -> nn.Module:
    """Move BatchNorm's running statistics (and the step counts) away from their initial values."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.rand(8, 3, 32, 32) * 2)
    return model.eval()


def _old_checkpoint(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """As saved by torch < 0.4.1: no ``num_batches_tracked`` and no module versions."""
    return {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}


def _old_wrapped_checkpoint(state: dict[str, torch.Tensor]) -> dict:
    """The form widely shared CIFAR ResNet checkpoints take: DataParallel names inside a training checkpoint."""
    return {"state_dict": {f"module.{k}": v for k, v in _old_checkpoint(state).items()}, "best_prec1": 91.7}


@pytest.mark.parametrize("convert", [dict, _old_checkpoint, _old_wrapped_checkpoint],
                         ids=["state_dict", "old_checkpoint", "old_wrapped_checkpoint"])
def test_user_resnet20_loads_its_weights(convert: Callable[[dict], dict], tmp_path: Path) -> None:
    source = _trained_like(load_model(USER_SPEC))
    state = source.state_dict()
    assert sum(k.endswith("num_batches_tracked") for k in state) == 19
    torch.save(convert(state), tmp_path / "resnet20.pth")
    model = load_model(USER_SPEC, weights=tmp_path / "resnet20.pth")
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), source(x))
    assert not model.training


def test_user_resnet20_still_refuses_other_missing_keys(tmp_path: Path) -> None:
    state = _old_checkpoint(load_model(USER_SPEC).state_dict())
    del state["layer2.0.bn1.running_var"]
    torch.save(state, tmp_path / "broken.pth")
    with pytest.raises(SpecError, match=r"missing key 'layer2\.0\.bn1\.running_var'"):
        load_model(USER_SPEC, weights=tmp_path / "broken.pth")


def test_builtin_resnet20_cifar_with_num_classes_and_weights(tmp_path: Path) -> None:
    source = _trained_like(load_model("resnet20_cifar", num_classes=7))
    torch.save(_old_checkpoint(source.state_dict()), tmp_path / "r20.pt")
    model = load_model("resnet20_cifar", weights=tmp_path / "r20.pt", num_classes=7)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert model(x).shape == (2, 7) and torch.equal(model(x), source(x))


def test_builtin_and_user_resnet20_share_parameter_shapes() -> None:
    builtin, user = load_model("resnet20_cifar"), load_model(USER_SPEC)
    assert {k: v.shape for k, v in builtin.state_dict().items()} == {k: v.shape for k, v in user.state_dict().items()}


def test_misspelt_builtin_model_is_suggested() -> None:
    with pytest.raises(SpecError, match=r"'resnet20_cifr'.*built-in model.*did you mean resnet20_cifar"):
        load_model("resnet20_cifr")


def test_digits32_spec_has_the_digits_split() -> None:
    small, large = load_data("digits", seed=1), load_data("digits32", seed=1)
    assert large.calib.x.shape[1:] == (3, 32, 32) and large.evaluation is not None
    assert torch.equal(large.calib.y, small.calib.y) and torch.equal(large.evaluation.y, small.evaluation.y)
    assert large.source == "digits32 (seed 1, 25% held out)"
