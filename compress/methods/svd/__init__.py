"""``svd``: plain truncated-SVD factorisation of Linear/Conv weights (the baseline every method must beat)."""

from .method import (SPEC, LayerSVD, SVDConfig, SVDPrepared, layer_svd, svd_compress, svd_prepare, svd_realise,
                     svd_spectra)

__all__ = ["SPEC", "LayerSVD", "SVDConfig", "SVDPrepared", "layer_svd", "svd_compress", "svd_prepare", "svd_realise",
           "svd_spectra"]
