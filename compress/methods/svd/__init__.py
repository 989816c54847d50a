"""``svd``: plain truncated-SVD factorisation of Linear/Conv weights (the baseline every method must beat)."""

from .method import SPEC, SVDConfig, svd_compress, svd_spectra

__all__ = ["SPEC", "SVDConfig", "svd_compress", "svd_spectra"]
