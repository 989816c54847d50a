"""Models built by name from the model hubs users bring most, with random weights and nothing downloaded.

- ``timm:NAME`` — ``timm.create_model(NAME, pretrained=False, num_classes=...)``, any name of
  ``timm.list_models()`` (a pretrained tag such as ``resnet50.a1_in1k`` is accepted and only names the
  architecture here);
- ``hf:FAMILY`` — a Hugging Face family of :data:`HF_FAMILIES` (``bert``, ``distilbert``, ``roberta``, ``gpt2``,
  ``vit``, ``whisper_encoder``) at its base size, built by ``AutoModel.from_config`` from the family's config
  (``AutoConfig.for_model``, nothing downloaded; Whisper: its encoder only), wrapped (:class:`HFEncoder`) so that
  ``forward`` takes plain tensors and returns a dict of named tensors (the ``ModelOutput``'s fields, which name
  the ONNX outputs).

A hub spec is recognised by its prefix alone (:func:`hub_spec`): ``timm:`` and ``hf:`` are never read as
``module:factory``. A user's own module of either name is reached as a file (``path/to/hf.py:make``) or through its
package (``mypkg.hf:make``). Weights come, as for a torchvision name, from a local state dict (``--weights``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn

from minreal.app.callables import SpecError, _cause

__all__ = ["HF_FAMILIES", "HUB_BUILDERS", "HFAudioEncoder", "HFEncoder", "HFFamily", "HFImageEncoder",
           "HFTextEncoder", "build_hub", "hf_config", "hub_spec"]


def _import_hub(package: str, spec: str, install: str) -> ModuleType:
    """The hub's package, or a one-line :class:`SpecError` naming the install command."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise SpecError(f"model spec {spec!r} needs {package}, which is not installed ({_cause(exc)}); "
                        f"{install}") from exc


def build_timm(name: str, num_classes: int | None) -> nn.Module:
    """``timm.create_model(name, pretrained=False[, num_classes=...])``: a timm architecture, random weights.

    Raises
    ------
    SpecError
        timm is not installed, ``name`` is not one of ``timm.list_models()`` (close matches named), or the
        builder fails.
    """
    spec = f"timm:{name}"
    timm = _import_hub("timm", spec, "pip install timm")
    names = timm.list_models()
    if name.split(".", 1)[0] not in names:
        close = difflib.get_close_matches(name.lower(), names, n=5)
        hint = f"did you mean {', '.join(close)}?" if close else "see timm.list_models()"
        raise SpecError(f"{name!r} is not a timm model (spec {spec!r}); {hint}")
    kwargs = {} if num_classes is None else {"num_classes": num_classes}
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except Exception as exc:
        raise SpecError(f"building timm model {name!r} failed ({_cause(exc)}); check num_classes") from exc


class HFEncoder(nn.Module):
    """A Hugging Face model called with plain tensors whose ``forward`` returns the ``ModelOutput``'s tensor fields
    as a plain dict (``last_hidden_state``, ``pooler_output``, ...), whose keys name the ONNX graph's outputs. The
    subclasses name ``forward``'s parameters as the model does, so that named inputs (an ``.npz`` keyed
    ``input_ids`` and ``attention_mask``) reach it. Its state dict is the model's under ``model.``; the model's own
    (``AutoModel``'s ``state_dict()``, keys without ``model.``) loads too."""

    input_name = ""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._register_load_state_dict_pre_hook(_bare_keys_under_model)

    def _outputs(self, **inputs: torch.Tensor | None) -> dict[str, torch.Tensor]:
        out = self.model(**{k: v for k, v in inputs.items() if v is not None}, return_dict=True)
        # a torch.fx trace (width methods) sees Proxies where the tensors will be: they are kept too
        return {k: v for k, v in out.items() if isinstance(v, (torch.Tensor, torch.fx.Proxy))}


def _bare_keys_under_model(state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    """A load-state-dict pre-hook of :class:`HFEncoder`: when no key is under ``model.``, every key is moved there
    (the wrapped model's own state dict)."""
    inner = f"{prefix}model."
    if any(k.startswith(inner) for k in state_dict):
        return
    for key in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)


class HFTextEncoder(HFEncoder):
    """Token ids ``(batch, seq)`` and an optional attention mask of the same shape."""

    input_name = "input_ids"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return self._outputs(input_ids=input_ids, attention_mask=attention_mask)


class HFImageEncoder(HFEncoder):
    """Images ``(batch, 3, H, W)``."""

    input_name = "pixel_values"

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        return self._outputs(pixel_values=pixel_values)


class HFAudioEncoder(HFEncoder):
    """Log-mel features ``(batch, mel bins, frames)``."""

    input_name = "input_features"

    def forward(self, input_features: torch.Tensor) -> dict[str, torch.Tensor]:
        return self._outputs(input_features=input_features)


@dataclass(frozen=True)
class HFFamily:
    """A Hugging Face family as ``hf:`` builds it: its config's ``model_type``, the wrapper that names its input
    (:class:`HFTextEncoder`, :class:`HFImageEncoder` or :class:`HFAudioEncoder`), config values that set its base
    size where the default config is another, and whether only the encoder is kept."""

    model_type: str
    wrapper: type[HFEncoder]
    overrides: Mapping[str, Any] = field(default_factory=dict)
    encoder_only: bool = False


HF_FAMILIES: dict[str, HFFamily] = {
    "bert": HFFamily("bert", HFTextEncoder),
    "distilbert": HFFamily("distilbert", HFTextEncoder),
    "roberta": HFFamily("roberta", HFTextEncoder),
    "gpt2": HFFamily("gpt2", HFTextEncoder),
    "vit": HFFamily("vit", HFImageEncoder),
    # the default WhisperConfig is whisper-tiny's (d_model 384, 4 layers, 6 heads); these are whisper-base's sizes,
    # the decoder's too: AutoModel builds the whole model before the encoder is kept, and a decoder left at 6 heads
    # cannot split d_model 512
    "whisper_encoder": HFFamily("whisper", HFAudioEncoder, {
        "d_model": 512, "encoder_layers": 6, "encoder_attention_heads": 8, "encoder_ffn_dim": 2048,
        "decoder_layers": 6, "decoder_attention_heads": 8, "decoder_ffn_dim": 2048}, encoder_only=True),
}
"""``hf:FAMILY`` → how it is built: base sizes, random weights, eager attention, no cache."""


def _hf_family(family: str) -> HFFamily:
    if family not in HF_FAMILIES:
        close = difflib.get_close_matches(family.lower(), list(HF_FAMILIES), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"give one of {', '.join(HF_FAMILIES)}"
        raise SpecError(f"{family!r} is not a Hugging Face family minreal builds (spec 'hf:{family}'); {hint} "
                        "(a module of your own named hf: give path/to/hf.py:factory)")
    return HF_FAMILIES[family]


def hf_config(family: str) -> Any:
    """The config ``hf:FAMILY`` builds from: ``AutoConfig.for_model`` at the family's base size, eager attention,
    no key/value cache.

    Raises
    ------
    SpecError
        ``family`` is not one of :data:`HF_FAMILIES` (close matches named) or transformers is not installed.
    """
    how = _hf_family(family)
    transformers = _import_hub("transformers", f"hf:{family}", "pip install 'minreal[hf]'")
    config = transformers.AutoConfig.for_model(how.model_type, **dict(how.overrides))
    config.use_cache = False
    config._attn_implementation = "eager"  # plain matmul and softmax: the graph every exporter and method reads
    return config


def build_hf(family: str, num_classes: int | None) -> nn.Module:
    """``hf:FAMILY``: the family's model from its config (:func:`hf_config`), random weights, in an
    :class:`HFEncoder`.

    Raises
    ------
    SpecError
        an unknown family, transformers missing, ``num_classes`` given (the model has no classification head), or
        the build fails.
    """
    how = _hf_family(family)
    if num_classes is not None:
        raise SpecError(f"hf:{family} is the bare model without a classification head; drop num_classes, or give "
                        "your own model as path/to/file.py:factory")
    config = hf_config(family)
    transformers = importlib.import_module("transformers")
    try:
        model = transformers.AutoModel.from_config(config)
    except Exception as exc:
        raise SpecError(f"building Hugging Face model hf:{family} failed ({_cause(exc)})") from exc
    return how.wrapper(model.get_encoder() if how.encoder_only else model)


HUB_BUILDERS: dict[str, Callable[[str, int | None], nn.Module]] = {
    "timm": build_timm,
    "hf": build_hf,
}
"""Hub prefix → ``builder(name, num_classes)`` returning the model with random weights."""


def hub_spec(spec: str) -> tuple[str, str] | None:
    """``("timm", "resnet18")`` for ``"timm:resnet18"``: a registered hub prefix, a colon and a name; anything else
    (``mypkg.timm:make``, ``timm.py:make``, paths, plain names) → None."""
    prefix, sep, name = spec.partition(":")
    if not sep or prefix not in HUB_BUILDERS:
        return None
    return prefix, name


def build_hub(spec: str, num_classes: int | None) -> nn.Module:
    """The model a hub spec (:func:`hub_spec`) names, with random weights.

    Raises
    ------
    SpecError
        ``spec`` is not a hub spec or names no model, the hub's package is missing, or the build fails.
    """
    parsed = hub_spec(spec)
    if parsed is None or not parsed[1]:
        raise SpecError(f"model spec {spec!r} names no model; give {', '.join(f'{p}:NAME' for p in HUB_BUILDERS)}")
    prefix, name = parsed
    return HUB_BUILDERS[prefix](name, num_classes)
