"""``magnitude``: structured magnitude pruning of MLP neurons, or of the channel groups of any traceable model
(:mod:`minreal.compress.core.width`), at a whole-model budget (baseline)."""

from ...core.lazy import lazy_exports
from ...core.options import width_multiple_defaults
from ...core.spec import MethodSpec
from .config import MagnitudeConfig

__all__ = ["MagnitudeConfig", "magnitude_scores", "magnitude_group_scores", "magnitude_prepare", "magnitude_prune",
           "SPEC"]

_METHOD = "minreal.compress.methods.magnitude.method"
SPEC = MethodSpec("magnitude",
                  "structured magnitude pruning of MLP neurons and conv/attention channel groups (baseline)",
                  MagnitudeConfig, f"{_METHOD}:magnitude_prune",
                  smoke_case="minreal.compress.methods.magnitude.smoke:smoke_case",
                  provider_defaults=width_multiple_defaults,
                  budgets=("mac_ratio", "param_ratio", "latency_ratio"),
                  prepare=f"{_METHOD}:magnitude_prepare", realise="minreal.compress.core.prune:prune_realise",
                  realise_fields=("widths", "width_multiple", "width_min", "importance_weighting", "latency_table"))

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(
    ("magnitude_scores", "magnitude_group_scores", "magnitude_prepare", "magnitude_prune"), ".method"))
