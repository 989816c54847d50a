"""Options of ``cbalanced`` (torch-free: the registry and the command line read them without importing the
method)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import CompressionError, field_error
from ...core.options import CostBudget, SeedOption, StateBudgetOption, WidthMultipleOption

__all__ = ["CBalancedConfig", "INITS", "SELECTIONS"]

#: ``--init``: how the realised network starts.
INITS = ("scratch", "warm")
#: ``--selection``: which neurons/channels a warm start keeps.
SELECTIONS = ("leverage", "magnitude")


@dataclass
class CBalancedConfig(CostBudget, SeedOption, StateBudgetOption, WidthMultipleOption):
    """Options of the C-balanced method: the energy tolerance, the total state budget or a whole-model MAC or
    parameter budget (``mac_ratio``/``param_ratio``: the largest total state budget whose realised network meets it)
    sets the widths.

    ``energy_eps``: energy left out by each test's rank (ignored when ``state_budget`` or a whole-model budget sets the
    total state order).
    ``init``: ``"scratch"`` or ``"warm"`` (kept neurons copied, then least-squares refit when ``refit``).
    The method trains nothing itself: the run's recovery (the shared ``--recover-*`` knobs: budget, optimiser,
    distillation from the original mixed with the labels by ``--recover-alpha``) trains the realised network, so a
    scratch start needs a recovery budget. ``controls``: also train the other start and the uniform-width control
    with that same recovery, and measure the projected diagnostic.
    ``go_samples``/``probes``/``max_exact_outputs``: observability Gramian on a subsample, exact Jacobians up to
    that many outputs, else a random-projection estimate.
    ``width_multiple``: channel-group widths are C ranks rounded up to it (Sequential MLPs keep the exact ranks).
    """

    energy_eps: float = field(
        default=1e-4,
        metadata={"help": "Energy left out by each test's rank, in [0, 1); default 1e-4; ignored with --state-budget, "
                          "--mac-ratio or --param-ratio."})
    state_points: tuple[str, ...] = field(
        default=(),
        metadata={"help": "A state point: for Sequential MLPs a hidden activation's module name; for other models a "
                          "channel group (its name, or a module writing it); default every hidden activation or "
                          "every channel group that can be resized."})
    init: str = field(
        default="warm",
        metadata={"help": "Start of the realised network: warm (kept neurons copied) or scratch (needs a recovery "
                          "budget, --recover-epochs, which trains it); default warm.",
                  "choices": INITS})
    selection: str = field(
        default="leverage",
        metadata={"help": "Which neurons/channels a warm start keeps: by balanced leverage or by the L1 norm of the "
                          "weight rows writing them; default leverage.",
                  "choices": SELECTIONS})
    refit: bool = field(
        default=True,
        metadata={"help": "Least-squares refit after copying the kept neurons/channels of a warm start (MLPs: each "
                          "following Linear; other models: every layer reading a resized group); default on."})
    ridge: float = field(
        default=1e-6,
        metadata={"help": "Ridge regularisation of the least-squares refit, >= 0; default 1e-6."})
    controls: bool = field(
        default=False,
        metadata={"help": "Also train the other start and the uniform-width control with the run's recovery, and "
                          "measure the projected diagnostic (two more trainings: minutes on a CNN); default off."})
    gramian_samples: int = field(
        default=4000,
        metadata={"help": "Training samples that estimate the Gramians, >= 1; default 4000."})
    go_samples: int = field(
        default=2000,
        metadata={"help": "Samples of the observability-Gramian subsample, >= 1; default 2000."})
    max_exact_outputs: int = field(
        default=64,
        metadata={"help": "Exact output Jacobians up to this many outputs, else a random-projection estimate; default "
                          "64."})
    probes: int = field(
        default=16,
        metadata={"help": "Random projections of that estimate when the outputs exceed --max-exact-outputs; default "
                          "16."})

    def __post_init__(self) -> None:
        CostBudget.__post_init__(self)
        StateBudgetOption.__post_init__(self)
        WidthMultipleOption.__post_init__(self)
        if self.init not in INITS:
            raise field_error(self, "init", f"must be one of {INITS}, got {self.init!r}")
        if self.selection not in SELECTIONS:
            raise field_error(self, "selection", f"must be one of {SELECTIONS}, got {self.selection!r}")
        if not 0.0 <= self.energy_eps < 1.0:
            raise field_error(self, "energy_eps", f"(--energy-eps) must lie in [0, 1), got {self.energy_eps}")
        if self.budget_given and self.state_budget is not None:
            budget = self.budget_given[0]
            raise CompressionError(f"give `state_budget` or `{budget}`, not both (the budget sets the total state "
                                   "count)", fields=("state_budget", budget))
        for name in ("gramian_samples", "go_samples", "probes"):
            if getattr(self, name) < 1:
                raise field_error(self, name, f"must be >= 1, got {getattr(self, name)}")
