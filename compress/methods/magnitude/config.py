"""Options of ``magnitude`` (torch-free: the registry and the command line read them without importing the
method)."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.options import PruneOptions

__all__ = ["MagnitudeConfig"]


@dataclass
class MagnitudeConfig(PruneOptions):
    """``param_ratio``/``mac_ratio``: whole-model budget (uniform keep-fraction per hidden layer); ``widths``:
    exact hidden widths instead (e.g. those another method reached)."""
