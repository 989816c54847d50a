"""minreal.compress: structural compression of PyTorch models (pure PyTorch, no ONNX).

Methods live one per package under :mod:`compress.methods` (each exporting a ``SPEC``); what they share lives
in :mod:`compress.core`. Third-party methods register through the entry-point group ``minreal.methods``.
"""

from .core.costs import CostTable, count_costs
from .core.data import Dataset
from .core.errors import CompressionError, UnknownMethodError
from .core.recover import RecoveryConfig, RecoveryResult
from .core.report import CompressionReport, LayerReport
from .core.spec import MethodSpec
from .registry import Method, compress, get_method, method_names, register, register_method

__all__ = ["CompressionError", "UnknownMethodError", "CompressionReport", "LayerReport", "CostTable",
           "Dataset", "Method", "MethodSpec", "RecoveryConfig", "RecoveryResult", "compress", "count_costs", "get_method", "method_names", "register",
           "register_method"]
