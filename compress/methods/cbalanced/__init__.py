"""``cbalanced``: C-balanced realisation — empirical Gramian ranks become the widths of a new network."""

from .empirical_gramians import (StateGramians, collect_gramians, collect_states, default_state_points,
                                 observability_gramians, reachability_gramians)
from .method import (INITS, SELECTIONS, SPEC, CBalancedConfig, StateAnalysis, analyse_states, budget_ranks,
                     cbalanced_compress, demo_case, realise)

__all__ = ["SPEC", "CBalancedConfig", "StateAnalysis", "analyse_states", "budget_ranks", "cbalanced_compress",
           "realise", "demo_case", "INITS", "SELECTIONS", "StateGramians", "collect_gramians", "collect_states",
           "default_state_points", "observability_gramians", "reachability_gramians"]
