"""Method options for the CLI, derived from the registered config dataclasses (no per-method code).

Every config field ``foo_bar`` becomes ``--foo-bar``; a field that several methods share must be declared once, in a
shared base dataclass (``minreal.compress.core.options``), so that one flag has one type and one meaning -- two methods
declaring the same name apart cannot register (``minreal.compress.registry``). Each field documents itself in its
metadata: ``field(default=..., metadata={"help": "...", "choices": (...)})``
-- the help text is required (a field without one is a build-time error), the choices are optional (the fixed set of
strings the field accepts). Only options the user gave are passed on: to one method, an option it does not have is
an error (:func:`build_config`); to several, each option reaches the methods that declare it, and is an error only
when none of them does (:func:`build_configs`). The library's errors name config fields;
:func:`minreal.app.field_flags.flag_spelled` gives their flags back.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from minreal.app.field_flags import flag_spelled
from minreal.compress import get_method, method_names
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.options import BUDGET_FIELDS, BUDGET_HELPERS, field_clash
from minreal.compress.registry import require_budget

__all__ = ["OptionSpec", "method_option_specs", "config_option_specs", "field_docs", "build_config", "build_configs",
           "MethodOptionError", "provider_defaults", "option_group"]


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

    @property
    def group(self) -> str:
        """The ``--help`` section of this option (see :func:`option_group`)."""
        return option_group(self.methods)


def option_group(methods: tuple[str, ...]) -> str:
    """``--help`` section title of an option the given methods have: every method's, or "Options for ..."."""
    if set(methods) >= set(method_names()):
        return "Budget and options of every method"
    return f"Options for {', '.join(methods)}"


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


def _hidden_fields(budgets: tuple[str, ...] | None) -> set[str]:
    """Budget fields (and their helpers, e.g. ``latency_table``) a method whose ``SPEC.budgets`` is ``budgets``
    cannot meet, so does not offer; None offers every field."""
    if budgets is None:
        return set()
    hidden = set(BUDGET_FIELDS) - set(budgets)
    return hidden | {h for b in hidden for h in BUDGET_HELPERS.get(b, ())}


def config_option_specs(configs: dict[str, type], budgets: dict[str, tuple[str, ...]] | None = None
                        ) -> list[OptionSpec]:
    """Options of the given ``{method: config dataclass}``, merged by field name (see :func:`method_option_specs`);
    ``budgets`` (``{method: SPEC.budgets}``) leaves out the budget options a method cannot meet."""
    merged: dict[str, tuple[type, bool, list[str]]] = {}
    helps: dict[str, dict[str, list[str]]] = {}
    choices: dict[str, list[tuple[str, ...] | None]] = {}
    for i, (name, cls) in enumerate(configs.items()):
        clash = field_clash(dict(list(configs.items())[:i]), name, cls)
        if clash is not None:
            raise ValueError(clash)
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        hidden = _hidden_fields(None if budgets is None else budgets.get(name))
        for f in dataclasses.fields(cls):
            kind, multiple = _scalar(hints[f.name])
            if kind not in (int, float, bool, str) or f.name in hidden:
                continue
            merged.setdefault(f.name, (kind, multiple, []))[2].append(name)
            helps.setdefault(f.name, {}).setdefault(docs[f.name][0], []).append(name)
            choices.setdefault(f.name, []).append(docs[f.name][1])
    return [OptionSpec(k, v[0], v[1], tuple(v[2]), _merged_help(helps[k]), _merged_choices(choices[k]))
            for k, v in sorted(merged.items())]


def method_option_specs() -> list[OptionSpec]:
    """All options of all registered methods, merged by field name; a budget option is listed only for the methods
    whose ``SPEC.budgets`` include it.

    A field shared by several methods gets their common help text, or each distinct text with its methods;
    its choices are the union of theirs. Raises ValueError when a config field has no help text.
    """
    specs = {name: get_method(name) for name in method_names()}
    return config_option_specs({n: s.config_cls for n, s in specs.items()}, {n: s.budgets for n, s in specs.items()})


def provider_defaults(providers: tuple[str, ...]) -> dict[str, Any]:
    """Option defaults that depend on the target providers: each method spec's ``provider_defaults``, merged
    (:func:`build_config` applies only the fields a method has)."""
    out: dict[str, Any] = {}
    for name in method_names():
        out.update(get_method(name).provider_defaults(tuple(providers)))
    return out


def build_configs(methods: typing.Sequence[str], given: dict[str, Any],
                  defaults: dict[str, Any] | None = None) -> list[Any]:
    """One config per entry of ``methods`` from options given once for all of them (``run -m svd -m fde``).

    Each option reaches the methods whose config declares it, so ``--merge-eps 0.1`` sets fde's tolerance and
    leaves svd's config alone. An option that none of ``methods`` declares is a :class:`MethodOptionError` naming
    the methods that do have it. Per-variant values (two fde variants with different ε) go in a plan file.
    """
    declared = {m: {f.name for f in dataclasses.fields(get_method(m).config_cls)} for m in dict.fromkeys(methods)}
    set_ = {k: v for k, v in given.items() if v is not None and v != ()}
    for key in set_:
        if not any(key in own for own in declared.values()):
            owners = [m for m in method_names()
                      if key in {f.name for f in dataclasses.fields(get_method(m).config_cls)}]
            flag = "--" + key.replace("_", "-")
            raise MethodOptionError(f"option {flag} applies to none of the chosen methods ({', '.join(declared)}); "
                                    f"it is an option of {', '.join(owners) or 'no registered method'}")
    return [build_config(m, {k: v for k, v in set_.items() if k in declared[m]}, defaults) for m in methods]


_KIND_WORDS = MappingProxyType({int: ("a whole number", "whole numbers"), float: ("a number", "numbers"),
                                bool: ("true or false", "true/false values"), str: ("a string", "strings")})


def _is_kind(value: Any, kind: type) -> bool:
    """Whether ``value`` (from the command line or a TOML plan file) is of the field's scalar kind, exactly:
    no bool for a number, no number for a bool, no float cut to an int."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _convert(key: str, value: Any, kind: type, multiple: bool) -> Any:
    """``value`` as the field's type, or MethodOptionError naming the key: a repeated field takes a list of its
    kind (or one string, for a field of strings), a scalar field one value of its kind."""
    what = f"{key} (--{key.replace('_', '-')})"
    if multiple:
        if isinstance(value, str) and kind is str:
            return (value,)
        if not isinstance(value, (list, tuple)) or not all(_is_kind(v, kind) for v in value):
            raise MethodOptionError(f"{what} takes a list of {_KIND_WORDS[kind][1]}, got {value!r}")
        return tuple(kind(v) for v in value)
    if not _is_kind(value, kind):
        raise MethodOptionError(f"{what} takes {_KIND_WORDS[kind][0]}, got {value!r}")
    return kind(value)


def build_config(method: str, given: dict[str, Any], defaults: dict[str, Any] | None = None) -> Any:
    """The method's config from the options the user gave (None / empty = not given).

    ``defaults`` fill fields the user did not give, where the method has such a field. Each value must be of its
    field's kind (see :func:`_convert`; a TOML plan file is not converted loosely).
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
        kwargs[key] = _convert(key, value, *_scalar(hints[key]))
    try:  # a budget the method cannot meet: before any loading or export, and before the config's own checks (a
        # --latency-ratio for a method without one is that, not a missing --latency-table)
        require_budget(method, types.SimpleNamespace(**kwargs))
    except CompressionError as exc:
        raise MethodOptionError(flag_spelled(exc)) from None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise MethodOptionError(f"invalid options for method {method!r}: {flag_spelled(exc)}") from None
