"""Tests for minreal.export.int8.target: ``cpu`` is resolved by one function, at the boundaries where a request meets
the machine, and an explicit target passes through everything unchanged (without asking the CPU again)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import minreal.runtime_bench.cpu as cpu_facts
from minreal.export.int8 import QuantConfig, quantize_int8, resolve_target, target_format, target_text
from minreal.export.onnx_export import ExportResult
from minreal.export.ort_format import TARGET_PLATFORMS, ort_for_target
from minreal.export.settings import AUTO_TARGET, QUANT_MODES, QUANT_TARGETS, OrtConfig
from minreal.facts import ARM64_TARGET, CPU_AVX2_TARGET, CPU_VNNI_TARGET

ROOT = Path(__file__).resolve().parents[2]
#: The installed source: the application and the three stages (benchmarks and tests are drivers on top).
SOURCES = ("minreal", "compress", "export", "runtime_bench")
#: The one function that turns ``cpu`` into a format, asking the machine (:func:`cpu_facts.cpu_int8_target`).
RESOLVER = ("export/int8/target.py", "resolve_target")
#: What reads the machine's format only to record it (a report's environment), not to resolve a request.
RECORDERS = {("runtime_bench/environment.py", "collect_environment")}
#: Where a request meets the machine, each once per call: the library's configs and entry points, and the
#: application where options become a config (everything below them receives the explicit target).
BOUNDARIES = {
    ("export/int8/config.py", "QuantConfig.resolved"),  # quantize_int8, calibrate, quantize_with_accuracy_control
    ("export/ort_format.py", "ort_for_target"),  # ort_variant and ort_copy: the converter's platform
    ("minreal/app/options.py", "recovery_config"),  # --recover-int8's format (compress, run)
    ("minreal/app/single.py", "export_single"),  # minreal export
    ("minreal/app/pipeline.py", "fill_run_dir"),  # minreal run, minreal demo
    ("minreal/app/tune/orchestrate.py", "_tune"),  # tune: on the node that measures latency (a Ray cluster's)
}
#: The library's entry points that resolve a :class:`QuantConfig`, once, before anything else reads it.
ENTRY_POINTS = {("export/int8/quantize.py", "quantize_int8"), ("export/int8/calibration.py", "calibrate"),
                ("export/accuracy_control.py", "quantize_with_accuracy_control")}


def _references(name: str, methods_only: bool = False) -> Iterator[tuple[str, str]]:
    """(file, enclosing ``Class.function``) of every use of ``name`` in :data:`SOURCES`: called or passed on, as a
    name or an attribute (only as an attribute with ``methods_only``); imports and the definition are not uses."""
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            scopes = _scopes_using(tree, name, (), methods_only)
            yield from ((str(path.relative_to(ROOT)), scope) for scope in scopes)


def _scopes_using(node: ast.AST, name: str, scope: tuple[str, ...], methods_only: bool) -> Iterator[str]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _scopes_using(child, name, (*scope, child.name), methods_only)
            continue
        as_name = isinstance(child, ast.Name) and child.id == name and not methods_only
        as_attribute = isinstance(child, ast.Attribute) and child.attr == name
        if (as_name or as_attribute) and isinstance(child.ctx, ast.Load):
            yield ".".join(scope) or "<module>"
        yield from _scopes_using(child, name, scope, methods_only)


def test_only_resolve_target_asks_the_machine_for_its_int8_format() -> None:
    users = set(_references("cpu_int8_target"))
    assert users == {RESOLVER, *RECORDERS}, users


def test_the_target_is_resolved_at_the_boundaries_only() -> None:
    callers = set(_references("resolve_target"))
    assert callers == BOUNDARIES, callers ^ BOUNDARIES
    assert set(_references("resolved", methods_only=True)) == ENTRY_POINTS  # QuantConfig.resolved()


@pytest.fixture
def machine_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any question to the machine about its INT8 format fails the test."""

    def asked(*args: object) -> str:
        raise AssertionError("the machine was asked for its INT8 format")

    monkeypatch.setattr(cpu_facts, "cpu_int8_target", asked)


def _explicit_configs() -> list[QuantConfig]:
    configs = []
    for target in (t for t in QUANT_TARGETS if t != AUTO_TARGET):
        for mode in QUANT_MODES:
            if mode == "static" or target in (CPU_VNNI_TARGET, CPU_AVX2_TARGET):  # QuantConfig refuses the others
                configs.append(QuantConfig(target=target, mode=mode))
    return configs


@pytest.mark.usefixtures("machine_not_asked")
def test_an_explicit_target_passes_through_unchanged() -> None:
    configs = _explicit_configs()
    assert {c.target for c in configs} == set(QUANT_TARGETS) - {AUTO_TARGET} and len(configs) == 6
    for config in configs:
        assert resolve_target(config.target, config.mode) == config.target
        assert config.resolved() == config and config.resolved().resolved() == config
        assert ort_for_target(OrtConfig(), config.target).target_platform == TARGET_PLATFORMS[config.target]
        assert target_text(config.target, config.target) == config.target


@pytest.mark.usefixtures("machine_not_asked")
def test_quantize_int8_writes_an_explicit_target_without_asking_the_machine(convnet_onnx: ExportResult,
                                                                           calib_images: np.ndarray,
                                                                           tmp_path: Path) -> None:
    result = quantize_int8(convnet_onnx.path, tmp_path / "q.onnx", calib_images, QuantConfig(target=CPU_AVX2_TARGET))
    assert (result.requested_target, result.target, result.weight_bits) == (CPU_AVX2_TARGET, CPU_AVX2_TARGET, 7)


@pytest.mark.parametrize(("isa", "static", "dynamic"), [
    (cpu_facts.CpuIsa("aarch64", ("asimddp", "i8mm"), "/proc/cpuinfo"), ARM64_TARGET, CPU_VNNI_TARGET),
    (cpu_facts.CpuIsa("x86_64", ("avx2",), "/proc/cpuinfo"), CPU_AVX2_TARGET, CPU_AVX2_TARGET),
    (cpu_facts.CpuIsa("x86_64", ("avx2", "avx512f", "avx512_vnni"), "/proc/cpuinfo"), CPU_VNNI_TARGET,
     CPU_VNNI_TARGET),
])  # fmt: skip
def test_cpu_is_resolved_for_the_machine(monkeypatch: pytest.MonkeyPatch, isa: cpu_facts.CpuIsa, static: str,
                                         dynamic: str) -> None:
    """ARM64: its S8S8 format, or (dynamic mode: uint8 activations at run time) cpu-vnni, as ARM's kernels do not
    saturate; x86 without VNNI: 7-bit weights; with VNNI: 8-bit."""
    monkeypatch.setattr(cpu_facts, "cpu_isa", lambda: isa)
    monkeypatch.setattr(cpu_facts, "u8s8_saturates", lambda: None)  # the flags decide
    assert (resolve_target(AUTO_TARGET), resolve_target(AUTO_TARGET, "dynamic")) == (static, dynamic)
    assert QuantConfig().resolved().target == static and QuantConfig(mode="dynamic").resolved().target == dynamic
    assert target_text(AUTO_TARGET, static) == f"cpu → {static}"


def test_below_the_boundary_an_unresolved_target_is_refused() -> None:
    with pytest.raises(ValueError, match=r"QuantConfig.target='cpu' is not resolved"):
        QuantConfig().activation()
    with pytest.raises(ValueError, match=r"QuantConfig.target='cpu' is not resolved"):
        target_format(AUTO_TARGET)
