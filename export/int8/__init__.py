"""minreal.export.int8: INT8 quantisation with ONNX Runtime, one module per concern.

- :mod:`.target`: what each INT8 target writes, and ``cpu`` resolved for this machine (:func:`resolve_target`);
- :mod:`.config`: the options (:class:`QuantConfig`) and the result (:class:`QuantResult`);
- :mod:`.preprocess`: ONNX Runtime's pre-processing and the rewrites that keep tensors quantised;
- :mod:`.calibration`: calibration data and the activation ranges measured on it (:func:`calibrate`);
- :mod:`.overrides`: ranges trained by quantisation-aware recovery, placed as ONNX Runtime's overrides;
- :mod:`.passes`: one static or dynamic quantisation by ONNX Runtime;
- :mod:`.cleanup`: the retries that leave non-finite scales and float round trips in float;
- :mod:`.ops`: which nodes are quantised, and how many kernels run as integers;
- :mod:`.quantize`: :func:`quantize_int8`, the steps in order.

The names below are imported on first use: :mod:`.target` needs neither onnx nor onnxruntime, so resolving a
target does not load them.
"""

from minreal.compress.core.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("TARGETS", "resolve_target", "saturates_here", "target_text"), ".target"),
    **dict.fromkeys(("QuantConfig", "QuantResult", "target_format"), ".config"),
    **dict.fromkeys(("int8_skip_reason",), ".preprocess"),
    **dict.fromkeys(("ArrayCalibrationReader", "Calib", "Calibration", "calibrate", "calibration_digest",
                     "reusable_calibration"), ".calibration"),
    **dict.fromkeys(("module_inputs", "trained_overrides"), ".overrides"),
    **dict.fromkeys(("dynamic_weight_nodes", "nonfinite_scale_nodes", "optimized_op_counts", "quantizable_nodes"),
                    ".ops"),
    **dict.fromkeys(("quantize_int8",), ".quantize"),
}

__all__ = ["ArrayCalibrationReader", "Calib", "Calibration", "QuantConfig", "QuantResult", "TARGETS", "calibrate",
           "calibration_digest", "dynamic_weight_nodes", "int8_skip_reason", "module_inputs",
           "nonfinite_scale_nodes", "optimized_op_counts", "quantizable_nodes", "quantize_int8", "resolve_target",
           "reusable_calibration", "saturates_here", "target_format", "target_text", "trained_overrides"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
