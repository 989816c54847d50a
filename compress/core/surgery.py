"""Module surgery: find and replace submodules by qualified name, on a copy unless asked otherwise."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

from torch import nn

__all__ = ["get_module", "replace_modules", "parent_weight_readers"]


def get_module(model: nn.Module, name: str) -> nn.Module:
    """The submodule at qualified ``name`` (``""`` is the model itself)."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"model has no submodule named {name!r}") from None


def replace_modules(model: nn.Module, replacements: Mapping[str, nn.Module], inplace: bool = False) -> nn.Module:
    """Return ``model`` (a deep copy unless ``inplace``) with each named submodule replaced.

    The copy never copies a module it replaces: the deep copy's memo maps each replaced module to its
    replacement, so the replaced weights (most of a factorised model's) are not duplicated on the way; in the copy
    a module that is reached twice (shared) is replaced at each place (``inplace`` replaces it at the named place
    only). The name ``""`` (a model that is one layer) replaces the model itself: the result is that
    replacement.

    Raises
    ------
    ValueError
        a name is not a submodule of ``model``, or one name lies inside another (``a`` and ``a.b``): the
        replacement of ``a`` would be changed in place, or ``a.b``'s would be lost.
    """
    _check_disjoint(replacements)
    if "" in replacements:
        return replacements[""]
    if inplace:
        target = model
    else:
        memo: dict[int, object] = {id(get_module(model, name)): new for name, new in replacements.items()}
        target = copy.deepcopy(model, memo)
    for name, new in replacements.items():
        get_module(target, name)  # validates the name
        parent_name, _, child = name.rpartition(".")
        parent = get_module(target, parent_name)
        setattr(parent, child, new)
    return target


def _check_disjoint(names: Iterable[str]) -> None:
    """ValueError naming two replacement names of which one lies inside the other (``""`` holds every name)."""
    given = set(names)
    for name in given:
        parent = name
        while parent:
            parent = parent.rpartition(".")[0]
            if parent in given:
                raise ValueError(f"replacement names {parent!r} and {name!r} nest: the second lies inside the "
                                 "first; replace one of the two modules, not both")


def parent_weight_readers(model: nn.Module) -> dict[str, str]:
    """Layers whose weights a parent reads directly (not through ``forward``), mapped to the reason.

    ``nn.MultiheadAttention`` reads ``out_proj.weight`` itself, so replacing ``out_proj`` would break it;
    :func:`minreal.compress.core.attention.unfuse_attention` rewrites it into plain projections first where it can.
    """
    found: dict[str, str] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.MultiheadAttention):
            prefix = f"{name}." if name else ""
            found[f"{prefix}out_proj"] = f"weight read directly by parent {type(mod).__name__} {name!r}"
    return found
