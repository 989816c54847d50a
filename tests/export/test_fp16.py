"""FP16 copies (minreal.export.fp16): conversion, float16-derived parity tolerances, what ORT's CPU provider runs in
fp16."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from minreal.export.errors import ParityError, SameFileError
from minreal.export.fp16 import (
    FP16_EPS,
    FP16_RTOL,
    Fp16Config,
    convert_fp16,
    fp16_atol,
    fp16_parity,
    fp16_path,
    kernel_precisions,
)
from minreal.export.settings import VariantConfig
from minreal.export.variant import PARITY_BATCH_SIZES, export_variant, fp16_variant, parity_inputs
from minreal.export.verify import feeds_of


class Block(nn.Module):
    """LayerNorm → Linear → GELU → Linear → softmax: the transformer ops of the brief in one small graph."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc, self.out = nn.LayerNorm(16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.out(nn.functional.gelu(self.fc(self.norm(x)))), -1)


def _exported(module: nn.Module, x: torch.Tensor, folder: Path, name: str = "model") -> Path:
    out = folder / f"{name}.onnx"
    export_variant(module, x, out, VariantConfig())
    return out


@pytest.fixture(scope="module")
def export_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the exports made once per module, which tests copy into their own folder."""
    return tmp_path_factory.mktemp("exports")


@pytest.fixture
def mlp_onnx(tiny_mlp: nn.Module, export_cache: Path, tmp_path: Path) -> Path:
    """``tmp_path / "model.onnx"``: conftest's tiny_mlp as :func:`_exported` writes it (exported once per module,
    then copied; the global random state after this fixture is tiny_mlp's, as before)."""
    cached = export_cache / "model.onnx"
    if not cached.exists():
        _exported(tiny_mlp, torch.randn(24, 12, generator=torch.Generator().manual_seed(0)), export_cache)
    return Path(shutil.copy(cached, tmp_path / "model.onnx"))


def _feeds(x: torch.Tensor) -> list[np.ndarray]:
    return [feeds_of(b) for b in parity_inputs(x)]


def _elem_types(values: list[onnx.ValueInfoProto]) -> set[int]:
    return {v.type.tensor_type.elem_type for v in values}


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_fp16_copy_of_mlp_and_cnn_passes_parity_on_cpu(kind: str, tiny_mlp: nn.Module, tiny_cnn: nn.Module,
                                                       tmp_path: Path) -> None:
    module, x = (tiny_mlp, torch.randn(24, 12)) if kind == "mlp" else (tiny_cnn, torch.randn(24, 3, 12, 12))
    src = _exported(module, x, tmp_path)
    result = convert_fp16(src, _feeds(x))
    out = Path(result.out_path)
    assert out == tmp_path / "model.fp16.onnx" == fp16_path(src) and out.exists()
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)  # topologically sorted, types consistent
    assert _elem_types(list(model.graph.input)) == _elem_types(list(model.graph.output)) == {TensorProto.FLOAT}
    floats = {t.data_type for t in model.graph.initializer} - {TensorProto.INT64}  # (Reshape's shape stays int64)
    assert floats == {TensorProto.FLOAT16}
    assert result.node_counts["Cast"] == 2 and result.nodes_fp16 == result.nodes_fp32 + 2  # one per input/output
    assert result.size_fp16_bytes < 0.7 * result.size_fp32_bytes  # weights halved
    parity = result.parity
    assert parity.status == "passed" and parity.passed and parity.batch_sizes == list(PARITY_BATCH_SIZES)
    # the error is float16 rounding (well above float32's), and inside the tolerance
    assert 2**-14 < parity.max_scaled_err < FP16_RTOL
    assert len(parity.checks) == len(PARITY_BATCH_SIZES) and all(c.passed for c in parity.checks)
    assert not list(tmp_path.glob(".*tmp*"))  # nothing left of the staging


def test_fp16_io_takes_and_returns_float16(mlp_onnx: Path) -> None:
    x = torch.randn(24, 12)
    result = convert_fp16(mlp_onnx, _feeds(x), config=Fp16Config(keep_io_types=False))
    model = onnx.load(result.out_path)
    assert _elem_types(list(model.graph.input)) == _elem_types(list(model.graph.output)) == {TensorProto.FLOAT16}
    assert "Cast" not in result.node_counts and not result.keep_io_types
    assert result.parity.passed  # inputs rounded to float16 too, still inside the float16 tolerance


def test_tolerance_is_float16_epsilon_scaled_by_the_output() -> None:
    assert FP16_EPS == 2**-10 and FP16_RTOL == 10 * 2**-10
    ref = np.array([[0.5, -3.0], [1e-6, 2.0]], np.float32)
    assert fp16_atol(ref) == pytest.approx(FP16_RTOL * 3.0)  # the output's scale, not each element's
    assert fp16_atol(10 * ref) == pytest.approx(10 * fp16_atol(ref))
    assert fp16_atol(np.zeros(3, np.float32)) == pytest.approx(FP16_RTOL * 2**-14)  # float16's smallest normal
    # given the FP16 output, a mask constant it reproduces exactly (-6e4 beside outputs of 3) is not the scale
    masked = np.array([[0.5, -3.0, -6e4, -6e4]], np.float32)
    got = masked + np.array([[1e-3, -1e-3, 0.0, 0.0]], np.float32)
    assert fp16_atol(masked) == pytest.approx(FP16_RTOL * 6e4)
    assert fp16_atol(masked, got=got) == pytest.approx(FP16_RTOL * 3.0)


def _corrupt_largest_weight(path: Path, out: Path) -> float:
    """Flip the sign of the largest float16 weight of ``path`` into ``out``; return its magnitude."""
    model = onnx.load(str(path))
    weights = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT16 and len(t.dims) == 2]
    tensor = max(weights, key=lambda t: np.abs(numpy_helper.to_array(t)).max())
    array = numpy_helper.to_array(tensor).copy()
    i = np.unravel_index(np.abs(array).argmax(), array.shape)
    array[i] = -array[i]
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    onnx.save(model, str(out))
    return float(abs(array[i]))


def test_a_corrupted_fp16_weight_fails_parity(mlp_onnx: Path, tmp_path: Path) -> None:
    x = torch.randn(24, 12)
    src = mlp_onnx
    good = convert_fp16(src, _feeds(x))
    bad_file = tmp_path / "corrupt.onnx"
    _corrupt_largest_weight(Path(good.out_path), bad_file)
    bad = fp16_parity(src, bad_file, _feeds(x))
    assert good.parity.passed and bad.passed is False and bad.status == "failed"
    failing = [c for c in bad.checks if not c.passed]
    assert failing and all(c.worst_measured > c.worst_allowed for c in failing)
    assert bad.max_scaled_err > 10 * good.parity.max_scaled_err  # far outside what rounding did


def test_weights_beyond_float16_range_fail_and_nothing_is_written(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3)).eval()
    with torch.no_grad():
        net[0].weight[0, 0] = 1e5  # float16 tops out at 65504: the converter clamps it
    x = torch.randn(24, 4)
    src = _exported(net, x, tmp_path)
    with pytest.raises(ParityError, match="differs from the fp32 file") as info:
        convert_fp16(src, _feeds(x))
    assert info.value.result.passed is False
    assert not fp16_path(src).exists() and not list(tmp_path.glob(".*tmp*"))


def test_activations_beyond_float16_range_fail_even_where_cpu_computes_in_fp32(tmp_path: Path) -> None:
    """Weights in range, an intermediate of about 2e5: real fp16 gives inf there, ORT's CPU provider (fp32 behind
    casts) would not show it in the outputs, so the fp32 activations are checked against 65504."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    with torch.no_grad():
        net[0].weight.fill_(500.0)
        net[0].bias.fill_(0.0)
        net[2].weight.fill_(1e-3)
    x = torch.full((24, 4), 100.0) + torch.randn(24, 4)  # hidden units near 4 * 100 * 500 = 2e5
    src = _exported(net, x, tmp_path)
    with pytest.raises(ParityError, match=r"reaches .* beyond float16's 65504") as info:
        convert_fp16(src, _feeds(x))
    assert info.value.result.passed is False and not fp16_path(src).exists()


def test_multi_output_graph_checks_every_output(two_heads: nn.Module, tmp_path: Path) -> None:
    x = torch.randn(24, 10)
    result = convert_fp16(_exported(two_heads, x, tmp_path), _feeds(x))
    assert len({c.output for c in result.parity.checks}) == 2
    assert len(result.parity.checks) == 2 * len(PARITY_BATCH_SIZES) and result.parity.passed


def test_cpu_runs_layer_norm_in_fp16_and_the_rest_in_fp32(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(24, 16)
    src = _exported(Block().eval(), x, tmp_path)
    fp32 = kernel_precisions(src)
    assert fp32["float16"] == {} and fp32["float32"]
    result = convert_fp16(src, _feeds(x))
    precisions = result.provider_precisions
    assert result.parity.passed and result.node_counts.get("LayerNormalization") == 1
    assert precisions["float16"].get("LayerNormalization") == 1  # ORT's CPU provider has a float16 kernel for it
    assert precisions["float32"]  # ...and wraps others in Casts to float32 (Gemm, Erf, Softmax's parts on x86)
    assert precisions == kernel_precisions(result.out_path)


def _bias_add_model(path: Path) -> None:
    """A graph with com.microsoft BiasAdd, which ORT implements for CUDA only."""
    shape = [None, 4, 8]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "skip")]
    bias = numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "bias")
    node = helper.make_node("BiasAdd", ["x", "bias", "skip"], ["y"], domain="com.microsoft", name="bias_add")
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [bias])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                      helper.make_opsetid("com.microsoft", 1)]), str(path))


def test_a_model_cpu_cannot_run_is_written_but_marked_not_checked(tmp_path: Path) -> None:
    src = tmp_path / "gpu_only.onnx"
    _bias_add_model(src)
    rng = np.random.default_rng(0)
    feeds = [{n: rng.standard_normal((b, 4, 8)).astype(np.float32) for n in ("x", "skip")} for b in (1, 16)]
    result = convert_fp16(src, feeds)
    assert result.parity.status.startswith("not checked on CPU: ") and "BiasAdd" in result.parity.status
    assert result.parity.passed is None and not result.parity.checked and result.parity.checks == []
    assert result.provider_precisions == {} and Path(result.out_path).exists()
    assert ".tmp" not in result.parity.status  # names the files, not the staging folder


def test_keep_fp32_nodes_leaves_them_in_float32(mlp_onnx: Path, tmp_path: Path) -> None:
    x = torch.randn(24, 12)
    src = mlp_onnx
    first = onnx.load(str(src)).graph.node[0]
    result = convert_fp16(src, _feeds(x), config=Fp16Config(keep_fp32_nodes=(first.name,)))
    model = onnx.load(result.out_path)
    kept = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    assert result.fp32_nodes == {first.op_type: 1} and set(first.input[1:]) <= kept
    with pytest.raises(ValueError, match="keep_fp32_nodes"):
        convert_fp16(src, _feeds(x), tmp_path / "other.onnx", Fp16Config(keep_fp32_nodes=("no_such_node",)))


def test_refuses_to_overwrite_its_input_and_bad_options(mlp_onnx: Path) -> None:
    x = torch.randn(24, 12)
    src = mlp_onnx
    before = src.read_bytes()
    with pytest.raises(SameFileError):
        convert_fp16(src, _feeds(x), src)
    assert src.read_bytes() == before
    with pytest.raises(ValueError, match="two or more batch sizes"):
        convert_fp16(src, [feeds_of(x), feeds_of(x)])
    with pytest.raises(ValueError, match="Fp16Config.provider"):
        Fp16Config(provider="gpu")
    with pytest.raises(ValueError, match="Fp16Config.rtol"):
        Fp16Config(rtol=0.0)


def test_fp16_variant_record(tiny_cnn: nn.Module, tmp_path: Path) -> None:
    x = torch.randn(24, 3, 12, 12)
    record = export_variant(tiny_cnn, x, tmp_path / "small.onnx", VariantConfig(), "small", "svd")
    half = fp16_variant(record, tmp_path, x, VariantConfig())
    assert (half.label, half.method, half.onnx) == ("small.fp16", "svd+fp16", "small.fp16.onnx")
    assert (half.params, half.macs) == (record.params, record.macs)
    assert half.onnx_bytes == (tmp_path / "small.fp16.onnx").stat().st_size < record.onnx_bytes
    assert half.fp16["fp32_path"] == "small.onnx" and half.fp16["parity"]["status"] == "passed"
    assert half.tensorrt_readiness and half.quantization == {}


def test_external_data_is_converted_and_published_beside_the_graph(mlp_onnx: Path, tmp_path: Path) -> None:
    from minreal.export.onnx_files import data_files, externalize

    x = torch.randn(24, 12)
    src = mlp_onnx
    externalize(src)
    result = convert_fp16(src, _feeds(x))
    out = Path(result.out_path)
    assert data_files(out) == [tmp_path / "model.fp16.onnx.data"] and result.parity.passed
    assert result.size_fp16_bytes == out.stat().st_size + (tmp_path / "model.fp16.onnx.data").stat().st_size
    assert result.size_fp16_bytes < 0.7 * result.size_fp32_bytes


def test_fp16_tolerance_reads_the_largest_finite_magnitude() -> None:
    """An inf in the fp32 reference made every FP16 tolerance infinite (anything passed) and a NaN made it NaN
    (nothing passed): the scale is the largest finite magnitude."""
    from minreal.export.fp16 import FP16_RTOL, fp16_atol

    reference = np.array([1.0, -4.0, np.inf, np.nan, 2.0], dtype=np.float32)
    assert fp16_atol(reference) == FP16_RTOL * 4.0
    assert fp16_atol(np.array([np.nan], dtype=np.float32)) == FP16_RTOL * float(np.finfo(np.float16).tiny)
