"""What a compression method is: one :class:`MethodSpec` carrying everything the registry, CLI, demo and
report need (torchvision's ``Weights`` entries and timm's registry entries are the models)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .lazy import LazyCallable
from .options import BUDGET_FIELDS

if TYPE_CHECKING:
    from torch import nn

    from .data import Dataset
    from .report import CompressionReport
    from .run_case import RunCase
    from .smoke import SmokeCase

__all__ = ["MethodSpec", "MethodFn", "PrepareFn", "RealiseFn", "ProviderDefaults", "no_provider_defaults",
           "REPORT_FIELDS", "CALLABLE_FIELDS"]

MethodFn = Callable[["nn.Module", "Dataset", Any], "tuple[nn.Module, CompressionReport]"]
PrepareFn = Callable[["nn.Module", "Dataset", Any], Any]
"""``prepare(model, data, config) -> state``: everything that does not depend on the budget."""
RealiseFn = Callable[[Any, Any], "tuple[nn.Module, CompressionReport]"]
"""``realise(state, config) -> (compressed module, report)``: the cheap, budget-dependent step."""
ProviderDefaults = Callable[[Sequence[str]], dict[str, Any]]

#: Typed :class:`~minreal.compress.core.report.CompressionReport` fields a method may declare that it fills.
REPORT_FIELDS = ("spectra", "bounds")
#: The :class:`MethodSpec` fields that take a function, or its ``"package.module:function"`` name (imported on
#: first call, so that listing the methods and their options imports no torch).
CALLABLE_FIELDS = ("run", "demo_case", "provider_defaults", "smoke_case", "prepare", "realise")


def no_provider_defaults(providers: Sequence[str]) -> dict[str, Any]:
    """No option of the method depends on the target providers."""
    return {}


@dataclass(frozen=True)
class MethodSpec:
    """A compression method, as registered.

    Attributes
    ----------
    name : str
        Unique registered name (``minreal compress --method NAME``).
    summary : str
        One line for ``minreal methods``.
    config_cls : type
        Dataclass of the method's options; it validates itself in ``__post_init__`` and each field
        ``foo_bar`` is the CLI option ``--foo-bar`` (``metadata["help"]`` required).
    run : callable or str
        ``run(model, data, config) -> (compressed module, report)``. The registry's :func:`compress` fills the
        shared cost fields and the output comparison afterwards; ``run`` records what is its own.
    demo_case : callable or None
        ``demo_case(quick) -> RunCase``: a trained model with the variants the embedded demo shows.
    provider_defaults : callable
        ``provider_defaults(provider_names) -> {field: value}``: option defaults that depend on the target
        execution providers (e.g. the rank multiple of the fast kernels).
    report_fields : tuple of str
        The typed report fields (see :data:`REPORT_FIELDS`) the method fills.
    smoke_case : callable or None
        ``smoke_case() -> SmokeCase``: a tiny seeded model, data and small config on which the checks every
        registered method must pass run (``tests/compress/methods/test_methods_common.py``); required there.
    budgets : tuple of str
        The whole-model budgets (:data:`~minreal.compress.core.options.BUDGET_FIELDS`: ``mac_ratio``, ``param_ratio``,
        ``latency_ratio``) the method can meet; :func:`~minreal.compress.registry.compress` refuses the others.
    prepare, realise : callable or None
        The two phases (:func:`~minreal.compress.registry.prepare`, :func:`~minreal.compress.registry.realise`):
        ``prepare`` computes what does not depend on the budget (statistics, bases, importances, partitions) once,
        ``realise`` builds the module for one budget from it, many times. Both or neither: a method without them does
        all its work for every budget (``run``), and says so in ``minreal methods``.
    realise_fields : tuple of str
        Config fields besides the whole-model budgets that only ``realise`` reads (layer budgets, the allocator):
        a prepared state serves every value of them.
    takes_recovery : bool
        ``run(model, data, config, recovery)`` also receives the run's recovery config (the shared ``--recover-*``
        knobs; None when no recovery follows) and trains with it what it trains itself (cbalanced: its controls;
        it refuses a start that only training makes usable when none follows). The result is then recovered like
        every method's. A method with two phases cannot take it.

    Each function (:data:`CALLABLE_FIELDS`) may be given as its ``"package.module:function"`` name instead: it
    is then a :class:`~minreal.compress.core.lazy.LazyCallable`, imported on its first call. The built-in methods name
    theirs, so that the registry, ``minreal methods`` and ``--help`` import only the torch-free configs.
    """

    name: str
    summary: str
    config_cls: type
    run: MethodFn | str
    demo_case: Callable[[bool], RunCase] | str | None = None
    provider_defaults: ProviderDefaults | str = no_provider_defaults
    report_fields: tuple[str, ...] = ()
    smoke_case: Callable[[], SmokeCase] | str | None = None
    budgets: tuple[str, ...] = ()
    prepare: PrepareFn | str | None = None
    realise: RealiseFn | str | None = None
    realise_fields: tuple[str, ...] = ()
    takes_recovery: bool = False

    def __post_init__(self) -> None:
        for key in CALLABLE_FIELDS:
            value = getattr(self, key)
            if isinstance(value, str):
                object.__setattr__(self, key, LazyCallable(value))
        if not self.name or not self.name.replace("-", "_").isidentifier():
            raise ValueError(f"method name {self.name!r} must be a non-empty identifier (dashes allowed)")
        unknown = sorted(set(self.report_fields) - set(REPORT_FIELDS))
        if unknown:
            raise ValueError(f"method {self.name!r}: unknown report fields {unknown}; known: {list(REPORT_FIELDS)}")
        unknown = sorted(set(self.budgets) - set(BUDGET_FIELDS))
        if unknown:
            raise ValueError(f"method {self.name!r}: unknown budgets {unknown}; known: {list(BUDGET_FIELDS)}")
        if (self.prepare is None) != (self.realise is None):
            raise ValueError(f"method {self.name!r}: give both prepare and realise, or neither")
        if self.takes_recovery and self.prepare is not None:
            raise ValueError(f"method {self.name!r}: a two-phase method cannot take the recovery config")

    @property
    def two_phase(self) -> bool:
        """Whether the method has a budget-free ``prepare`` and a per-budget ``realise``."""
        return self.prepare is not None

    @property
    def searchable(self) -> bool:
        """Whether ``tune`` can search it: it meets a whole-model MAC budget and has two phases (its budget-free work
        done once, then realised for every budget the search probes; a one-phase method would redo all of it)."""
        return not self.unsearchable

    @property
    def unsearchable(self) -> str:
        """Why ``tune`` cannot search it (empty when it can: :attr:`searchable`)."""
        if "mac_ratio" not in self.budgets:
            return "it has no whole-model MAC budget"
        if not self.two_phase:
            return "it would do all its work again for every budget probed (no budget-free prepare phase)"
        return ""

    @property
    def fn(self) -> MethodFn:
        """The run function (the name the first registry used)."""
        return self.run
