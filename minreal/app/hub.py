"""Models built by name from the model hubs users bring most, with random weights and nothing downloaded.

- ``timm:NAME`` — ``timm.create_model(NAME, pretrained=False, num_classes=...)``, any name of
  ``timm.list_models()`` (a pretrained tag such as ``resnet50.a1_in1k`` is accepted and only names the
  architecture here).

A hub spec is recognised by its prefix alone (:func:`hub_spec`): ``timm:`` is never read as ``module:factory``. A
user's own module of that name is reached as a file (``path/to/timm.py:make``) or through its package
(``mypkg.timm:make``). Weights come, as for a torchvision name, from a local state dict (``--weights``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from types import ModuleType

from torch import nn

from minreal.app.callables import SpecError, _cause

__all__ = ["HUB_BUILDERS", "build_hub", "hub_spec"]


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


HUB_BUILDERS: dict[str, Callable[[str, int | None], nn.Module]] = {
    "timm": build_timm,
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
