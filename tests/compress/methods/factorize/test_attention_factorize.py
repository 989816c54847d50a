"""Attention projections are factorisable: nn.MultiheadAttention is unfused first, so its q/k/v/out projections
are targets like any Linear; at full rank the model is reproduced, truncation errors are the spectral tails
(Eckart–Young, plain and whitened), and the compressed model passes ONNX Runtime parity."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.attention import PlainAttention
from minreal.compress.core.data import Dataset
from minreal.compress.core.lowrank import matrix_view
from minreal.compress.core.lowrank_plan import apply_factors, factorisable_model, find_targets
from minreal.compress.core.report import CompressionReport
from minreal.compress.methods.factorize import FactorizeConfig, layer_bases
from minreal.compress.methods.factorize.method import _factors
from minreal.compress.methods.svd import SVDConfig
from minreal.export.onnx_export import to_onnx
from minreal.export.verify import verify_parity

E, TOKENS, FEATURES = 16, 5, 6
LAYERS = ("encoder.layers.0.self_attn", "encoder.layers.1.self_attn")
PROJECTIONS = {f"{a}.{p}" for a in LAYERS for p in PlainAttention.PROJECTIONS}


class _Encoder(nn.Module):
    """Token embedding, two torch transformer encoder layers (batch first) and a pooled classifier head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, E)
        layer = nn.TransformerEncoderLayer(E, 4, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(E, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


def _encoder(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = _Encoder().to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.3)  # non-trivial biases and norm scales
    return model


def _data(dtype: torch.dtype = torch.float32, n: int = 40) -> Dataset:
    return Dataset(torch.randn(n, TOKENS, FEATURES, generator=torch.Generator().manual_seed(1)).to(dtype))


def _layer_input(model: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    seen = []
    handle = model.get_submodule(name).register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    with torch.no_grad():
        model(x)
    handle.remove()
    return seen[0]


def test_attention_projections_are_targets() -> None:
    model, data = _encoder(), _data()
    unfused = factorisable_model(model, data.x[:4])
    assert unfused.unfused == list(LAYERS) and not unfused.refused
    targets, skipped, _ = find_targets(unfused.model, data.x[:4])
    assert PROJECTIONS <= {t.name for t in targets} and not skipped
    assert all(type(m) is nn.MultiheadAttention for n, m in model.named_modules() if n in LAYERS)  # untouched


@pytest.mark.parametrize("method,config", [("factorize", FactorizeConfig(rank_fraction=0.25)),
                                           ("svd", SVDConfig(rank_fraction=0.25))])
def test_report_marks_the_layers_that_came_from_attention(method: str, config) -> None:
    _, report = compress(_encoder(), _data(), method, config)
    marked = {lr.name: lr.details["attention"] for lr in report.layers if "attention" in lr.details}
    assert marked == {name: name.rpartition(".")[0] for name in PROJECTIONS}
    assert all(lr.action == "factorized" for lr in report.layers if lr.name in PROJECTIONS)
    assert any("rewritten as PlainAttention" in note and all(a in note for a in LAYERS) for note in report.notes)


def test_full_rank_reproduces_the_model() -> None:
    """Every target (attention projections included) at full rank: each layer and the whole original model
    (with its fused attention) are reproduced in float64."""
    model, data = _encoder(torch.float64), _data(torch.float64)
    plain = factorisable_model(model, data.x[:4]).model
    targets, _, _ = find_targets(plain, data.x[:4])
    bases = layer_bases(plain, data, targets, FactorizeConfig(stats_dtype="float64"),
                        CompressionReport("factorize", {}))
    full = {t.name: matrix_view(t.layer).max_rank for t in targets}
    new = apply_factors(plain, targets, _factors(targets, bases, full))
    assert all(isinstance(new.get_submodule(name), nn.Sequential) for name in PROJECTIONS)
    with torch.no_grad():
        for name in PROJECTIONS:
            x = _layer_input(plain, name, data.x)
            torch.testing.assert_close(new.get_submodule(name)(x), plain.get_submodule(name)(x), rtol=1e-10,
                                       atol=1e-10)
        torch.testing.assert_close(new(data.x), model(data.x), rtol=1e-10, atol=1e-10)


def test_whitened_truncation_error_is_the_tail_on_attention_layers() -> None:
    """factorize: the measured output distortion of each factorised projection on the calibration data equals
    the tail of its whitened spectrum (Eckart–Young on W·M^½)."""
    model, data = _encoder(torch.float64), _data(torch.float64)
    new, report = compress(model, data, "factorize",
                           FactorizeConfig(rank_fraction=0.25, stats_dtype="float64"))  # rank 4 of 16
    plain = factorisable_model(model, data.x[:4]).model
    checked = 0
    with torch.no_grad():
        for lr in (lr for lr in report.layers if lr.name in PROJECTIONS and lr.action == "factorized"):
            x = _layer_input(plain, lr.name, data.x)
            y, y_hat = plain.get_submodule(lr.name)(x), new.get_submodule(lr.name)(x)
            measured = float(((y - y_hat) ** 2).sum()) / (y.numel() // y.shape[-1])
            assert measured == pytest.approx(lr.details["predicted_distortion"], rel=1e-8, abs=1e-12)
            checked += 1
    assert checked == len(PROJECTIONS)


def test_plain_truncation_error_is_the_tail_on_attention_layers() -> None:
    """svd: ‖W − Ŵ_r‖²_F of each factorised projection equals Σ_{i>r} σ_i² of W (Eckart–Young)."""
    model, data = _encoder(torch.float64), _data(torch.float64)
    new, report = compress(model, data, "svd", SVDConfig(rank_fraction=0.25))  # rank 4 of 16
    plain = factorisable_model(model, data.x[:4]).model
    factorised = [lr for lr in report.layers if lr.name in PROJECTIONS and lr.action == "factorized"]
    assert {lr.name for lr in factorised} == PROJECTIONS
    for lr in factorised:
        w = plain.get_submodule(lr.name).weight.detach()
        first, second = new.get_submodule(lr.name)
        error = float(((w - second.weight @ first.weight) ** 2).sum())
        tail = float((torch.linalg.svdvals(w)[lr.rank:] ** 2).sum())
        assert error == pytest.approx(tail, rel=1e-9, abs=1e-12)


def test_compressed_encoder_exports_with_ort_parity(tmp_path: Path) -> None:
    """The factorised encoder (attention pairs inside PlainAttention) exports and matches ONNX Runtime at batch
    sizes 3 and 7 (rtol 1e-3, atol 1e-4)."""
    data = _data()
    new, report = compress(_encoder(), data, "factorize", FactorizeConfig(layer_mac_ratio=0.6))
    assert any(lr.action == "factorized" for lr in report.layers if lr.name in PROJECTIONS)
    path = tmp_path / "encoder.onnx"
    to_onnx(new, data.x[:2], path)
    parity = verify_parity(new, path, [data.x[:3], data.x[:7]], rtol=1e-3, atol=1e-4)
    assert parity.passed and parity.batch_sizes == [3, 7]


def test_torchvision_vit_attention_projections_are_candidates() -> None:
    """torchvision's vit_b_16 at 32×32 (4 patches, random weights): its 12 attention layers give 48 projection
    targets next to the MLP layers, and the rewritten model computes the same function."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(image_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    unfused = factorisable_model(model, x[:1])
    targets, _, _ = find_targets(unfused.model, x[:1])
    names = {t.name for t in targets}
    attention = {f"encoder.layers.encoder_layer_{i}.self_attention.{p}" for i in range(12)
                 for p in PlainAttention.PROJECTIONS}
    assert attention <= names and len(names) == len(attention) + 12 * 2 + 2  # + MLPs, patch embedding, head
    with torch.no_grad():
        torch.testing.assert_close(unfused.model(x), model(x), rtol=1e-4, atol=1e-5)


def test_small_torchvision_vit_compresses_with_ort_parity(tmp_path: Path) -> None:
    """A two-layer torchvision VisionTransformer through factorize: attention projections factorised, and the
    result matches ONNX Runtime at batch sizes 3 and 7 (rtol 1e-3, atol 1e-4)."""
    vision_transformer = pytest.importorskip("torchvision.models.vision_transformer")
    torch.manual_seed(0)
    model = vision_transformer.VisionTransformer(32, 8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
                                                 num_classes=5).eval()
    data = Dataset(torch.randn(24, 3, 32, 32, generator=torch.Generator().manual_seed(2)))
    new, report = compress(model, data, "factorize", FactorizeConfig(layer_mac_ratio=0.5))
    assert any(lr.action == "factorized" for lr in report.layers if "attention" in lr.details)
    path = tmp_path / "vit.onnx"
    to_onnx(new, data.x[:2], path)
    parity = verify_parity(new, path, [data.x[:3], data.x[:7]], rtol=1e-3, atol=1e-4)
    assert parity.passed and parity.batch_sizes == [3, 7]


def test_hugging_face_bert_projections_are_targets() -> None:
    """A tiny Hugging Face BertModel (random weights, token ids in, called directly): its attention is already
    plain Linears, found as targets without any rewrite, and factorize at full rank reproduces its output."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.BertModel(config).double().eval()
    ids = torch.randint(0, 50, (24, 6), generator=torch.Generator().manual_seed(3))
    unfused = factorisable_model(model, ids[:4])
    assert unfused.model is model and not unfused.unfused
    targets, _, _ = find_targets(model, ids[:4])
    wanted = {f"encoder.layer.{i}.attention.{p}" for i in range(2)
              for p in ("self.query", "self.key", "self.value", "output.dense")}
    assert wanted <= {t.name for t in targets}
    data = Dataset(ids)
    bases = layer_bases(model, data, targets, FactorizeConfig(stats_dtype="float64"),
                        CompressionReport("factorize", {}))
    new = apply_factors(model, targets, _factors(targets, bases, {t.name: matrix_view(t.layer).max_rank
                                                                 for t in targets}))
    with torch.no_grad():
        torch.testing.assert_close(new(ids).last_hidden_state, model(ids).last_hidden_state, rtol=1e-10,
                                   atol=1e-10)


def test_hugging_face_gpt2_conv1d_projections_become_linear_targets() -> None:
    """A tiny Hugging Face GPT2Model (random weights): its projections are transformers' Conv1D (weight stored
    in × out); they are rewritten as nn.Linear on a copy, found as targets, and factorize at full rank reproduces
    the original model's output."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).double().eval()
    with torch.no_grad():  # biases as after training (a fresh GPT-2's are zero)
        for mod in model.modules():
            if type(mod).__name__ == "Conv1D":
                mod.bias.normal_(0.0, 0.1)
    ids = torch.randint(0, 50, (24, 6), generator=torch.Generator().manual_seed(3))
    unfused = factorisable_model(model, ids[:4])
    wanted = {f"h.{i}.{p}" for i in range(2) for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    assert set(unfused.conv1d) == wanted and unfused.model is not model and not unfused.conv1d_left
    assert all(type(model.get_submodule(n)).__name__ == "Conv1D" for n in wanted)  # the original is untouched
    targets, _, _ = find_targets(unfused.model, ids[:4])
    assert wanted <= {t.name for t in targets}
    bases = layer_bases(unfused.model, Dataset(ids), targets, FactorizeConfig(stats_dtype="float64"),
                        CompressionReport("factorize", {}))
    new = apply_factors(unfused.model, targets, _factors(targets, bases, {t.name: matrix_view(t.layer).max_rank
                                                                          for t in targets}))
    with torch.no_grad():
        torch.testing.assert_close(new(ids).last_hidden_state, model(ids).last_hidden_state, rtol=1e-10,
                                   atol=1e-10)
