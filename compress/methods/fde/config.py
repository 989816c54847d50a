"""Options of ``fde`` (torch-free: the registry and the command line read them without importing the method)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...core.errors import CompressionError, field_error
from ...core.options import CostBudget, SeedOption

__all__ = ["FDEConfig", "REPRESENTATIVES"]

#: Incoming row a lossy block keeps (see :func:`minreal.compress.methods.fde.partition.block_representatives`).
REPRESENTATIVES = ("leader", "mean", "lstsq")


@dataclass
class FDEConfig(SeedOption, CostBudget):
    """Options of ``fde``: the merge tolerance, or a whole-model ``param_ratio``/``mac_ratio`` budget, sets the
    reduction (MLPs: widths per layer from the budget; other models: ε bisected until the budget is met).

    ``merge_eps``: tolerance relative to each layer's (each channel writer's) largest coefficient (0: exact, up
    to dtype rounding);
    ``representative``: incoming row a lossy block keeps (leader, block mean, data-weighted least squares);
    ``compensation``: least-squares refit of the consumers, kept only when it helps on a held-out split;
    ``remove_dead``: first drop neurons constant (channels exactly 0) on the calibration data; ``scaling``:
    merge positive multiples (ReLU/LeakyReLU/identity; channel groups whose operations are all positively
    homogeneous); ``sum_merges``: forward (sum) equivalence on identity layers (MLPs);
    ``box_margin``: widen the calibration input box by this fraction of its range for the bound (MLPs);
    """

    merge_eps: float = field(
        default=0.0,
        metadata={"help": "Merge tolerance relative to each layer's (each channel writer's) largest coefficient, "
                          ">= 0; default 0 (exact up to rounding)."})
    remove_dead: bool = field(
        default=True,
        metadata={"help": "First drop neurons that are constant on the calibration data (other models: channels "
                          "exactly 0 there at every state point); default on."})
    scaling: bool = field(
        default=True,
        metadata={"help": "Merge neurons (channels) that are positive multiples (ReLU/LeakyReLU/identity; channel "
                          "groups whose operations are all positively homogeneous); default on."})
    sum_merges: bool = field(
        default=True,
        metadata={"help": "Forward (sum) equivalence merges on identity layers; MLPs only; default on."})
    max_sweeps: int = field(
        default=50,
        metadata={"help": "Maximum partition-refinement sweeps, >= 1; default 50."})
    box_margin: float = field(
        default=0.0,
        metadata={"help": "Widen the calibration input box by this fraction of its range for the bound, >= 0; MLPs "
                          "only; default 0."})
    bound_samples: int = field(
        default=4096,
        metadata={"help": "Points sampled in the input box to measure the error bound, >= 1; MLPs only; default "
                          "4096."})
    representative: str = field(
        default="leader",
        metadata={"help": "Incoming weights a merged block keeps: its leader (classic ε-FDE), the block mean, or "
                          "lstsq (least squares of the members' pre-activations on the calibration data, weighted "
                          "by their outgoing weights); mean and lstsq on MLPs only; default leader (with the "
                          "compensation, the best measured: benchmarks/fde_vs_pruning.json).",
                  "choices": REPRESENTATIVES})
    compensation: bool | None = field(
        default=None,
        metadata={"help": "Refit the Linear layers after the first by least squares on calibration activations, "
                          "kept only if it lowers the output error on a held-out split; MLPs only; default on for "
                          "MLPs (the best measured, benchmarks/fde_vs_pruning.json), off on other models."})
    compensation_ridge: float = field(
        default=1e-3,
        metadata={"help": "Relative ridge of the compensation refit, >= 0; default 1e-3."})
    compensation_holdout: float = field(
        default=0.2,
        metadata={"help": "Share of the calibration data held out to check the compensation, in (0, 1); default "
                          "0.2."})

    def __post_init__(self) -> None:
        CostBudget.__post_init__(self)
        for name, least in (("merge_eps", 0), ("box_margin", 0), ("max_sweeps", 1), ("bound_samples", 1),
                            ("compensation_ridge", 0)):
            if getattr(self, name) < least:
                raise field_error(self, name, f"must be >= {least}, got {getattr(self, name)}")
        if self.representative not in REPRESENTATIVES:
            raise field_error(self, "representative", f"must be one of {REPRESENTATIVES}, got {self.representative!r}")
        if not 0.0 < self.compensation_holdout < 1.0:
            raise field_error(self, "compensation_holdout", f"must lie in (0, 1), got {self.compensation_holdout}")
        if self.budget_given and self.merge_eps > 0:
            budget = self.budget_given[0]
            raise CompressionError(f"give `merge_eps` or `{budget}`, not both (the budget sets the tolerance)",
                                   fields=("merge_eps", budget))

    def for_mlp(self) -> FDEConfig:
        """This config with its MLP default resolved: no ``compensation`` given is on (the held-out check keeps the
        refit only where it helps)."""
        return replace(self, compensation=True if self.compensation is None else self.compensation)

    def graph_options_given(self) -> bool:
        """Whether an MLP-only option was asked for explicitly (the graph path merges into leaders, uncompensated)."""
        return self.representative != "leader" or bool(self.compensation)
