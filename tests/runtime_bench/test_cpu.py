"""minreal.runtime_bench.cpu: the instruction sets, the measurement of ONNX Runtime's U8S8 kernel, and the CPU
format."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import minreal.runtime_bench.cpu as cpu_facts
from minreal.facts import INTEGER_MATMUL_OP
from minreal.runtime_bench.cpu import CpuIsa, cpu_int8_target, isa_difference, parse_cpuinfo
from minreal.runtime_bench.sessions import create_session

_AVX2 = CpuIsa("x86_64", ("avx2",), "/proc/cpuinfo")
_AVX512 = CpuIsa("x86_64", ("avx2", "avx512f", "avx512bw"), "/proc/cpuinfo")


@pytest.mark.parametrize(("isa", "measured", "target"), [
    (_AVX2, None, "cpu-avx2"),
    (_AVX512, None, "cpu-avx2"),  # AVX-512 without VNNI still adds pairs in int16
    (CpuIsa("x86_64", ("avx2", "avx_vnni"), "/proc/cpuinfo"), None, "cpu-vnni"),
    (CpuIsa("x86_64", ("avx2", "avx512f", "avx512bw", "avx512_vnni"), "/proc/cpuinfo"), None, "cpu-vnni"),
    (CpuIsa("x86_64", ("avx2", "amx_tile", "amx_int8"), "/proc/cpuinfo"), None, "cpu-vnni"),
    (CpuIsa("aarch64", ("asimddp",), "/proc/cpuinfo"), None, "arm64"),  # ARM: its own S8S8 format
    (CpuIsa("x86_64", (), "unknown"), None, "cpu-avx2"),  # nothing known: the format that cannot saturate
    (_AVX2, False, "cpu-vnni"),  # a measurement of ORT's kernel wins over the flags (e.g. under an emulator)
    (CpuIsa("x86_64", ("avx2", "avx512_vnni"), "/proc/cpuinfo"), True, "cpu-avx2"),
])  # fmt: skip
def test_cpu_format_follows_the_instruction_sets(isa: CpuIsa, measured: bool | None, target: str) -> None:
    assert cpu_int8_target(isa, measured) == target


def test_the_probe_reads_this_machines_kernel() -> None:
    """The ORT measurement agrees with the flags wherever the flags are known (this machine)."""
    isa, measured = cpu_facts.cpu_isa(), cpu_facts.u8s8_saturates()
    assert measured is not None
    if isa.known and isa.is_x86:
        assert measured == isa.saturates


X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx fma avx2 bmi2
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimdrdm asimddp i8mm
"""


def test_cpuinfo_flags_decide_the_cpu_format() -> None:
    """An AVX2-only EPYC gets the 7-bit format; ARM with dot product (and i8mm) the 8-bit one."""
    from minreal.runtime_bench.cpu import cpu_int8_target

    epyc = parse_cpuinfo(X86_CPUINFO, "x86_64")
    assert (epyc.flags, epyc.saturates, cpu_int8_target(epyc, None)) == (("avx2",), True, "cpu-avx2")
    arm = parse_cpuinfo(ARM_CPUINFO, "aarch64")
    assert (arm.flags, arm.saturates, cpu_int8_target(arm, None)) == (("asimddp", "i8mm"), False, "arm64")
    assert parse_cpuinfo("processor: 0\n", "x86_64").source == "unknown"


def test_isa_difference_names_each_side() -> None:
    assert isa_difference(("avx2", "avx512_vnni"), ("avx2", "avx512_vnni")) == ""
    assert isa_difference(("avx2", "avx512_vnni"), ("avx2", "amx_int8")) == ("avx512_vnni only in the baseline; "
                                                                            "amx_int8 only in the report")


def _int_matmul(weight: np.ndarray) -> object:
    """A session computing ``a @ weight`` for a (1, K) uint8 ``a`` and an int8 ``weight`` (K, 1), in int32."""
    graph = helper.make_graph(
        [helper.make_node(INTEGER_MATMUL_OP, ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])], [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return create_session(model.SerializeToString(), threads=1)


@pytest.mark.parametrize("k", [2, 64, 256])
def test_seven_bit_weights_never_saturate_and_eight_bit_ones_only_where_measured(k: int) -> None:
    """The premise of cpu-avx2, checked on this machine's kernel: uint8 255 times 7-bit weights (64, -64) gives the
    exact int32 sum on any CPU; 8-bit weights (127) give it exactly when the kernel does not saturate."""
    a = np.full((1, k), 255, dtype=np.uint8)
    for w, exact_anywhere in ((64, True), (-64, True), (127, False)):
        (y,) = _int_matmul(np.full((k, 1), w, dtype=np.int8)).run(None, {"a": a})
        exact = int(y[0, 0]) == k * 255 * w
        assert exact if exact_anywhere else exact == (not cpu_facts.kernel_saturates())
