"""Export, parity and INT8 of models with several named inputs and a dynamic sequence axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from minreal.compress.core.inputs import NamedInputs
from minreal.export.errors import CalibrationError
from minreal.export.int8 import QuantConfig, quantize_int8
from minreal.export.onnx_export import ExportResult, to_onnx
from minreal.export.settings import VariantConfig
from minreal.export.variant import PARITY_BATCH_SIZES, export_variant, parity_inputs, quantize_variant
from minreal.runtime_bench.sessions import create_session

SEQ = {"input_ids": {1: "seq"}, "attention_mask": {1: "seq"}}


class TinyEncoder(nn.Module):
    """Token embedding, one attention layer masked by ``attention_mask``, masked mean pooling, a head."""

    def __init__(self, vocab: int = 40, d: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.head = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, 3))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        h, _ = self.attn(h, h, h, key_padding_mask=attention_mask == 0, need_weights=False)
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1))


def _tokens(n: int, seq: int, seed: int = 0) -> NamedInputs:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, seq, dtype=torch.int64)
    mask[::3, -seq // 4:] = 0  # padded rows
    return NamedInputs({"input_ids": torch.randint(0, 40, (n, seq), generator=g), "attention_mask": mask})


@pytest.fixture(scope="module")
def encoder() -> nn.Module:
    torch.manual_seed(0)
    return TinyEncoder().eval()


@pytest.fixture(scope="module")
def exported(encoder: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExportResult]:
    """The encoder exported once with a dynamic sequence axis (from 48 sequences of 16 tokens), shared by the
    tests that only read the file."""
    path = tmp_path_factory.mktemp("named") / "enc.onnx"
    return path, to_onnx(encoder, _tokens(48, 16), path, dynamic_axes=SEQ)


def test_graph_inputs_are_named_and_share_the_sequence_dimension(encoder: nn.Module,
                                                                 exported: tuple[Path, ExportResult]) -> None:
    path, result = exported
    assert result.input_names == ["input_ids", "attention_mask"]
    graph = onnx.load(str(path))
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    assert dims == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    session = create_session(path)
    for seq in (5, 21):  # lengths the export never saw
        x = _tokens(3, seq, seed=seq)
        got = session.run(None, x.numpy())[0]
        with torch.no_grad():
            want = encoder(*x.args()).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axes, message", [
    ({"ids": {1: "seq"}}, "unknown input"),
    ({"input_ids": {1: "seq"}, "attention_mask": {0: "batch", 1: "seq2"}}, None),
])
def test_axis_names_are_checked(encoder: nn.Module, tmp_path: Path, axes: dict, message: str | None) -> None:
    if message is None:  # two names for one length are allowed (two dimensions that happen to agree here)
        assert to_onnx(encoder, _tokens(2, 6), tmp_path / "a.onnx", dynamic_axes=axes).dynamic_axes["attention_mask"]
        return
    with pytest.raises(ValueError, match=message):
        to_onnx(encoder, _tokens(2, 6), tmp_path / "a.onnx", dynamic_axes=axes)


def test_one_dimension_name_means_one_size(tmp_path: Path) -> None:
    class Two(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a.sum(1) + b.sum(1)

    x = NamedInputs({"a": torch.randn(2, 4), "b": torch.randn(2, 6)})
    with pytest.raises(ValueError, match="one name means one size"):
        to_onnx(Two(), x, tmp_path / "t.onnx", dynamic_axes={"a": {1: "n"}, "b": {1: "n"}})


def test_parity_inputs_cover_two_lengths_of_every_dynamic_axis() -> None:
    x = _tokens(4, 12)
    checks = parity_inputs(x, {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
    shapes = [(len(c), c.tensors["input_ids"].shape[1], c.tensors["attention_mask"].shape[1]) for c in checks]
    assert shapes == [(PARITY_BATCH_SIZES[0], 12, 12), (PARITY_BATCH_SIZES[1], 12, 12), (PARITY_BATCH_SIZES[1], 6, 6)]
    assert len(parity_inputs(x, {"input_ids": {0: "batch"}})) == len(PARITY_BATCH_SIZES)


def test_export_variant_verifies_at_two_lengths_and_int8_calibrates_by_name(encoder: nn.Module,
                                                                           tmp_path: Path) -> None:
    x = _tokens(48, 16)
    record = export_variant(encoder, x, tmp_path / "enc.onnx", VariantConfig(), dynamic_axes=SEQ)
    assert record.parity["batch_sizes"] == [*PARITY_BATCH_SIZES, PARITY_BATCH_SIZES[-1]] and record.parity["passed"]
    q = quantize_variant(record, tmp_path, x, VariantConfig())
    assert q.quantization["calibration_samples"] == 48 and q.quantization["integer_kernels"] > 0
    session = create_session(tmp_path / q.onnx)
    out = session.run(None, _tokens(5, 9).numpy())[0]  # the INT8 file keeps the dynamic sequence axis
    assert out.shape == (5, 3) and np.isfinite(out).all()


def test_random_calibration_refuses_integer_inputs(encoder: nn.Module, tmp_path: Path) -> None:
    to_onnx(encoder, _tokens(2, 8), tmp_path / "enc.onnx", dynamic_axes=None)
    with pytest.raises(CalibrationError, match="out of range"):
        quantize_int8(tmp_path / "enc.onnx", tmp_path / "q.onnx", None, QuantConfig(allow_random_calibration=True))
    with pytest.raises(CalibrationError, match="by input name"):
        quantize_int8(tmp_path / "enc.onnx", tmp_path / "q.onnx", np.zeros((4, 8), np.int64), QuantConfig())


def _nonfinite_scales(path: Path) -> list[str]:
    model = onnx.load(str(path))
    return [i.name for i in model.graph.initializer
            if i.name.endswith("scale") and not np.isfinite(numpy_helper.to_array(i)).all()]


def test_int8_leaves_the_infinite_mask_path_in_float(exported: tuple[Path, ExportResult], tmp_path: Path) -> None:
    """The key padding mask is 0/-inf: a calibrated range over it has an infinite scale, which flattens every
    attention row it touches. quantize_int8 must leave those nodes in float and keep the INT8 model close to fp32."""
    x = _tokens(48, 16)
    fp32, _ = exported
    result = quantize_int8(fp32, tmp_path / "q.onnx", x.numpy(), QuantConfig())
    assert result.nonfinite_nodes and set(result.nonfinite_nodes) <= set(result.excluded_nodes)
    assert _nonfinite_scales(tmp_path / "q.onnx") == []
    feed = _tokens(30, 12, seed=1).numpy()
    ref = create_session(fp32).run(None, feed)[0]
    out = create_session(tmp_path / "q.onnx").run(None, feed)[0]
    # Masked rows (every third) must differ from unmasked ones as in fp32; INT8 error well below the signal.
    assert np.abs(out - ref).max() < 0.1 * np.abs(ref).max()
