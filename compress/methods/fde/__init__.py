"""``fde``: ε-forward-differential-equivalence merging — lump neurons (conv channels) whose dynamics agree within ε
(maths in ``partition``/``bound``; the MLP chain view is shared, in :mod:`compress.core.chain`)."""

from ...core.chain import ActSpec, Chain, build_sequential, chain_forward, extract_chain
from .bound import Perturbation, interval_bounds, step_bound
from .conv import (ConvChain, build_conv_sequential, conv_chain_forward, extract_conv_chain, is_conv_chain,
                   remove_zero_channels)
from .method import SPEC, FDEConfig, demo_case, fde_compress, input_box
from .partition import (MergeStep, RefineResult, box_samples, leader_clusters, refine, remove_all_constant,
                        remove_constant, sum_merge, value_merge)

__all__ = ["SPEC", "FDEConfig", "demo_case", "fde_compress", "input_box", "ActSpec", "Chain", "ConvChain",
           "MergeStep", "Perturbation", "RefineResult", "box_samples",
           "build_conv_sequential", "build_sequential", "chain_forward", "conv_chain_forward", "extract_chain",
           "extract_conv_chain", "interval_bounds", "is_conv_chain", "leader_clusters", "refine",
           "remove_all_constant", "remove_constant", "remove_zero_channels", "step_bound", "sum_merge",
           "value_merge"]
