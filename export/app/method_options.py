"""Method options for the CLI, derived from the registered config dataclasses (no per-method code).

Every config field ``foo_bar`` becomes ``--foo-bar``; a field that several methods share must have one
type. Each field documents itself in its metadata: ``field(default=..., metadata={"help": "...", "choices": (...)})``
-- the help text is required (a field without one is a build-time error), the choices are optional (the fixed set of
strings the field accepts). Only options the user gave are passed on, and an option the chosen method does not have
is an error.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from compress import get_method, method_names
from runtime_bench.facts import PROVIDERS

__all__ = ["OptionSpec", "method_option_specs", "config_option_specs", "field_docs", "build_config",
           "MethodOptionError", "provider_defaults", "RANK_MULTIPLE_BY_PROVIDER"]

#: Rank granularity that keeps factorised layers on the provider's fast paths: measured on resnet18 with the
#: CPU provider, multiples of 16 turned a 1.31x latency/MAC gap into 1.03x (benchmarks/factorize_latency.json);
#: GPU tensor cores want multiples of 8.
RANK_MULTIPLE_BY_PROVIDER: dict[str, int] = {short: 16 if short == "cpu" else 8 for short in PROVIDERS}


class MethodOptionError(ValueError):
    """An option that does not apply to the chosen method, or a value of the wrong kind."""


@dataclass(frozen=True)
class OptionSpec:
    """One CLI option: field name, Python scalar type, whether it repeats, which methods have it, its help text
    and (for a field that takes one of a fixed set of strings) its choices."""

    field: str
    kind: type
    multiple: bool
    methods: tuple[str, ...]
    help: str = ""
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")


def _scalar(tp: Any) -> tuple[type, bool]:
    """(scalar type, repeats) of an annotation such as ``float | None`` or ``tuple[str, ...]``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _scalar(args[0])
    if origin in (tuple, list):
        return _scalar(typing.get_args(tp)[0])[0], True
    if typing.get_origin(tp) is typing.Literal:
        return type(typing.get_args(tp)[0]), False
    return (tp if isinstance(tp, type) else str), False


def field_docs(cls: type) -> dict[str, tuple[str, tuple[str, ...] | None]]:
    """``{field: (help, choices)}`` of a config dataclass, from each field's metadata.

    Raises ValueError naming the class and field when a field has no help text, or choices that are not a
    non-empty collection of strings.
    """
    out = {}
    for f in dataclasses.fields(cls):
        help_ = f.metadata.get("help")
        if not isinstance(help_, str) or not help_.strip():
            raise ValueError(f"config field {cls.__qualname__}.{f.name} has no help text: declare it as "
                             f"field(default=..., metadata={{'help': '...'}})")
        choices = f.metadata.get("choices")
        if choices is not None:
            choices = tuple(choices)
            if not choices or not all(isinstance(c, str) for c in choices):
                raise ValueError(f"config field {cls.__qualname__}.{f.name}: choices must be a non-empty "
                                 f"collection of strings, got {choices!r}")
        out[f.name] = (help_.strip(), choices)
    return out


def _merged_help(helps: dict[str, list[str]]) -> str:
    """One help text: the common text, or each distinct text prefixed with the methods that use it."""
    if len(helps) == 1:
        return next(iter(helps))
    return " | ".join(f"{', '.join(methods)}: {text}" for text, methods in helps.items())


def _merged_choices(choices: list[tuple[str, ...] | None]) -> tuple[str, ...] | None:
    """The union of the sharers' choices (first-seen order); free text when any sharer takes free text."""
    if any(c is None for c in choices):
        return None
    return tuple(dict.fromkeys(c for cs in choices for c in cs))


def config_option_specs(configs: dict[str, type]) -> list[OptionSpec]:
    """Options of the given ``{method: config dataclass}``, merged by field name (see :func:`method_option_specs`)."""
    merged: dict[str, tuple[type, bool, list[str]]] = {}
    helps: dict[str, dict[str, list[str]]] = {}
    choices: dict[str, list[tuple[str, ...] | None]] = {}
    for name, cls in configs.items():
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            kind, multiple = _scalar(hints[f.name])
            if kind not in (int, float, bool, str):
                continue
            prev = merged.setdefault(f.name, (kind, multiple, []))
            if (prev[0], prev[1]) != (kind, multiple):
                kind = float if {prev[0], kind} == {int, float} else str
                merged[f.name] = (kind, multiple, prev[2])
            merged[f.name][2].append(name)
            helps.setdefault(f.name, {}).setdefault(docs[f.name][0], []).append(name)
            choices.setdefault(f.name, []).append(docs[f.name][1])
    return [OptionSpec(k, v[0], v[1], tuple(v[2]), _merged_help(helps[k]), _merged_choices(choices[k]))
            for k, v in sorted(merged.items())]


def method_option_specs() -> list[OptionSpec]:
    """All options of all registered methods, merged by field name.

    A field shared by several methods gets their common help text, or each distinct text with its methods;
    its choices are the union of theirs. Raises ValueError when a config field has no help text.
    """
    return config_option_specs({name: get_method(name).config_cls for name in method_names()})


def provider_defaults(providers: tuple[str, ...]) -> dict[str, Any]:
    """Option defaults that depend on the target providers (the coarsest rank multiple they ask for)."""
    multiples = [RANK_MULTIPLE_BY_PROVIDER[p] for p in providers if p in RANK_MULTIPLE_BY_PROVIDER]
    return {"rank_multiple": max(multiples)} if multiples else {}


def build_config(method: str, given: dict[str, Any], defaults: dict[str, Any] | None = None) -> Any:
    """The method's config from the options the user gave (None / empty = not given).

    ``defaults`` fill fields the user did not give, where the method has such a field.
    """
    cls = get_method(method).config_cls
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {k: v for k, v in (defaults or {}).items() if k in fields and given.get(k) in (None, ())}
    for key, value in given.items():
        if value is None or value == ():
            continue
        if key not in fields:
            flag = "--" + key.replace("_", "-")
            own = ", ".join("--" + f.replace("_", "-") for f in fields) or "none"
            raise MethodOptionError(f"option {flag} does not apply to method {method!r} (its options: {own})")
        kind, multiple = _scalar(hints[key])
        kwargs[key] = tuple(kind(v) for v in value) if multiple else kind(value)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise MethodOptionError(f"invalid options for method {method!r}: {exc}") from None
