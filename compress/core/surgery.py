"""Module surgery: find and replace submodules by qualified name, on a copy unless asked otherwise."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

from torch import nn

__all__ = ["get_module", "replace_modules", "parent_weight_readers", "shared_parameters", "tied_weights",
           "untied_note"]


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


def shared_parameters(model: nn.Module) -> list[list[str]]:
    """The names of each parameter ``model`` holds under more than one name (tied weights, or one module registered
    at two places), one list per parameter, in registration order."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def tied_weights(model: nn.Module) -> dict[str, str]:
    """Modules holding a parameter that another module holds too (tied weights: a language model's ``lm_head`` and
    its token embedding), mapped to the reason, which names the other holder and the way out.

    Replacing such a module (a factorised pair, a narrower layer) would untie the weight: the other holder keeps
    the full parameter, so the model gains the replacement's parameters instead of losing the original's. One
    module reached at two places (a shared block) is not tied to itself: :func:`replace_modules` puts the one
    replacement at each place, which stays shared.
    """
    holders: dict[int, list[tuple[int, str]]] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod.named_parameters(recurse=False):
            holders.setdefault(id(p), []).append((id(mod), f"{name}.{pname}" if name else pname))
    found: dict[str, str] = {}
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            others = [full for owner, full in holders[id(p)] if owner != id(mod)]
            if others:
                found[name] = (f"its {pname} is tied to {others[0]} (one parameter held by two modules): replacing "
                               "it would untie them and add parameters; to compress it anyway, give it its own copy "
                               f"first (module.{pname} = nn.Parameter(module.{pname}.detach().clone()); a Hugging "
                               "Face model: tie_word_embeddings=False in its config)")
                break
    return found


def untied_note(original: nn.Module, new: nn.Module) -> str:
    """A report note naming the weights one parameter held at several places in ``original`` that ``new`` holds as
    separate parameters under the same names, with their shapes; empty when every tie is kept. A name ``new`` no
    longer has says nothing either way (torch.fx keeps one name for a module registered under two; a replaced module
    has other names), so only the names it still has are compared."""
    broken = []
    for names in shared_parameters(original):
        kept = {name: p for name in names if (p := _parameter(new, name)) is not None}
        if len({id(p) for p in kept.values()}) > 1:
            broken.append(" and ".join(f"{name} ({'x'.join(map(str, p.shape))})" for name, p in kept.items()))
    if not broken:
        return ""
    return ("tied weights untied: " + "; ".join(broken) + " were one parameter in the original and are separate "
            "parameters in the compressed model, each counted in its size")


def _parameter(model: nn.Module, name: str) -> nn.Parameter | None:
    try:
        return model.get_parameter(name)
    except AttributeError:
        return None
