"""Config fields that several methods share, each declared once (one name, one type, one meaning).

A method config inherits the bases whose fields it has; the CLI (``export.app.method_options``) refuses two
methods declaring the same field name apart. Every config inherits :class:`CostBudget`: budgets are always a
ratio of the **whole model's** cost after/before, and :attr:`compress.core.spec.MethodSpec.budgets` names the
kinds a method can meet (``compress()`` refuses the others, naming the flag).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from .errors import CompressionError

__all__ = ["CostBudget", "BUDGET_FIELDS", "SeedOption", "ExcludeOption", "StateBudgetOption", "WidthMultipleOption", "flag_of",
           "Alias", "aliases_of", "field_clash", "BUDGET_HELPERS"]

#: The whole-model budget fields of :class:`CostBudget`, in the order the CLI shows them.
BUDGET_FIELDS = ("mac_ratio", "param_ratio", "latency_ratio")
#: Fields of :class:`CostBudget` that serve one budget only (not offered for a method without that budget).
BUDGET_HELPERS = MappingProxyType({"latency_ratio": ("latency_table",)})


def flag_of(field_name: str) -> str:
    """The CLI flag of a config field (``mac_ratio`` -> ``--mac-ratio``)."""
    return "--" + field_name.replace("_", "-")


@dataclass(frozen=True)
class Alias:
    """A deprecated option name in a config's ``DEPRECATED_ALIASES`` (``{old name: Alias(field, note)}``): the field
    it now sets and what the one warning line says about the meaning (a plain field name means "same meaning")."""

    field: str
    note: str = "same meaning"


def aliases_of(cls: type) -> dict[str, Alias]:
    """``{old name: Alias}`` of a config class, plain field names normalised to :class:`Alias`."""
    declared = getattr(cls, "DEPRECATED_ALIASES", {})
    return {old: a if isinstance(a, Alias) else Alias(a) for old, a in declared.items()}


def field_clash(configs: Mapping[str, type], name: str, cls: type) -> str | None:
    """Why method ``name`` (config ``cls``) clashes with the methods in ``configs``, or None: a config field whose
    name another method declares apart (not inherited from the same base here) would give one flag two meanings."""
    if not dataclasses.is_dataclass(cls):
        return f"the config of method {name!r} ({cls!r}) is not a dataclass"
    own = {f.name: f for f in dataclasses.fields(cls)}
    for other, other_cls in configs.items():
        for f in dataclasses.fields(other_cls):
            if f.name in own and own[f.name] is not f:
                return (f"config field {f.name!r} ({flag_of(f.name)}) of method {name!r} is declared apart by method "
                        f"{other!r}: give the knob its own name, or inherit the shared field from a base in "
                        "compress.core.options")
    return None


@dataclass
class CostBudget:
    """Whole-model budget shared by every method: at most one of MACs, parameters or measured latency."""

    mac_ratio: float | None = field(
        default=None,
        metadata={"help": "Whole-model MAC budget: MACs after / before, in (0, 1]."})
    param_ratio: float | None = field(
        default=None,
        metadata={"help": "Whole-model parameter budget: parameters after / before, in (0, 1]."})
    latency_ratio: float | None = field(
        default=None,
        metadata={"help": "Whole-model latency budget from a measured table: latency after / before, in (0, 1]; "
                          "needs --latency-table."})
    latency_table: str | None = field(
        default=None,
        metadata={"help": "JSON latency table written by `minreal latency-table` (per-layer and whole-model "
                          "latencies on the target provider)."})

    def __post_init__(self) -> None:
        given = self.budget_given
        if len(given) > 1:
            raise CompressionError(f"give only one of {', '.join(flag_of(k) for k in given)}")
        for k in given:
            if not 0.0 < getattr(self, k) <= 1.0:
                raise CompressionError(f"{flag_of(k)} must lie in (0, 1], got {getattr(self, k)}")
        if self.latency_ratio is not None and not self.latency_table:
            raise CompressionError("--latency-ratio needs --latency-table (latencies measured on the target "
                                   "provider); build one with `minreal latency-table MODEL --out table.json` (add --kind width "
                                   "for magnitude/wanda)")

    @property
    def budget_given(self) -> list[str]:
        """The whole-model budget fields that were set (at most one in a valid config)."""
        return [k for k in BUDGET_FIELDS if getattr(self, k) is not None]


@dataclass
class SeedOption:
    """The random seed of methods that sample, split or train."""

    seed: int = field(
        default=0,
        metadata={"help": "Random seed (sampling, data split, initialisation, training); default 0."})


@dataclass
class ExcludeOption:
    """Layers a method leaves unchanged."""

    exclude: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Qualified name of a layer to leave unchanged (e.g. fc or blocks.0.ssm); default none."})


@dataclass
class StateBudgetOption:
    """A total state count shared among the reduced layers (neurons for cbalanced, SSM states for ssm)."""

    state_budget: int | None = field(
        default=None,
        metadata={"help": "Total states kept across the reduced layers (cbalanced: neurons at the state points; ssm: "
                          "SSM states, shared at equal energy), >= 1; default none."})

    def __post_init__(self) -> None:
        if self.state_budget is not None and self.state_budget < 1:
            raise CompressionError(f"--state-budget must be a positive state count, got {self.state_budget}")


@dataclass
class WidthMultipleOption:
    """Channel widths on the fast multiple of the target kernels (width methods on channel groups)."""

    width_multiple: int = field(
        default=8,
        metadata={"help": "Channel groups keep widths on this multiple (the kernels' fast channel block; a group of "
                          "one segment no wider than it halves it), >= 1; default from the target provider (8)."})

    def __post_init__(self) -> None:
        if self.width_multiple < 1:
            raise CompressionError(f"--width-multiple must be >= 1, got {self.width_multiple}")

