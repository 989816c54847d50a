"""Hub model specs (``timm:NAME``, ``hf:FAMILY``): built through the hub's own builder with random weights, read before
``module:factory``, and refused in one line when the package is missing or the name is not the hub's."""

from __future__ import annotations

import sys
from collections import OrderedDict
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from minreal.app.callables import SpecError
from minreal.app.hub import HF_FAMILIES, HFEncoder, hf_config, hub_spec
from minreal.app.models import forward_parameters, load_model


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


def _installed(monkeypatch: pytest.MonkeyPatch, name: str, fake: Any) -> list[tuple[str, dict[str, Any]]]:
    """The calls list of a fake package ``fake(calls)`` put in ``sys.modules`` as ``name`` for one test."""
    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setitem(sys.modules, name, fake(calls))
    return calls


@pytest.fixture
def timm_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    return _installed(monkeypatch, "timm", _fake_timm)


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


# ------------------------------------------------------------------------------------------- hf: (Hugging Face)
class _FakeOutput(OrderedDict):
    """What a ``ModelOutput`` is to the wrapper: an ordered mapping of fields, some of them None."""


class _FakeEncoder(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed, self.pool = nn.Embedding(50, width), nn.Linear(width, width)
        self.seen: dict[str, Any] = {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                return_dict: bool = False) -> _FakeOutput:
        self.seen = {"attention_mask": attention_mask, "return_dict": return_dict}
        h = self.embed(input_ids)
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        return _FakeOutput(last_hidden_state=h, pooler_output=self.pool(h[:, 0]), past_key_values=None)


class _FakeSeq2Seq(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.encoder, self.decoder = _FakeEncoder(width), nn.Linear(width, width)

    def get_encoder(self) -> nn.Module:
        return self.encoder


def _fake_transformers(calls: list[tuple[str, dict[str, Any]]]) -> ModuleType:
    """A stand-in for transformers: ``AutoConfig.for_model`` records its calls, ``AutoModel.from_config`` builds a
    tiny encoder (or a model with ``get_encoder`` for whisper)."""
    transformers = ModuleType("transformers")

    def for_model(model_type: str, **kwargs: Any) -> SimpleNamespace:
        calls.append((model_type, kwargs))
        return SimpleNamespace(model_type=model_type, width=kwargs.get("d_model", 8), **kwargs)

    def from_config(config: SimpleNamespace) -> nn.Module:
        torch.manual_seed(0)
        return (_FakeSeq2Seq if config.model_type == "whisper" else _FakeEncoder)(config.width)

    transformers.AutoConfig = SimpleNamespace(for_model=for_model)  # type: ignore[attr-defined]
    transformers.AutoModel = SimpleNamespace(from_config=from_config)  # type: ignore[attr-defined]
    return transformers


@pytest.fixture
def hf_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    return _installed(monkeypatch, "transformers", _fake_transformers)


def test_hf_family_is_built_from_its_config_without_cache_and_with_eager_attention(hf_calls: list) -> None:
    model = load_model("hf:distilbert")
    assert hf_calls == [("distilbert", {})]
    assert forward_parameters(load_model("hf:vit")) == ["pixel_values"]
    assert isinstance(model, HFEncoder) and isinstance(model.model, _FakeEncoder) and not model.training
    assert hf_calls[1] == ("vit", {})
    assert hf_config("bert").use_cache is False and hf_config("bert")._attn_implementation == "eager"


def test_hf_wrapper_takes_plain_tensors_and_returns_the_outputs_tensors(hf_calls: list) -> None:
    model = load_model("hf:bert")
    ids = torch.tensor([[1, 2, 3], [4, 5, 0]])
    out = model(ids)
    assert type(out) is dict and list(out) == ["last_hidden_state", "pooler_output"]  # the None field dropped
    assert out["last_hidden_state"].shape == (2, 3, 8) and model.model.seen == {"attention_mask": None,
                                                                                 "return_dict": True}
    assert forward_parameters(model) == ["input_ids", "attention_mask"]  # an .npz keyed by these names reaches it
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    masked = model(ids, mask)
    assert torch.equal(masked["last_hidden_state"][1, 2], torch.zeros(8)) and model.model.seen["attention_mask"] is mask


def test_whisper_encoder_keeps_the_encoder_at_base_size(hf_calls: list) -> None:
    model = load_model("hf:whisper_encoder")
    (model_type, overrides), = hf_calls
    assert model_type == "whisper" and overrides["d_model"] == 512 and overrides["encoder_layers"] == 6
    # the whole model is built before the encoder is kept: every attention of it splits d_model into its heads
    assert overrides["d_model"] % overrides["encoder_attention_heads"] == 0
    assert overrides["d_model"] % overrides["decoder_attention_heads"] == 0
    assert forward_parameters(model) == ["input_features"] and isinstance(model.model, _FakeEncoder)
    assert not any(name.startswith("decoder") for name in model.state_dict())


def test_hf_outputs_name_the_onnx_outputs(hf_calls: list, tmp_path: Path) -> None:
    from minreal.export.onnx_export import to_onnx

    result = to_onnx(load_model("hf:roberta"), torch.tensor([[1, 2, 3, 4]]), tmp_path / "r.onnx")
    assert result.output_names == ["last_hidden_state", "pooler_output"]


def test_hf_model_takes_a_local_state_dict(hf_calls: list, tmp_path: Path) -> None:
    torch.manual_seed(3)
    state = {k: torch.randn_like(v) for k, v in load_model("hf:gpt2").state_dict().items()}
    torch.save(state, tmp_path / "w.pt")
    model = load_model("hf:gpt2", weights=tmp_path / "w.pt")
    assert torch.equal(model.model.embed.weight, state["model.embed.weight"])
    bare = {k.removeprefix("model."): v + 1 for k, v in state.items()}  # the Hugging Face model's own state dict
    torch.save(bare, tmp_path / "bare.pt")
    model = load_model("hf:gpt2", weights=tmp_path / "bare.pt")
    assert torch.equal(model.model.embed.weight, bare["embed.weight"])
    torch.save({**bare, "extra": torch.zeros(1)}, tmp_path / "extra.pt")
    with pytest.raises(SpecError, match=r"unexpected key 'model\.extra'"):
        load_model("hf:gpt2", weights=tmp_path / "extra.pt")


@pytest.mark.parametrize("spec, kwargs, pattern", [
    ("hf:bret", {}, r"^'bret' is not a Hugging Face family minreal builds \(spec 'hf:bret'\); did you mean bert\?"),
    ("hf:llama", {}, r"give one of bert, distilbert, roberta, gpt2, vit, whisper_encoder .*path/to/hf\.py:factory"),
    ("hf:bert", {"num_classes": 3}, r"^hf:bert is the bare model without a classification head; drop num_classes"),
    ("hf:", {}, r"^model spec 'hf:' names no model"),
])
def test_bad_hf_specs(hf_calls: list, spec: str, kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern):
        load_model(spec, **kwargs)
    assert hf_calls == []


def test_missing_transformers_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(SpecError, match=r"model spec 'hf:vit' needs transformers, which is not installed .*"
                                        r"pip install 'minreal\[hf\]'$"):
        load_model("hf:vit")


@pytest.mark.slow
def test_real_transformers_distilbert_exports_with_named_outputs(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from minreal.export.onnx_export import to_onnx

    torch.manual_seed(0)
    model = load_model("hf:distilbert")
    ids = torch.randint(0, model.model.config.vocab_size, (2, 12))
    result = to_onnx(model, ids, tmp_path / "d.onnx")
    assert result.output_names == ["last_hidden_state"]
    assert model(ids)["last_hidden_state"].shape == (2, 12, 768)


@pytest.mark.slow  # six base-size models, about 600 M parameters in all
@pytest.mark.parametrize("family", list(HF_FAMILIES))
def test_every_hf_family_builds_with_the_real_transformers(family: str) -> None:
    """The stand-in above records the overrides; this builds each family with transformers itself where it is
    installed (hf:whisper_encoder once failed to build: its decoder kept whisper-tiny's 6 heads for d_model 512)."""
    pytest.importorskip("transformers")
    model = load_model(f"hf:{family}")
    config = hf_config(family)
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or config.d_model
    assert isinstance(model, HFEncoder) and width == {"distilbert": 768, "whisper_encoder": 512}.get(family, 768)
