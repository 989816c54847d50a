"""``cbalanced``: C-balanced realisation — empirical Gramian ranks become the widths of a new network."""

from .analysis import StateAnalysis, analyse_states, budget_ranks
from .empirical_gramians import (StateGramians, collect_gramians, collect_states, default_state_points,
                                 observability_gramians, reachability_gramians)
from .graph_gramians import group_gramians, group_state_samples, select_groups, state_slices
from .method import (INITS, SELECTIONS, SPEC, CBalancedConfig, cbalanced_compress, closest_uniform_width, demo_case,
                     realise)
from .graph_realise import balanced_leverage, group_cuts, ls_merge, realise_groups, round_width

__all__ = ["SPEC", "CBalancedConfig", "StateAnalysis", "analyse_states", "budget_ranks", "cbalanced_compress",
           "realise", "demo_case", "INITS", "SELECTIONS", "StateGramians", "collect_gramians", "collect_states",
           "default_state_points", "observability_gramians", "reachability_gramians", "group_gramians",
           "group_state_samples", "select_groups", "state_slices", "closest_uniform_width", "realise_groups",
           "group_cuts", "ls_merge", "balanced_leverage", "round_width"]
