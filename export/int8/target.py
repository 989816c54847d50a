"""INT8 target policy: what each ``--quant-target`` writes, and ``cpu`` resolved for this machine.

Each target picks the activation type, its symmetry, whether biases are int32 and whether weights are 7-bit
(:data:`TARGETS`):

- ``cpu-vnni``: uint8, asymmetric (QUInt8) activations, 8-bit weights ("U8S8"). ORT's CPU provider fuses
  DQ→Conv→(Relu)→Q into integer kernels (QLinearConv, QGemm); measured about 2x faster than int8 activations on
  x86. Right for x86 CPUs with VNNI or AMX (ARM runs it too, but ``arm64`` is its own format).
- ``cpu-avx2``: the same with 7-bit weights (``reduce_range``: [-64, 64]). On x86 without VNNI ORT's U8S8 kernel
  adds two u8·s8 products into a saturating int16 (``VPMADDUBSW``); with 7-bit weights a pair is at most
  2·255·64 = 32640 < 2^15, so it cannot saturate (:mod:`minreal.runtime_bench.cpu`).
- ``cpu``: whichever of the two is right for the machine that quantises (:func:`resolve_target`, the one function
  that resolves it; ``tests/export/test_int8_target.py`` checks that nothing else does).
- ``arm64``: int8, symmetric (QInt8, zero point 0) activations and per-channel symmetric 8-bit int8 weights ("S8S8"),
  int32 biases. ONNX Runtime's quantisation guide (docs/performance/model-optimizations/quantization.md) calls S8S8 in
  QDQ "the first choice" and says U8S8 saturation, the one reason for 7-bit weights, does not occur on ARM; MLAS's
  ARM64 build has int8-input symmetric convolution kernels (``MlasConvSymS8DispatchNeon``/``...Dot`` in
  ``core/mlas/lib/convsym.cpp``; its uint8 dispatches shift the input zero point by 128, ``FixupInputZeroPoint``) and
  an S8S8 GEMM (``MlasGemmS8S8DispatchSdot`` in ``core/mlas/lib/platform.cpp``); ARM's graph optimiser keeps int8 Q/DQ
  as they are (``QDQIsInt8Allowed()`` is true only for ARM builds). On x86 ONNX Runtime's ``QDQS8ToU8Transformer``
  turns the int8 activations into uint8 (zero point 128), so the file runs here in U8S8, computing the same QDQ
  function: parity and accuracy are measured here, latency on ARM is not. Its kernels are counted in the graph ONNX
  Runtime builds for ARM (``session.qdqisint8allowed=1``, :data:`minreal.runtime_bench.cpu.ARM_GRAPH_CONFIG`). Not
  quantised with x86's rules: no input-channel widening, no round-trip dropping (both are about x86 kernels or a graph
  optimised here). A cost of symmetric activations: ORT folds a ReLU into the preceding quantiser only when the zero
  point is the type's minimum (``ReluQuantFusion``), so each ReLU runs in float between a dequantise and a
  re-quantise, on ARM too.
- ``tensorrt``: int8, symmetric (QInt8, ``ActivationSymmetric``/``WeightSymmetric``), biases left
  in float (``QuantizeBias=False``): what TensorRT's explicit-quantisation mode expects.

No onnx or onnxruntime here: the command line resolves a target before it imports either.

References
----------
.. [1] ONNX Runtime, ``docs/performance/model-optimizations/quantization.md``: S8S8 in QDQ "the first choice" and U8S8
       saturation on x86 without VNNI.
.. [2] ONNX Runtime, ``core/mlas/lib/convsym.cpp`` (``MlasConvSymS8DispatchNeon``, ``FixupInputZeroPoint``) and
       ``core/mlas/lib/platform.cpp`` (``MlasGemmS8S8DispatchSdot``): ARM64's int8 kernels.
.. [3] ONNX Runtime, ``qdq_selector_action_transformer.h`` (``QDQIsInt8Allowed()``), ``QDQS8ToU8Transformer`` and
       ``ReluQuantFusion``: how x86 and ARM graphs treat int8 Q/DQ.
"""

from __future__ import annotations

from typing import NamedTuple

import minreal.runtime_bench.cpu as cpu_facts
from minreal.export.settings import AUTO_TARGET
from minreal.facts import ARM64_TARGET, CPU_AVX2_TARGET, CPU_VNNI_TARGET

__all__ = ["TargetFormat", "TARGETS", "ORT_CPU_TARGETS", "TARGET_GRAPHS", "resolve_target", "target_text",
           "saturates_here"]


class TargetFormat(NamedTuple):
    """Per-target defaults: activation type, symmetric activations, int32-quantised biases, 7-bit weights."""

    activation_type: str
    activation_symmetric: bool
    quantize_bias: bool
    reduce_range: bool = False


TARGETS = {
    CPU_VNNI_TARGET: TargetFormat("uint8", False, True),
    CPU_AVX2_TARGET: TargetFormat("uint8", False, True, reduce_range=True),
    ARM64_TARGET: TargetFormat("int8", True, True),
    "tensorrt": TargetFormat("int8", True, False),
}
#: Targets whose files ONNX Runtime's CPU provider runs (zero pads on quantised tensors,
#: :mod:`~minreal.export.int8.passes`).
ORT_CPU_TARGETS = (*cpu_facts.CPU_TARGETS, ARM64_TARGET)
#: Session config of the CPU graph whose kernels a target's result counts (this machine's graph for the others): an
#: arm64 file's is the graph ONNX Runtime builds for ARM. On x86 ORT's own graph of it runs a ResNet's residual
#: convolutions and additions in float (uint8-converted and int8 Q/DQ meet there), which ARM's fuses into int8 kernels.
TARGET_GRAPHS = {ARM64_TARGET: cpu_facts.ARM_GRAPH_CONFIG}


def resolve_target(target: str, mode: str = "static") -> str:
    """``cpu`` → ``arm64`` on an ARM64 CPU, ``cpu-vnni`` where this machine's ONNX Runtime U8S8 kernel cannot saturate
    (x86 with VNNI or AMX), else ``cpu-avx2`` (:func:`minreal.runtime_bench.cpu.cpu_int8_target`); in ``dynamic``
    mode (uint8 activations quantised at run time, never ARM's S8S8) ``cpu-vnni`` on ARM. An explicit target is
    returned as is."""
    if target != AUTO_TARGET:
        return target
    found = cpu_facts.cpu_int8_target()
    return CPU_VNNI_TARGET if found == ARM64_TARGET and mode == "dynamic" else found


def target_text(requested: str, target: str) -> str:
    """The target for a progress line: ``cpu → cpu-avx2`` where ``requested`` was resolved into ``target``
    (:func:`resolve_target`), else ``target``."""
    return target if requested == target else f"{requested} → {target}"


def saturates_here(weight_type: str, reduce_range: bool) -> bool:
    """Whether a file of this format can saturate in ONNX Runtime's CPU kernels on this machine: 8-bit int8
    weights (with uint8 activations, or int8 ones, which ORT's x86 graph turns into uint8) on a CPU whose kernel
    adds u8·s8 pairs in int16. 7-bit or uint8 weights cannot."""
    return weight_type == "int8" and not reduce_range and cpu_facts.kernel_saturates()
