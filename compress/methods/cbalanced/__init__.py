"""``cbalanced``: C-balanced realisation — empirical Gramian ranks become the widths of a new network."""

from ...core.lazy import lazy_exports
from ...core.options import width_multiple_defaults
from ...core.spec import MethodSpec
from .config import INITS, SELECTIONS, CBalancedConfig

__all__ = ["SPEC", "CBalancedConfig", "StateAnalysis", "analyse_states", "budget_ranks", "cbalanced_compress",
           "realise", "demo_case", "INITS", "SELECTIONS", "StateGramians", "collect_gramians", "collect_states",
           "default_state_points", "observability_gramians", "reachability_gramians", "group_gramians",
           "group_state_samples", "select_groups", "state_slices", "closest_uniform_width", "realise_groups",
           "group_cuts", "ls_merge", "balanced_leverage", "round_width"]

_METHOD = "minreal.compress.methods.cbalanced.method"
SPEC = MethodSpec("cbalanced", "C-balanced realisation: Gramian ranks become the widths of a new network",
                  CBalancedConfig, f"{_METHOD}:cbalanced_compress", demo_case=f"{_METHOD}:demo_case",
                  report_fields=("spectra",), smoke_case="minreal.compress.methods.cbalanced.smoke:smoke_case",
                  provider_defaults=width_multiple_defaults, budgets=("mac_ratio", "param_ratio"),
                  takes_recovery=True)

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("StateAnalysis", "analyse_states", "budget_ranks"), ".analysis"),
    **dict.fromkeys(("StateGramians", "collect_gramians", "collect_states", "default_state_points",
                     "observability_gramians", "reachability_gramians"), ".empirical_gramians"),
    **dict.fromkeys(("group_gramians", "group_state_samples", "select_groups", "state_slices"), ".graph_gramians"),
    **dict.fromkeys(("cbalanced_compress", "closest_uniform_width", "demo_case", "realise"), ".method"),
    **dict.fromkeys(("balanced_leverage", "group_cuts", "ls_merge", "realise_groups", "round_width"),
                    ".graph_realise")})
