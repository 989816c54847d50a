"""Hub model specs (``timm:NAME``): built through the hub's own builder with random weights, read before
``module:factory``, and refused in one line when the package is missing or the name is not the hub's."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from minreal.app.callables import SpecError
from minreal.app.hub import hub_spec
from minreal.app.models import load_model


def _fake_timm(calls: list[tuple[str, dict[str, Any]]]) -> ModuleType:
    """A stand-in for timm: two model names, and ``create_model`` recording its calls."""
    timm = ModuleType("timm")

    def create_model(name: str, **kwargs: Any) -> nn.Module:
        calls.append((name, kwargs))
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(12, kwargs.get("num_classes", 1000)))

    timm.list_models = lambda: ["resnet18", "resnet50", "convnext_tiny"]  # type: ignore[attr-defined]
    timm.create_model = create_model  # type: ignore[attr-defined]
    return timm


@pytest.fixture
def timm_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setitem(sys.modules, "timm", _fake_timm(calls))
    return calls


@pytest.mark.parametrize("spec, parsed", [
    ("timm:resnet18", ("timm", "resnet18")),
    ("timm:resnet50.a1_in1k", ("timm", "resnet50.a1_in1k")),
    ("mypkg.timm:make", None),
    ("timm.py:make", None),
    ("path/to/timm.py:make", None),
    ("resnet18", None),
    ("timmx:resnet18", None),
])
def test_hub_prefix_is_exact(spec: str, parsed: tuple[str, str] | None) -> None:
    assert hub_spec(spec) == parsed


def test_timm_name_calls_create_model_without_pretrained_weights(timm_calls: list) -> None:
    model = load_model("timm:resnet18", num_classes=7)
    assert timm_calls == [("resnet18", {"pretrained": False, "num_classes": 7})]
    assert not model.training and model(torch.zeros(2, 3, 2, 2)).shape == (2, 7)


def test_timm_without_num_classes_passes_none(timm_calls: list) -> None:
    load_model("timm:resnet50.a1_in1k")
    assert timm_calls == [("resnet50.a1_in1k", {"pretrained": False})]


def test_timm_model_takes_a_local_state_dict(timm_calls: list, tmp_path: Path) -> None:
    torch.manual_seed(1)
    other = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    torch.save(other.state_dict(), tmp_path / "w.pt")
    model = load_model("timm:resnet18", weights=tmp_path / "w.pt", num_classes=4)
    assert torch.equal(model[1].weight, other[1].weight)


def test_unknown_timm_name_suggests_close_matches(timm_calls: list) -> None:
    with pytest.raises(SpecError, match=r"^'resnet15' is not a timm model \(spec 'timm:resnet15'\); did you "
                                        r"mean ") as info:
        load_model("timm:resnet15")
    assert set(str(info.value).split("did you mean ")[1].rstrip("?").split(", ")) == {"resnet18", "resnet50"}
    assert timm_calls == []


def test_missing_timm_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm raises ImportError
    with pytest.raises(SpecError, match=r"model spec 'timm:resnet18' needs timm, which is not installed .*"
                                        r"pip install timm$") as info:
        load_model("timm:resnet18")
    assert "\n" not in str(info.value)


def test_a_users_own_module_named_timm_is_still_a_factory(tmp_path: Path) -> None:
    (tmp_path / "timm.py").write_text("from torch import nn\ndef make():\n    return nn.Linear(3, 2)\n")
    model = load_model(f"{tmp_path / 'timm.py'}:make")
    assert isinstance(model, nn.Linear) and model.out_features == 2


def test_real_timm_tiny_model(tmp_path: Path) -> None:
    pytest.importorskip("timm")
    torch.manual_seed(0)
    model = load_model("timm:resnet10t", num_classes=3)
    assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 3)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    torch.manual_seed(1)
    again = load_model("timm:resnet10t", weights=tmp_path / "w.pt", num_classes=3)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
