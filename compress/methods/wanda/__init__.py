"""``wanda``: structured Wanda pruning (|W|·‖X‖) of MLP neurons, or of the channel groups of any traceable model
(:mod:`minreal.compress.core.width`), at a whole-model budget (baseline)."""

from ...core.lazy import lazy_exports
from ...core.options import width_multiple_defaults
from ...core.spec import MethodSpec
from .config import WandaConfig

__all__ = ["WandaConfig", "activation_norms", "wanda_scores", "wanda_prepare", "wanda_prune", "SPEC"]

_METHOD = "minreal.compress.methods.wanda.method"
SPEC = MethodSpec("wanda", "structured Wanda pruning (|W|·‖X‖) of MLP neurons and channel groups (baseline)",
                  WandaConfig, f"{_METHOD}:wanda_prune", smoke_case="minreal.compress.methods.wanda.smoke:smoke_case",
                  provider_defaults=width_multiple_defaults,
                  budgets=("mac_ratio", "param_ratio", "latency_ratio"),
                  prepare=f"{_METHOD}:wanda_prepare", realise="minreal.compress.core.prune:prune_realise",
                  realise_fields=("widths", "width_multiple", "width_min", "importance_weighting", "latency_table"))

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(("activation_norms", "wanda_scores", "wanda_prepare",
                                                            "wanda_prune"), ".method"))
