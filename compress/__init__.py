"""minreal.compress: structural compression of PyTorch models (pure PyTorch, no ONNX)."""

from . import methods  # noqa: F401  (registers the methods)
from .costs import CostTable, count_costs
from .data import Dataset
from .errors import CompressionError, UnknownMethodError
from .registry import Method, compress, get_method, method_names, register_method
from .report import CompressionReport, LayerReport

__all__ = ["CompressionError", "UnknownMethodError", "CompressionReport", "LayerReport", "CostTable",
           "Dataset", "Method", "compress", "count_costs", "get_method", "method_names", "register_method"]
