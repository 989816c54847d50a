"""What the embedded demo needs from a method: a trained original model, its data, and configs to run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .data import Dataset
from .recover import RecoveryConfig

__all__ = ["DemoCase", "DemoRun"]


@dataclass
class DemoRun:
    """One compressed variant in the demo: a label, a registered method name and its config; or, for a chain
    of methods run in sequence, ``steps`` ((method, config) pairs; ``method`` is then the chain's label and
    ``config`` None)."""

    label: str
    method: str
    config: Any
    steps: tuple[tuple[str, Any], ...] = ()
    recovery: RecoveryConfig | None = None
    """This variant's own recovery; None takes the run's (``--recover-epochs``)."""


@dataclass
class DemoCase:
    """A trained model on offline data with the compressed variants the demo shows for it.

    ``dynamic_dims`` names input axes beyond the batch that the ONNX export keeps dynamic
    (e.g. ``{1: "seq"}`` for sequence models); ``dynamic_axes`` does so by input name for named inputs.
    """

    name: str
    model: nn.Module
    train: Dataset
    test: Dataset
    runs: list[DemoRun]
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
