"""ε-FDE neuron merging: lump neurons whose dynamics agree within ε (maths in ``partition``/``bound``)."""

from .bound import Perturbation, interval_bounds, step_bound
from .chain import ActSpec, Chain, build_sequential, chain_forward, extract_chain
from .partition import (MergeStep, RefineResult, box_samples, leader_clusters, refine, remove_all_constant,
                        remove_constant, sum_merge, value_merge)

__all__ = ["ActSpec", "Chain", "MergeStep", "Perturbation", "RefineResult", "box_samples", "build_sequential",
           "chain_forward", "extract_chain", "interval_bounds", "leader_clusters", "refine",
           "remove_all_constant", "remove_constant", "step_bound", "sum_merge", "value_merge"]
