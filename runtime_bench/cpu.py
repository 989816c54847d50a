"""The CPU's instruction sets that decide ONNX Runtime's int8 kernels, and the INT8 format that is right for them.

ONNX Runtime's CPU kernels (MLAS) multiply uint8 activations by int8 weights ("U8S8"). On x86-64 without VNNI they
use ``VPMADDUBSW``, which adds two u8·s8 products into a *saturating* int16: with 8-bit weights a pair can reach
2·255·127 = 64770 > 32767, and the result is silently clipped. With AVX-512 VNNI, AVX-VNNI or AMX the products are
accumulated in int32 (``VPDPBUSD``, AMX tiles) and nothing saturates; ARM's dot-product kernels do not saturate
either. ONNX Runtime's quantisation guide (docs/performance/model-optimizations/quantization.md) names the remedy:
``reduce_range`` (7-bit weights, [-64, 64]: a pair is at most 2·255·64 = 32640, so it cannot saturate) or U8U8.

Two sources tell which case a machine is in, both recorded in every report's environment:

- :func:`cpu_isa`: the instruction-set flags the operating system reports (``/proc/cpuinfo``; ``sysctl`` on
  macOS), the ones MLAS dispatches on;
- :func:`u8s8_saturates`: a measurement of the installed ONNX Runtime itself — one ``MatMulInteger`` whose exact
  result no saturating kernel can produce (it also tells the truth where the flags cannot be read, or under an
  emulator that reports the host's flags).

:func:`cpu_int8_target` turns them into the ``--quant-target`` that ``cpu`` means on this machine (on an ARM64 CPU:
``arm64``, ARM's own S8S8 format).

References
----------
.. [1] ONNX Runtime, ``docs/performance/model-optimizations/quantization.md``: U8S8 saturation without VNNI and its
       remedies (``reduce_range``, U8U8).
.. [2] ONNX Runtime, ``qdq_selector_action_transformer.h`` (``QDQIsInt8Allowed()``) and
       ``onnxruntime_session_options_config_keys.h`` (``session.qdqisint8allowed``): :data:`ARM_GRAPH_CONFIG`.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from minreal.facts import ARM64_TARGET, CPU_AVX2_TARGET, CPU_VNNI_TARGET, INTEGER_MATMUL_OP, PROVIDERS

__all__ = [
    "ISA_FLAGS",
    "CPU_TARGETS",
    "ARM_GRAPH_CONFIG",
    "CpuIsa",
    "parse_cpuinfo",
    "cpuinfo_text",
    "cpu_isa",
    "u8s8_saturates",
    "saturating_kernel",
    "kernel_saturates",
    "cpu_int8_target",
    "isa_difference",
]

#: Flags (as Linux's /proc/cpuinfo spells them) that decide ONNX Runtime's int8 kernels.
ISA_FLAGS: tuple[str, ...] = (
    "avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx_vnni_int8", "amx_tile", "amx_int8",  # x86-64
    "asimddp", "i8mm",  # arm64: dot product (SDOT/UDOT), int8 matrix multiply (SMMLA/UMMLA)
)  # fmt: skip
#: Flags whose int8 kernels accumulate in int32 without an int16 step (no U8S8 saturation).
_NON_SATURATING = frozenset({"avx512_vnni", "avx_vnni", "avx_vnni_int8", "amx_int8"})
#: The explicit CPU INT8 formats (:data:`minreal.facts.CPU_VNNI_TARGET`, ``CPU_AVX2_TARGET``).
CPU_TARGETS: tuple[str, ...] = (CPU_VNNI_TARGET, CPU_AVX2_TARGET)
#: Session config entries with which ONNX Runtime builds, on any machine, the CPU graph its ARM builds run: int8 Q/DQ
#: activations kept as int8 and fused into int8 kernels (``QDQIsInt8Allowed()`` is true only in ARM builds,
#: ``qdq_selector_action_transformer.h``; elsewhere ``QDQS8ToU8Transformer`` turns them into uint8 first). ONNX
#: Runtime documents the key for "an ORT format model for use on ARM platforms"
#: (``onnxruntime_session_options_config_keys.h``).
ARM_GRAPH_CONFIG: Mapping[str, str] = MappingProxyType({"session.qdqisint8allowed": "1"})
#: macOS ``sysctl`` keys → the Linux flag they stand for.
_SYSCTL_FLAGS = {"hw.optional.avx2_0": "avx2", "hw.optional.avx512f": "avx512f", "hw.optional.avx512bw": "avx512bw",
                 "hw.optional.avx512vnni": "avx512_vnni", "hw.optional.arm.FEAT_DotProd": "asimddp",
                 "hw.optional.arm.FEAT_I8MM": "i8mm"}


@dataclass(frozen=True)
class CpuIsa:
    """The int8-relevant instruction sets of a CPU.

    Attributes
    ----------
    arch : str
        ``platform.machine()`` (``x86_64``, ``AMD64``, ``arm64``, ``aarch64``, ...).
    flags : tuple[str, ...]
        the :data:`ISA_FLAGS` present, in that order.
    source : str
        where the flags were read (``/proc/cpuinfo``, ``sysctl``), or ``unknown`` when nowhere.
    """

    arch: str
    flags: tuple[str, ...]
    source: str

    @property
    def is_arm(self) -> bool:
        return self.arch.lower() in ("arm64", "aarch64")

    @property
    def is_x86(self) -> bool:
        return self.arch.lower() in ("x86_64", "amd64", "x64", "i386", "i686")

    @property
    def known(self) -> bool:
        return self.source != "unknown"

    @property
    def saturates(self) -> bool | None:
        """Whether ONNX Runtime's U8S8 kernels saturate here by the flags: x86 without VNNI/AMX yes, ARM no, an
        unknown machine ``None``."""
        if not self.known or not (self.is_x86 or self.is_arm):
            return None
        return self.is_x86 and not _NON_SATURATING & set(self.flags)


def parse_cpuinfo(text: str, arch: str) -> CpuIsa:
    """The :data:`ISA_FLAGS` in the first ``flags`` (x86) or ``Features`` (arm64) line of ``/proc/cpuinfo``."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            present = set(value.split())
            return CpuIsa(arch, tuple(f for f in ISA_FLAGS if f in present), "/proc/cpuinfo")
    return CpuIsa(arch, (), "unknown")


def _sysctl_flags(arch: str) -> CpuIsa:
    """Flags from macOS ``sysctl`` (each key ``1`` when present); ``unknown`` where sysctl gives none."""
    try:
        done = subprocess.run(["sysctl", *_SYSCTL_FLAGS], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return CpuIsa(arch, (), "unknown")
    values = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    if not values:
        return CpuIsa(arch, (), "unknown")
    present = {flag for key, flag in _SYSCTL_FLAGS.items() if values.get(key) == "1"}
    return CpuIsa(arch, tuple(f for f in ISA_FLAGS if f in present), "sysctl")


def cpuinfo_text() -> str | None:
    """Linux's ``/proc/cpuinfo``, or None where there is none."""
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.read_text(errors="replace") if cpuinfo.is_file() else None


@functools.cache
def cpu_isa() -> CpuIsa:
    """This machine's :class:`CpuIsa` (read once per process)."""
    arch = platform.machine()
    text = cpuinfo_text()
    if text is not None:
        return parse_cpuinfo(text, arch)
    if platform.system() == "Darwin":
        return _sysctl_flags(arch)
    return CpuIsa(arch, (), "unknown")


_PROBE_K = 64  # 32 pairs of 255·127 = 32385: each pair's sum (64770) overflows int16 in a saturating kernel


def _probe_model() -> bytes:
    """A ``MatMulInteger`` of a (1, K) uint8 input by a (K, 1) int8 weight of 127s, serialised."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((_PROBE_K, 1), 127, dtype=np.int8), "w")
    graph = helper.make_graph(
        [helper.make_node(INTEGER_MATMUL_OP, ["a", "w"], ["y"])], "u8s8_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, _PROBE_K])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


@functools.cache
def u8s8_saturates() -> bool | None:
    """Whether this machine's ONNX Runtime CPU kernel saturates a uint8 × int8 product sum (measured once per
    process: 64 products of 255·127 must sum to 2,072,640; a ``VPMADDUBSW`` kernel gives 32·32767). ``None`` when
    ONNX Runtime cannot be loaded."""
    try:
        import numpy as np

        from .runtime import onnxruntime_module

        ort = onnxruntime_module()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(_probe_model(), options, providers=[PROVIDERS["cpu"]])
        (y,) = session.run(None, {"a": np.full((1, _PROBE_K), 255, dtype=np.uint8)})
    except Exception:
        return None
    return int(y.reshape(-1)[0]) != _PROBE_K * 255 * 127


def saturating_kernel(isa: CpuIsa, measured: bool | None) -> bool:
    """Whether U8S8 with 8-bit weights can saturate on this machine: the measurement where there is one (it reads
    the kernel ONNX Runtime really dispatches), else the flags; an unknown machine counts as saturating."""
    if measured is not None:
        return measured
    return isa.saturates is not False


def kernel_saturates() -> bool:
    """Whether U8S8 with 8-bit weights can saturate on this machine (:func:`saturating_kernel` of
    :func:`cpu_isa` and :func:`u8s8_saturates`)."""
    return saturating_kernel(cpu_isa(), u8s8_saturates())


def cpu_int8_target(isa: CpuIsa | None = None, measured: bool | None = None) -> str:
    """The explicit CPU target that ``--quant-target cpu`` means for ``isa`` and the measurement ``measured`` (each
    defaults to this machine's): ``arm64`` on an ARM64 CPU (ARM's S8S8 format, which ONNX Runtime's ARM builds run as
    int8 kernels), else ``cpu-vnni`` where U8S8 cannot saturate (x86 with VNNI or AMX), else ``cpu-avx2`` (7-bit
    weights)."""
    if (cpu_isa() if isa is None else isa).is_arm:
        return ARM64_TARGET
    saturates = kernel_saturates() if isa is None and measured is None else saturating_kernel(
        cpu_isa() if isa is None else isa, measured)
    return CPU_AVX2_TARGET if saturates else CPU_VNNI_TARGET


def isa_difference(baseline: Iterable[str], report: Iterable[str]) -> str:
    """``""`` when the flag sets are equal, else which flags only one side has (for ``check --baseline``)."""
    then, now = set(baseline), set(report)
    parts = [f"{', '.join(f for f in ISA_FLAGS if f in side - other)} only in the {name}"
             for name, side, other in (("baseline", then, now), ("report", now, then)) if side - other]
    return "; ".join(parts)
