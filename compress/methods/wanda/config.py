"""Options of ``wanda`` (torch-free: the registry and the command line read them without importing the
method)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import field_error
from ...core.options import PruneOptions

__all__ = ["WandaConfig"]


@dataclass
class WandaConfig(PruneOptions):
    """As the ``magnitude`` options; ``norm_samples`` inputs of ``--data`` give the activation norms ‖X_j‖."""

    norm_samples: int = field(
        default=2048,
        metadata={"help": "Inputs of --data that give the activation norms ‖X_j‖, >= 1; default 2048."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.norm_samples < 1:
            raise field_error(self, "norm_samples", f"must be >= 1, got {self.norm_samples}")
