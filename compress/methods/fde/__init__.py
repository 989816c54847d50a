"""``fde``: ε-forward-differential-equivalence merging — lump neurons (channels of any traceable model) whose
dynamics agree within ε (MLP maths in ``partition``/``bound``, the MLP chain view shared in
:mod:`compress.core.chain`; channel groups in ``graph``, on :mod:`compress.core.width`)."""

from ...core.chain import ActSpec, Chain, build_sequential, chain_forward, extract_chain
from .bound import Perturbation, interval_bounds, step_bound
from .graph import GroupPlan, Lumper, Partition, dead_atoms, group_cuts, plan_groups
from .graph_path import fde_graph, is_exported_program
from .method import SPEC, FDEConfig, FDEPrepared, demo_case, fde_compress, fde_prepare, fde_realise, input_box
from .partition import (MergeStep, RefineResult, box_samples, leader_clusters, refine, remove_all_constant,
                        remove_constant, sum_merge, value_merge)

__all__ = ["SPEC", "FDEConfig", "FDEPrepared", "demo_case", "fde_compress", "fde_prepare", "fde_realise", "input_box", "ActSpec", "Chain", "GroupPlan",
           "MergeStep", "Partition", "Perturbation", "RefineResult", "box_samples", "build_sequential",
           "chain_forward", "dead_atoms", "extract_chain", "fde_graph", "group_cuts", "interval_bounds",
           "is_exported_program", "leader_clusters", "Lumper", "plan_groups", "refine", "remove_all_constant",
           "remove_constant", "step_bound", "sum_merge", "value_merge"]
