"""Typed results of a compression run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LayerReport", "CompressionReport"]


@dataclass
class LayerReport:
    """What happened to one layer (or state point) of the model."""

    name: str
    kind: str
    action: str  # e.g. "factorized", "kept", "skipped", "merged", "reduced", "resized"
    reason: str = ""
    params_before: int = 0
    params_after: int = 0
    macs_before: int = 0
    macs_after: int = 0
    rank: int | None = None
    full_rank: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class CompressionReport:
    """Result of one method on one model: costs before/after, per-layer actions, predicted vs measured."""

    method: str
    config: dict[str, Any]
    params_before: int = 0
    params_after: int = 0
    macs_before: int = 0
    """Whole-model MACs of one sample as torch's FlopCounterMode counts them; a ruled layer in which torch met ops
    it has no formula for (``not_counted_by_torch``, e.g. an FFT) counts by its rule instead
    (:func:`~minreal.compress.core.costs.whole_model_macs`)."""
    macs_after: int = 0
    rule_macs_before: int = 0
    """Sum of the per-layer MAC rules (:func:`~minreal.compress.core.costs.count_costs`), the cost allocators budget."""
    rule_macs_after: int = 0
    layers: list[LayerReport] = field(default_factory=list)
    predicted: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    not_counted: list[str] = field(default_factory=list)
    """Modules with parameters but no per-layer MAC rule (BatchNorm, ...), in the compressed model."""
    not_covered_by_rules: list[str] = field(default_factory=list)
    """Modules (before or after) whose own torch-counted MACs no per-layer rule covers (attention, matmuls)."""
    not_counted_by_torch: list[str] = field(default_factory=list)
    """Heavy ops torch ran without a MAC formula (FFTs, CPU fused attention): missing from ``macs_*``."""
    spectra: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """Per layer (or state point): named spectra, descending (e.g. cbalanced's Gramian tests A, B, C)."""
    bounds: dict[str, float] = field(default_factory=dict)
    """Predicted error bounds by name: a layer name, or ``"output"`` for a whole-model bound."""
    recovery: dict[str, Any] | None = None
    """``asdict`` of the :class:`~minreal.compress.core.recover.RecoveryResult` when recovery ran after the method, else
    None; ``measured["recovered"]`` then compares the recovered model, the other measurements the zero-shot one."""

    @property
    def param_ratio(self) -> float:
        return self.params_after / max(self.params_before, 1)

    @property
    def mac_ratio(self) -> float:
        return self.macs_after / max(self.macs_before, 1)
