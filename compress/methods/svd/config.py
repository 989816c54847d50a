"""Options of ``svd`` (torch-free: the registry and the command line read them without importing the method)."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.options import BudgetOptions

__all__ = ["SVDConfig"]


@dataclass
class SVDConfig(BudgetOptions):
    """Options of the plain-SVD baseline. Give one whole-model budget (``mac_ratio``/``param_ratio``/
    ``latency_ratio``), one of ``layer_mac_ratio``/``layer_param_ratio`` (cost ratio of the factorisable layers) or
    ``rank_fraction``; with none, ``layer_mac_ratio=0.5``."""
