"""``depth``: remove whole residual blocks (ResNet blocks, transformer attention/MLP sub-blocks), so that every
kernel that stays keeps its width and its rate (INT8 included), in the order a criterion computed once."""

from ...core.lazy import lazy_exports
from ...core.spec import MethodSpec
from .config import CRITERIA, DEFAULT_CRITERION, DepthConfig

__all__ = ["SPEC", "DepthConfig", "CRITERIA", "DEFAULT_CRITERION", "DepthPrepared", "depth_prepare", "depth_realise",
           "depth_compress", "Block", "find_blocks", "remove_blocks"]

_METHOD = "minreal.compress.methods.depth.method"
SPEC = MethodSpec("depth",
                  f"remove whole residual blocks in the order of a criterion (default {DEFAULT_CRITERION}); every "
                  "kernel that stays keeps its width and its INT8 rate",
                  DepthConfig, f"{_METHOD}:depth_compress",
                  smoke_case="minreal.compress.methods.depth.smoke:smoke_case",
                  budgets=("mac_ratio", "param_ratio", "latency_ratio"),
                  prepare=f"{_METHOD}:depth_prepare", realise=f"{_METHOD}:depth_realise",
                  realise_fields=("latency_table",))

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("DepthPrepared", "depth_prepare", "depth_realise", "depth_compress"), ".method"),
    **dict.fromkeys(("Block", "find_blocks", "remove_blocks"), ".graph")})
