"""What a run compresses: a trained model with its data (:class:`RunCase`) and the variants to make of it
(:class:`VariantSpec`); the command line, plan files and the embedded demo all build these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .data import Dataset
from .recover_options import RecoveryConfig

__all__ = ["RunCase", "VariantSpec"]


@dataclass
class VariantSpec:
    """One compressed variant of a run: a label, a registered method name and its config; or, for a chain
    of methods run in sequence, ``steps`` ((method, config) pairs; ``method`` is then the chain's label and
    ``config`` None)."""

    label: str
    method: str
    config: Any
    steps: tuple[tuple[str, Any], ...] = ()
    recovery: RecoveryConfig | None = None
    """This variant's own recovery; None takes the run's (``--recover-epochs``)."""


@dataclass
class RunCase:
    """A trained model with its data and the compressed variants a run makes of it.

    ``dynamic_dims`` names input axes beyond the batch that the ONNX export keeps dynamic
    (e.g. ``{1: "seq"}`` for sequence models); ``dynamic_axes`` does so by input name for named inputs.
    """

    name: str
    model: nn.Module
    train: Dataset
    test: Dataset
    runs: list[VariantSpec]
    dynamic_dims: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    """Dynamic axes besides the batch by input name (several-input models; ``"input"`` for one tensor)."""

    def axes(self) -> dict[str, dict[int, str]]:
        """Every dynamic axis besides the batch: ``dynamic_axes`` with ``dynamic_dims`` as the one tensor's."""
        out = {name: dict(per) for name, per in self.dynamic_axes.items()}
        if self.dynamic_dims:
            out.setdefault("input", {}).update(self.dynamic_dims)
        return out
