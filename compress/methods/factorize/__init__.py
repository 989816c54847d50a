"""``factorize``: activation-aware (whitened) factorisation of Linear/Conv layers under a budgeted rank allocator."""

from ...core.lazy import lazy_exports
from ...core.options import rank_multiple_defaults
from ...core.spec import MethodSpec
from .config import FactorizeConfig

__all__ = ["SPEC", "FactorizeConfig", "LayerBasis", "factorize_compress", "layer_bases", "WhitenedBasis",
           "activation_distortion", "output_gram_basis", "projected_factors", "whitened_output_basis"]

_METHOD = "minreal.compress.methods.factorize.method"
SPEC = MethodSpec("factorize",
                  "activation-aware (whitened) factorisation into layer pairs with a budgeted rank allocator",
                  FactorizeConfig, f"{_METHOD}:factorize_compress",
                  provider_defaults=rank_multiple_defaults,
                  smoke_case="minreal.compress.methods.factorize.smoke:smoke_case",
                  budgets=("mac_ratio", "param_ratio", "latency_ratio"),
                  prepare=f"{_METHOD}:factorize_prepare", realise=f"{_METHOD}:factorize_realise",
                  realise_fields=("layer_mac_ratio", "layer_param_ratio", "rank_fraction", "layer_latency_ratio",
                                  "allocator", "rank_multiple", "latency_table"))

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("LayerBasis", "factorize_compress", "layer_bases"), ".method"),
    **dict.fromkeys(("WhitenedBasis", "activation_distortion", "output_gram_basis", "projected_factors",
                     "whitened_output_basis"), ".whiten")})
