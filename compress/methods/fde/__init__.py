"""``fde``: ε-forward-differential-equivalence merging — lump neurons (channels of any traceable model) whose
dynamics agree within ε (MLP maths in ``partition``/``bound``, the MLP chain view shared in
:mod:`minreal.compress.core.chain`; channel groups in ``graph``, on :mod:`minreal.compress.core.width`)."""

from ...core.lazy import lazy_exports
from ...core.spec import MethodSpec
from .config import FDEConfig

__all__ = ["SPEC", "FDEConfig", "FDEPrepared", "demo_case", "fde_compress", "fde_prepare", "fde_realise", "input_box",
           "ActSpec", "Chain", "GroupPlan", "MergeStep", "Partition", "Perturbation", "RefineResult", "box_samples",
           "build_sequential", "chain_forward", "dead_atoms", "extract_chain", "fde_graph", "group_cuts",
           "interval_bounds", "is_exported_program", "leader_clusters", "Lumper", "plan_groups", "refine",
           "remove_all_constant", "remove_constant", "step_bound", "sum_merge", "value_merge"]

_METHOD = "minreal.compress.methods.fde.method"
SPEC = MethodSpec("fde", "ε-FDE merging of MLP neurons and of channels in any traceable model (lump equivalent "
                  "ones)", FDEConfig, f"{_METHOD}:fde_compress", demo_case=f"{_METHOD}:demo_case",
                  report_fields=("bounds",), smoke_case="minreal.compress.methods.fde.smoke:smoke_case",
                  budgets=("mac_ratio", "param_ratio"), prepare=f"{_METHOD}:fde_prepare",
                  realise=f"{_METHOD}:fde_realise", realise_fields=("merge_eps",))

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("ActSpec", "Chain", "build_sequential", "chain_forward", "extract_chain"), "...core.chain"),
    **dict.fromkeys(("Perturbation", "interval_bounds", "step_bound"), ".bound"),
    **dict.fromkeys(("GroupPlan", "Lumper", "Partition", "dead_atoms", "group_cuts", "plan_groups"), ".graph"),
    "fde_graph": ".graph_path", "is_exported_program": "...core.width",
    **dict.fromkeys(("demo_case", "fde_compress", "fde_prepare", "fde_realise", "FDEPrepared", "input_box"), ".method"),
    **dict.fromkeys(("MergeStep", "RefineResult", "box_samples", "leader_clusters", "refine",
                     "remove_all_constant", "remove_constant", "sum_merge", "value_merge"), ".partition")})
