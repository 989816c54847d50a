"""Quantisation-aware recovery end to end: the INT8 export writes the trained ranges, and ORT's INT8 model computes
what the fake-quantised torch model computed."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from minreal.compress.core.data import Dataset
from minreal.compress.core.qat import fake_quant
from minreal.compress.core.recover import RecoveryResult, recover
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.datasets import digits
from minreal.compress.models import small_cnn
from minreal.export.errors import QuantizationError
from minreal.export.int8 import QuantConfig, module_inputs, quantize_int8, resolve_target
from minreal.export.settings import VariantConfig
from minreal.export.variant import export_variant

#: The CPU format this machine needs (cpu-avx2 where ONNX Runtime's U8S8 kernel saturates): the INT8 file's
#: outputs can then be compared with the fake-quantised model on any x86 CPU.
CPU_TARGET = resolve_target("cpu")


@dataclass
class Recovered:
    model: nn.Module
    result: RecoveryResult
    onnx: Path
    test: Dataset
    calib: np.ndarray


@pytest.fixture(scope="module")
def digits_data() -> tuple[Dataset, Dataset]:
    return digits()


@pytest.fixture(scope="module")
def teacher(digits_data: tuple[Dataset, Dataset]) -> nn.Module:
    torch.manual_seed(0)
    net = small_cnn(1, (8, 16, 16), 10)
    train(net, digits_data[0], None, TrainConfig(epochs=3))
    return net.eval()


def _recovered(teacher: nn.Module, data: tuple[Dataset, Dataset], target: str, folder: Path) -> Recovered:
    student = copy.deepcopy(teacher)
    result = recover(teacher, student, data[0], RecoveryConfig(epochs=1, int8=target))
    path = folder / f"qat_{target}.onnx"
    export_variant(student, data[1].x, path, VariantConfig())
    return Recovered(student, result, path, data[1], data[0].x[:256].numpy())


@pytest.fixture(scope="module")
def cpu(teacher: nn.Module, digits_data: tuple[Dataset, Dataset], tmp_path_factory: pytest.TempPathFactory
        ) -> Recovered:
    return _recovered(teacher, digits_data, CPU_TARGET, tmp_path_factory.mktemp("qat"))


def _written(path: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Tensor → (scale, zero point) of the QuantizeLinear quantising it."""
    model = onnx.load(str(path))
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.input[0]: (values[n.input[1]], values[n.input[2]]) for n in model.graph.node
            if n.op_type == "QuantizeLinear"}


def _check_trained_parameters_written(rec: Recovered, int8_path: str, dtype: type) -> None:
    inputs = module_inputs(onnx.load(str(rec.onnx)), rec.result.activation_ranges)
    written = _written(int8_path)
    assert set(inputs) == set(rec.result.activation_ranges)
    for name, r in rec.result.activation_ranges.items():
        (tensor,) = inputs[name]
        scale, zero = written[tensor]
        assert scale == np.float32(r["scale"]) and zero == r["zero_point"] and zero.dtype == dtype


def test_recovery_returns_the_ranges_of_every_conv_and_linear(cpu: Recovered) -> None:
    layers = [n for n, m in cpu.model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert sorted(cpu.result.activation_ranges) == sorted(layers) and cpu.result.int8_target == CPU_TARGET
    assert cpu.result.epochs == 1 and cpu.result.steps > 0
    arm = CPU_TARGET == "arm64"  # cpu on an ARM64 CPU: symmetric int8 activations (S8S8)
    assert all((r["dtype"], r["symmetric"]) == (("int8", True) if arm else ("uint8", False))
               for r in cpu.result.activation_ranges.values())
    assert not any(k.startswith("qat") or "qat_" in k for k in cpu.model.state_dict())


def test_int8_export_writes_exactly_the_trained_scales_and_zero_points(cpu: Recovered, tmp_path: Path) -> None:
    q = quantize_int8(cpu.onnx, tmp_path / "qat.int8.onnx", cpu.calib, QuantConfig(target=CPU_TARGET),
                      cpu.result.activation_ranges)
    assert (q.range_source, q.trained_ranges, q.untrained_modules) == ("trained", 4, [])
    _check_trained_parameters_written(cpu, q.out_path, np.uint8)
    session = ort.InferenceSession(q.out_path, providers=["CPUExecutionProvider"])
    int8 = session.run(None, {session.get_inputs()[0].name: cpu.test.x.numpy()})[0].argmax(1)
    with fake_quant(cpu.model, CPU_TARGET, ranges=cpu.result.activation_ranges), torch.no_grad():
        simulated = cpu.model.eval()(cpu.test.x).argmax(1).numpy()
    assert (int8 == simulated).mean() >= 0.95


def test_post_training_copy_calibrates_instead(cpu: Recovered, tmp_path: Path) -> None:
    q = quantize_int8(cpu.onnx, tmp_path / "ptq.int8.onnx", cpu.calib, QuantConfig(target=CPU_TARGET))
    assert (q.range_source, q.trained_ranges, q.untrained_modules) == ("calibrated", 0, [])


def test_a_renamed_weight_is_found_by_its_values(cpu: Recovered, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    model = onnx.load(str(cpu.onnx))
    (gemm,) = [n for n in model.graph.node if n.op_type == "Gemm"]
    (init,) = [t for t in model.graph.initializer if t.name == gemm.input[1]]
    init.name = gemm.input[1] = "renamed_by_an_exporter"
    onnx.save(model, tmp_path / "renamed.onnx")
    ranges, config = cpu.result.activation_ranges, QuantConfig(target=CPU_TARGET)
    blind = quantize_int8(tmp_path / "renamed.onnx", tmp_path / "a.onnx", cpu.calib, config, ranges)
    assert blind.untrained_modules == ["11"] and blind.trained_ranges == 3 and "are not in the graph" in caplog.text
    weights = {"11": cpu.model[11].weight.detach().numpy()}
    found = quantize_int8(tmp_path / "renamed.onnx", tmp_path / "b.onnx", cpu.calib, config, ranges, weights)
    assert found.untrained_modules == [] and found.trained_ranges == 4


def test_ranges_of_another_format_are_refused(cpu: Recovered, tmp_path: Path) -> None:
    with pytest.raises(QuantizationError, match=r"trained for uint8 asymmetric .* writes int8 symmetric") as info:
        quantize_int8(cpu.onnx, tmp_path / "q.onnx", cpu.calib, QuantConfig(target="tensorrt"),
                      cpu.result.activation_ranges)
    assert "\n" not in str(info.value) and not (tmp_path / "q.onnx").exists()


def test_seven_bit_recovery_matches_its_int8_file(teacher: nn.Module, digits_data: tuple[Dataset, Dataset],
                                                 tmp_path: Path) -> None:
    """cpu-avx2: recovery fake-quantises weights on ORT's reduce_range grid ([-64, 64], scale max|w|/64); the 7-bit
    INT8 file (which cannot saturate on any CPU) agrees with the simulation, and every weight is on that grid."""
    rec = _recovered(teacher, digits_data, "cpu-avx2", tmp_path)
    q = quantize_int8(rec.onnx, tmp_path / "avx2.int8.onnx", rec.calib, QuantConfig(target="cpu-avx2"),
                      rec.result.activation_ranges)
    assert (q.weight_bits, q.range_source, q.trained_ranges) == (7, "trained", 4)
    session = ort.InferenceSession(q.out_path, providers=["CPUExecutionProvider"])
    int8 = session.run(None, {session.get_inputs()[0].name: rec.test.x.numpy()})[0].argmax(1)
    with fake_quant(rec.model, "cpu-avx2", ranges=rec.result.activation_ranges), torch.no_grad():
        simulated = rec.model.eval()(rec.test.x).argmax(1).numpy()
    assert (int8 == simulated).mean() >= 0.95


def test_ranges_trained_on_the_other_weight_grid_are_refused(cpu: Recovered, tmp_path: Path) -> None:
    """Ranges trained with 8-bit weights (cpu-vnni) do not go into a 7-bit (cpu-avx2) file, nor the other way."""
    other = "cpu-vnni" if CPU_TARGET == "cpu-avx2" else "cpu-avx2"
    assert {r["weight_qmax"] for r in cpu.result.activation_ranges.values()} == {64 if CPU_TARGET == "cpu-avx2"
                                                                                 else 127}
    with pytest.raises(QuantizationError, match=r"trained with weights on \[-\d+, \d+\] but target") as info:
        quantize_int8(cpu.onnx, tmp_path / "q.onnx", cpu.calib, QuantConfig(target=other),
                      cpu.result.activation_ranges)
    assert "\n" not in str(info.value) and not (tmp_path / "q.onnx").exists()


def test_tensorrt_ranges_are_symmetric_int8_with_zero_point_0(teacher: nn.Module, digits_data: tuple[Dataset, Dataset],
                                                              tmp_path: Path) -> None:
    rec = _recovered(teacher, digits_data, "tensorrt", tmp_path)
    assert all((r["dtype"], r["symmetric"], r["zero_point"]) == ("int8", True, 0)
               for r in rec.result.activation_ranges.values())
    q = quantize_int8(rec.onnx, tmp_path / "trt.int8.onnx", rec.calib, QuantConfig(target="tensorrt"),
                      rec.result.activation_ranges)
    assert q.trained_ranges == 4
    _check_trained_parameters_written(rec, q.out_path, np.int8)
