"""Options of ``ssm`` (torch-free: the registry and the command line read them without importing the method)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import CompressionError, field_error
from ...core.options import CostBudget, ExcludeOption, StateBudgetOption

__all__ = ["SSMConfig"]


@dataclass
class SSMConfig(CostBudget, StateBudgetOption, ExcludeOption):
    """Options of the ``ssm`` method. Give one of ``trunc`` (fraction of states removed per layer),
    ``energy`` (fraction of each layer's HSV sum kept) or ``state_budget`` (total states across layers,
    shared at equal energy); with none, ``trunc=0.5``. ``max_cond`` bounds the condition number of the
    modal basis before the real Schur fallback; ``error_samples`` sequences measure per-layer errors."""

    trunc: float | None = field(
        default=None,
        metadata={"help": "Fraction of states removed per layer, in [0, 1); default 0.5 when no "
                          "--energy/--state-budget."})
    energy: float | None = field(
        default=None,
        metadata={"help": "Fraction of each layer's Hankel-singular-value sum kept, in (0, 1]; alternative to "
                          "--trunc."})
    max_cond: float = field(
        default=1e6,
        metadata={"help": "Largest condition number of the modal basis before the real Schur fallback; default 1e6."})
    max_len: int = field(
        default=4096,
        metadata={"help": "Kernel length (memory in steps) of a Schur-fallback layer, >= 1; default 4096."})
    error_samples: int = field(
        default=128,
        metadata={"help": "Sequences that measure the per-layer output errors, >= 1; default 128."})

    def __post_init__(self) -> None:
        CostBudget.__post_init__(self)
        given = [k for k in ("trunc", "energy", "state_budget") if getattr(self, k) is not None]
        if len(given) > 1:
            raise CompressionError("give only one of `trunc` (--trunc), `energy` (--energy) or `state_budget` "
                                   f"(--state-budget), got {', '.join(f'`{k}`' for k in given)}",
                                   fields=("trunc", "energy", "state_budget"))
        if self.trunc is not None and not 0.0 <= self.trunc < 1.0:
            raise field_error(self, "trunc", f"must lie in [0, 1), got {self.trunc}")
        if self.energy is not None and not 0.0 < self.energy <= 1.0:
            raise field_error(self, "energy", f"must lie in (0, 1], got {self.energy}")
        for name in ("state_budget", "max_len", "error_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise field_error(self, name, f"must be >= 1, got {value}")
