"""``svd``: plain truncated-SVD factorisation of Linear/Conv weights (the baseline every method must beat)."""

from ...core.lazy import lazy_exports
from ...core.options import rank_multiple_defaults
from ...core.spec import MethodSpec
from .config import SVDConfig

__all__ = ["SPEC", "LayerSVD", "SVDConfig", "SVDPrepared", "layer_svd", "svd_compress", "svd_prepare", "svd_realise",
           "svd_spectra"]

_METHOD = "minreal.compress.methods.svd.method"
SPEC = MethodSpec("svd", "plain truncated SVD into two layers (baseline)", SVDConfig, f"{_METHOD}:svd_compress",
                  provider_defaults=rank_multiple_defaults,
                  smoke_case="minreal.compress.methods.svd.smoke:smoke_case",
                  budgets=("mac_ratio", "param_ratio", "latency_ratio"), prepare=f"{_METHOD}:svd_prepare",
                  realise=f"{_METHOD}:svd_realise",
                  realise_fields=("layer_mac_ratio", "layer_param_ratio", "rank_fraction", "allocator",
                                  "rank_multiple", "latency_table"))

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(
    ("LayerSVD", "SVDPrepared", "layer_svd", "svd_compress", "svd_prepare", "svd_realise", "svd_spectra"), ".method"))
