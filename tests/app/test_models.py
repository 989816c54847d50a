"""Model specs: every accepted kind loads, every bad input fails with the culprit named."""

from __future__ import annotations

import logging
import pathlib
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.app.callables import SpecError
from minreal.app.models import check_input_shape, load_model


def _tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))



def test_file_factory_loads_in_eval_mode(factory_file: Path) -> None:
    model = load_model(f"{factory_file}:make")
    assert isinstance(model, nn.Sequential) and not model.training
    assert model(torch.randn(2, 4)).shape == (2, 3)


def test_module_factory_gets_num_classes() -> None:
    model = load_model("minreal.compress.models:small_cnn", num_classes=7)
    assert model[-1].out_features == 7 and not model.training


def test_factory_with_state_dict(factory_file: Path, tmp_path: Path) -> None:
    source = _tiny()
    torch.save(source.state_dict(), tmp_path / "w.pt")
    model = load_model(f"{factory_file}:make", weights=tmp_path / "w.pt")
    x = torch.randn(5, 4)
    assert torch.equal(model(x), source(x))


def test_checkpoint_wrapper_and_dataparallel_prefix_are_unwrapped(factory_file: Path, tmp_path: Path) -> None:
    source = _tiny()
    state = {f"module.{k}": v for k, v in source.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "ckpt.pt")
    model = load_model(f"{factory_file}:make", weights=str(tmp_path / "ckpt.pt"))
    assert torch.equal(model[1].weight, source[1].weight)


def test_torchvision_name_with_local_weights(tmp_path: Path) -> None:
    source = load_model("squeezenet1_1", num_classes=3)
    torch.save(source.state_dict(), tmp_path / "sq.pth")
    model = load_model("squeezenet1_1", weights=tmp_path / "sq.pth", num_classes=3)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values()))
    assert not model.training


def test_torchvision_without_weights_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="minreal.app.models"):
        model = load_model("squeezenet1_1", num_classes=2)
    assert isinstance(model, nn.Module)
    assert "random weights" in caplog.text and "squeezenet1_1" in caplog.text


def test_torchvision_weights_with_wrong_classifier_names_key(tmp_path: Path) -> None:
    torch.save(load_model("squeezenet1_1", num_classes=3).state_dict(), tmp_path / "sq.pth")
    with pytest.raises(SpecError, match=r"sq\.pth.*shape mismatch at 'classifier\.1\.weight'.*num_classes"):
        load_model("squeezenet1_1", weights=tmp_path / "sq.pth", num_classes=5)


def test_unknown_torchvision_name_suggests_close_matches() -> None:
    with pytest.raises(SpecError, match=r"'resnet181'.*did you mean .*resnet18"):
        load_model("resnet181")


def test_exported_program_loads(tmp_path: Path) -> None:
    source = _tiny().eval()
    x = torch.randn(2, 4)
    torch.export.save(torch.export.export(source, (x,)), tmp_path / "m.pt2")
    model = load_model(str(tmp_path / "m.pt2"))
    model.eval()  # callers may switch the flag; the traced graph is unchanged
    assert torch.allclose(model(x), source(x))


def test_exported_program_refuses_weights(tmp_path: Path) -> None:
    (tmp_path / "m.pt2").write_bytes(b"whatever")
    with pytest.raises(SpecError, match=r"m\.pt2 already fixes"):
        load_model(str(tmp_path / "m.pt2"), weights=tmp_path / "w.pt")


def test_corrupt_exported_program(tmp_path: Path) -> None:
    (tmp_path / "bad.pt2").write_bytes(b"not a zip archive")
    with pytest.raises(SpecError, match=r"bad\.pt2 is not a complete \.pt2 archive"):
        load_model(str(tmp_path / "bad.pt2"))


class _TouchOnUnpickle:
    """Unpickling this creates ``target``: stands in for an ``os.system`` payload."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (pathlib.Path.touch, (self.target,))


def _crafted_pt2(tmp_path: Path) -> tuple[Path, Path, str]:
    """A legit .pt2 of a tiny MLP with its sample-inputs ``.pt`` member replaced by a malicious pickle."""
    good = tmp_path / "good.pt2"
    torch.export.save(torch.export.export(_tiny().eval(), (torch.randn(2, 4),)), good)
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(evil, "w") as dst:
        members = [info.filename for info in src.infolist()]
        target = next(name for name in members if name.endswith(".pt"))
        for info in src.infolist():
            data = pickle.dumps(_TouchOnUnpickle(marker)) if info.filename == target else src.read(info)
            dst.writestr(info, data)
    return evil, marker, target


def test_exported_program_with_pickle_member_is_refused(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    evil, marker, _ = _crafted_pt2(tmp_path)
    with pytest.raises(SpecError, match=r"evil\.pt2 holds objects that need full unpickling.*--trust-pickle"):
        load_model(str(evil))
    assert not marker.exists()
    assert "Logging error" not in capfd.readouterr().err


def test_exported_program_with_pickle_member_loads_when_trusted(tmp_path: Path,
                                                                 capfd: pytest.CaptureFixture) -> None:
    evil, _, _ = _crafted_pt2(tmp_path)
    try:
        load_model(str(evil), trust_pickle=True)  # the payload may run and break the program: that is allowed
    except SpecError as exc:
        assert "need unpickling" not in str(exc)
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err


def test_legit_exported_program_passes_the_pickle_check(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    source = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).eval()
    x = torch.randn(2, 4)
    torch.export.save(torch.export.export(source, (x,)), tmp_path / "mlp.pt2")
    model = load_model(str(tmp_path / "mlp.pt2"))  # trust_pickle defaults to False
    assert torch.allclose(model(x), source(x))
    assert capfd.readouterr().err == ""


def test_pickled_module_refused_unless_trusted(tmp_path: Path) -> None:
    source = _tiny()
    torch.save(source, tmp_path / "whole.pt")
    with pytest.raises(SpecError, match=r"whole\.pt holds pickled .*trust_pickle=True"):
        load_model(str(tmp_path / "whole.pt"))
    model = load_model(str(tmp_path / "whole.pt"), trust_pickle=True)
    x = torch.randn(3, 4)
    assert torch.equal(model(x), source(x)) and not model.training


def test_state_dict_alone_is_not_a_model(tmp_path: Path) -> None:
    torch.save(_tiny().state_dict(), tmp_path / "sd.pt")
    with pytest.raises(SpecError, match=r"sd\.pt holds a state dict.*factory.*weights"):
        load_model(str(tmp_path / "sd.pt"))


@pytest.mark.parametrize("spec, pattern", [
    ("{tmp}/missing.pt2", r"model file .*missing\.pt2 not found"),
    ("{tmp}/missing.py:make", r"model file .*missing\.py not found"),
    ("{tmp}/model.onnx", r"model\.onnx not found"),
    ("{tmp}/factory.py", r"factory\.py is a Python file; name the factory"),
    ("{tmp}/factory.py:mkae", r"'mkae' not found in .*factory\.py.*did you mean make"),
    ("{tmp}/factory.py:not_a_model", r"factory .*not_a_model returned a str, not a torch\.nn\.Module"),
    ("no_such_package_xyz.models:make", r"cannot import module 'no_such_package_xyz\.models'"),
])
def test_bad_model_specs_name_the_culprit(factory_file: Path, spec: str, pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern):
        load_model(spec.format(tmp=factory_file.parent))


def test_factory_file_that_fails_to_import(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def make(:\n")
    with pytest.raises(SpecError, match=r"importing .*broken\.py failed \(SyntaxError"):
        load_model(f"{tmp_path / 'broken.py'}:make")


def test_factory_that_rejects_num_classes(tmp_path: Path) -> None:
    (tmp_path / "fixed.py").write_text("from torch import nn\ndef make():\n    return nn.Linear(2, 2)\n")
    with pytest.raises(SpecError, match=r"fixed\.py:make raised TypeError.*num_classes=4"):
        load_model(f"{tmp_path / 'fixed.py'}:make", num_classes=4)


@pytest.mark.parametrize("edit, pattern", [
    (lambda sd: sd.pop("3.bias"), r"missing key '3\.bias'"),
    (lambda sd: sd.update(extra=torch.zeros(1)), r"unexpected key 'extra'"),
    (lambda sd: sd.update({"1.weight": torch.zeros(5, 4)}), r"shape mismatch at '1\.weight': file has \(5, 4\), "
                                                           r"model has \(6, 4\)"),
])
def test_weights_that_do_not_fit(factory_file: Path, tmp_path: Path, edit, pattern: str) -> None:
    state = _tiny().state_dict()
    edit(state)
    torch.save(state, tmp_path / "w.pt")
    with pytest.raises(SpecError, match=rf"weights .*w\.pt do not fit model .*factory\.py:make: {pattern}"):
        load_model(f"{factory_file}:make", weights=tmp_path / "w.pt")


@pytest.mark.parametrize("content, pattern", [
    ({"epoch": 3, "lr": 0.1}, r"holds a dict with keys 'epoch', 'lr', not a state dict"),
    ([torch.zeros(2)], r"holds a list, not a state dict"),
])
def test_weights_file_that_is_not_a_state_dict(factory_file: Path, tmp_path: Path, content, pattern: str) -> None:
    torch.save(content, tmp_path / "w.pt")
    with pytest.raises(SpecError, match=rf"weights file .*w\.pt {pattern}"):
        load_model(f"{factory_file}:make", weights=tmp_path / "w.pt")


def test_weights_file_with_pickled_module_is_refused(factory_file: Path, tmp_path: Path) -> None:
    torch.save(_tiny(), tmp_path / "whole.pt")
    with pytest.raises(SpecError, match=r"weights file .*whole\.pt holds pickled objects"):
        load_model(f"{factory_file}:make", weights=tmp_path / "whole.pt")


def test_missing_weights_file(factory_file: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"weights file .*nope\.pt not found"):
        load_model(f"{factory_file}:make", weights=tmp_path / "nope.pt")


def test_check_input_shape() -> None:
    model = _tiny().eval()
    assert check_input_shape(model, torch.randn(10, 4)).shape == (2, 3)
    with pytest.raises(SpecError, match=r"^tiny: model forward failed on input of shape \(2, 1, 8, 8\): RuntimeError"):
        check_input_shape(model, torch.randn(10, 1, 8, 8), model_spec="tiny")


class _Pair:
    """An output container registered with torch's pytree by its own code, as transformers registers ModelOutput."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.a, self.b = a, b


class _ReturnsPair(nn.Module):
    def forward(self, x: torch.Tensor) -> _Pair:
        return _Pair(x + 1, x * 2)


def test_a_program_returning_a_type_its_package_registers_is_refused_naming_the_type(tmp_path: Path) -> None:
    """Loading a program imports no code, so an output type registered on import (a Hugging Face ModelOutput) is
    unknown when minreal loads it: the refusal names the type and the way out, not torch's bare "check the
    warnings above" (which minreal keeps off the console)."""
    import torch.utils._pytree as pytree

    pytree.register_pytree_node(_Pair, lambda p: ([p.a, p.b], None), lambda v, _: _Pair(*v),
                                serialized_type_name="minreal_test.Pair")
    try:
        program = torch.export.export(_ReturnsPair(), (torch.randn(2, 3),))
        torch.export.save(program, tmp_path / "pair.pt2")
    finally:
        pytree._deregister_pytree_node(_Pair)
    with pytest.raises(SpecError, match=r"pair\.pt2: it returns minreal_test\.Pair, an output type that only its "
                                        r"own package knows how to rebuild .* wrap a Hugging Face model"):
        load_model(str(tmp_path / "pair.pt2"))
