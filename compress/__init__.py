"""minreal.compress: structural compression of PyTorch models (pure PyTorch, no ONNX).

Methods live one per package under :mod:`minreal.compress.methods` (each exporting a ``SPEC``); what they share lives
in :mod:`minreal.compress.core`. Third-party methods register through the entry-point group ``minreal.methods``.

The names below are imported on first use (torch with them): importing this package, the registry or a
method's config imports no torch, so that the command line starts fast.
"""

from .core.lazy import lazy_exports

_EXPORTS = {"CostTable": ".core.costs", "count_costs": ".core.costs", "Dataset": ".core.data",
            "CompressionError": ".core.errors", "UnknownMethodError": ".core.errors",
            "RecoveryConfig": ".core.recover_options", "RecoveryResult": ".core.recover",
            "CompressionReport": ".core.report", "LayerReport": ".core.report", "MethodSpec": ".core.spec",
            **{name: ".registry" for name in ("compress", "get_method", "method_names", "register",
                                             "register_method")}}

__all__ = ["CompressionError", "UnknownMethodError", "CompressionReport", "LayerReport", "CostTable",
           "Dataset", "MethodSpec", "RecoveryConfig", "RecoveryResult", "compress", "count_costs",
           "get_method", "method_names", "register", "register_method"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
