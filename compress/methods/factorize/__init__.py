"""``factorize``: activation-aware (whitened) factorisation of Linear/Conv layers under a budgeted rank allocator."""

from .method import SPEC, FactorizeConfig, LayerBasis, factorize_compress, layer_bases
from .whiten import WhitenedBasis, activation_distortion, projected_factors, whitened_output_basis

__all__ = ["SPEC", "FactorizeConfig", "LayerBasis", "factorize_compress", "layer_bases", "WhitenedBasis",
           "activation_distortion", "projected_factors", "whitened_output_basis"]
