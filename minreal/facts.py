"""Facts that ``compress``, ``export`` and ``runtime_bench`` share, each written once.

Provider names, the ONNX op sets that run in integer arithmetic, the progress-record key, the one-line form of an
error and the base of the errors that name a Python API's fields (:class:`FieldError`). This module imports only the
standard library (and ``runtime_bench/__init__`` loads its names lazily), so every side may import it cheaply: it is
the one module of ``runtime_bench`` that ``compress`` may import. ``tests/test_layering.py`` checks both, and that
these literals are defined nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

__all__ = [
    "INT8_SUFFIX",
    "PTQ_SUFFIX",
    "int8_source",
    "PROGRESS_KEY",
    "DETAIL_KEY",
    "PROVIDERS",
    "INSTALL_HINTS",
    "INTEGER_KERNEL_OPS",
    "FLOAT_KERNEL_OPS",
    "FLOAT_ATTENTION_OPS",
    "INTEGER_OPS",
    "INTEGER_MATMUL_OP",
    "INTEGER_KERNEL_OPERANDS",
    "CPU_VNNI_TARGET",
    "CPU_AVX2_TARGET",
    "ARM64_TARGET",
    "INT8_TARGET_KEY",
    "WEIGHT_QMAX",
    "REDUCED_WEIGHT_QMAX",
    "ANSI_ESCAPE",
    "FieldError",
    "first_line",
    "error_line",
]

#: ``logging`` extra key of progress records ``(task, done, total)``: library code logs them, the CLI draws bars.
PROGRESS_KEY = "minreal_progress"
#: ``logging`` extra key of a progress record's detail: a short text (e.g. an epoch's losses) that a log shows on the
#: record's own line, never thinned out.
DETAIL_KEY = "minreal_progress_detail"

#: Short name (CLI / config) -> onnxruntime execution-provider name.
PROVIDERS: Mapping[str, str] = MappingProxyType(
    {
        "cpu": "CPUExecutionProvider",
        "cuda": "CUDAExecutionProvider",
        "tensorrt": "TensorrtExecutionProvider",
    }
)

#: Short name -> what installs an onnxruntime build that has the provider.
INSTALL_HINTS: Mapping[str, str] = MappingProxyType(
    {
        "cpu": "pip install 'minreal[cpu]' (from a checkout: pip install -e '.[cpu]')",
        "cuda": "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'minreal[gpu]' (from a checkout: "
                "-e '.[gpu]'; onnxruntime-gpu for CUDA 13 with its CUDA runtime and cuDNN wheels)",
        "tensorrt": "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'minreal[tensorrt]' (from a "
                    "checkout: -e '.[tensorrt]'; onnxruntime-gpu plus TensorRT 10 for CUDA 13)",
    }
)

INTEGER_KERNEL_OPS: frozenset[str] = frozenset(
    {
        "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QGemm", "NhwcQLinearConv",
        "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention", "DynamicQuantizeLSTM",
    }
)  # fmt: skip
"""Op types (any domain) that compute Conv/MatMul/Gemm (and attention, LSTM) in integer arithmetic."""

CPU_VNNI_TARGET, CPU_AVX2_TARGET = "cpu-vnni", "cpu-avx2"
"""The explicit CPU INT8 formats (``--quant-target``): uint8 activations with 8-bit weights, for CPUs whose int8
kernels cannot saturate (x86 with VNNI or AMX, ARM), and with 7-bit weights, which cannot saturate anywhere
(:mod:`minreal.runtime_bench.cpu`); ``cpu`` means the one the machine needs. QAT (``minreal.compress.core.qat``),
quantisation and tune share these names."""

ARM64_TARGET = "arm64"
"""The INT8 format for ONNX Runtime's ARM64 CPU kernels (``--quant-target arm64``): symmetric int8 activations and
per-channel symmetric 8-bit int8 weights (S8S8), which MLAS's ARM64 symmetric convolution and GEMM kernels take as
they are. QAT, quantisation and tune share this name."""

INT8_TARGET_KEY = "minreal.int8_target"
"""Metadata key (``metadata_props``) of every INT8 file minreal writes: its explicit ``--quant-target`` (``cpu-vnni``,
``cpu-avx2``, ``arm64``, ``tensorrt``). ONNX Runtime sessions of an ``arm64`` file run the graph ONNX Runtime builds
for ARM (:func:`minreal.runtime_bench.sessions.create_session`), wherever they are created."""

WEIGHT_QMAX, REDUCED_WEIGHT_QMAX = 127, 64
"""Largest weight magnitude on ONNX Runtime's symmetric int8 weight grid: full range, and ``reduce_range`` (7-bit
weights, what ``cpu-avx2`` writes and its quantisation-aware recovery trains on)."""

INTEGER_MATMUL_OP = "MatMulInteger"
"""ONNX's plain integer matrix product (uint8/int8 inputs, int32 output): what the CPU saturation probe runs."""

INTEGER_KERNEL_OPERANDS: Mapping[str, tuple[int, int, str]] = MappingProxyType({
    "QLinearConv": (0, 3, "conv"), "NhwcQLinearConv": (0, 3, "conv"), "ConvInteger": (0, 1, "conv"),
    "QLinearMatMul": (0, 3, "matmul"), "MatMulInteger": (0, 1, "matmul"), "MatMulIntegerToFloat": (0, 1, "matmul"),
    "DynamicQuantizeMatMul": (0, 1, "matmul"), "QGemm": (0, 3, "gemm"),
})  # fmt: skip
"""Integer Conv/MatMul/Gemm kernels -> (index of the activation input, index of the weight input, kind): where
their MACs are read from (``minreal.runtime_bench.node_profile.kernel_macs``)."""

FLOAT_KERNEL_OPS: frozenset[str] = frozenset(
    {"Conv", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm", "NhwcConv"}
)
"""Op types (any domain, NCHWc included) that compute Conv/MatMul/Gemm in floating point."""

FLOAT_ATTENTION_OPS: frozenset[str] = frozenset(
    {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "PackedMultiHeadAttention",
     "DecoderMaskedMultiHeadAttention", "DecoderMaskedSelfAttention", "SparseAttention"}
)  # fmt: skip
"""Fused attention kernels (ONNX's and com.microsoft's): their matrix products run in floating point whatever the
INT8 quantiser does around them (it has no integer form of them)."""

INTEGER_OPS: frozenset[str] = INTEGER_KERNEL_OPS | frozenset(
    {
        "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSigmoid",
        "QLinearLeakyRelu", "QLinearAveragePool", "QLinearSoftmax", "DynamicQuantizeLinear",
    }
)  # fmt: skip
"""Every op type (ONNX and com.microsoft) that executes an integer kernel: the integer Conv/MatMul/Gemm
kernels plus element-wise, pooling and activation QLinear ops and run-time activation quantisation.
TensorRT reads none of them (it wants explicit QuantizeLinear/DequantizeLinear around float ops)."""

class FieldError(ValueError):
    """An option given wrongly to the library, in the Python API's words: the message names each field or parameter
    in backticks, bare (`` `mac_ratio` ``) or with its owner, a config class or a function
    (`` `DepthConfig.criterion` ``, `` `check_report.plan` ``), and :attr:`fields` lists their bare names, so that a
    caller with other spellings of them (the command line's flags, ``minreal.app.field_flags``) can put its own in
    their place: only a backticked mention of a listed field is such a mention.

    Parameters
    ----------
    message : str
        what is wrong and what to do.
    fields : Sequence[str]
        the fields the message names (bare names, e.g. ``("mac_ratio",)``).
    """

    def __init__(self, message: str, *, fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.fields: tuple[str, ...] = tuple(fields)


#: Terminal colour codes (some libraries colour their exception messages).
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def first_line(text: str) -> str:
    """Return the first non-blank line of ``text``, stripped and without colour codes (``""`` if none)."""
    return next((line.strip() for line in ANSI_ESCAPE.sub("", text).splitlines() if line.strip()), "")


def error_line(exc: BaseException, *, with_type: bool = False, max_chars: int | None = None) -> str:
    """One line saying what ``exc`` is about: the first line of its message.

    Parameters
    ----------
    exc : BaseException
        the exception.
    with_type : bool
        prefix the exception's type name (``"ValueError: bad shape"``).
    max_chars : int | None
        cut longer lines to this many characters (ending in ``"..."``).

    Returns
    -------
    str
        The line; the type name alone when the message is empty.
    """
    line, name = first_line(str(exc)), type(exc).__name__
    text = f"{name}: {line}" if with_type and line else (line or name)
    if max_chars is not None and len(text) > max_chars:
        return text[: max_chars - 3] + "..."
    return text


#: The model-name suffix of an INT8 file beside its fp32 source (``svd`` and ``svd.int8``); a source recovered with
#: quantisation-aware ranges and quantised afresh is ``svd.ptq`` (:data:`PTQ_SUFFIX`).
INT8_SUFFIX = ".int8"
PTQ_SUFFIX = ".ptq"


def int8_source(name: str) -> str | None:
    """The fp32 model an INT8 file was quantised from (``svd`` for ``svd.int8`` and ``svd.ptq.int8``); None for a
    name that is not an INT8 file's."""
    if not name.endswith(INT8_SUFFIX):
        return None
    return name[: -len(INT8_SUFFIX)].removesuffix(PTQ_SUFFIX)
