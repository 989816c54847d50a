"""PlainAttention computes nn.MultiheadAttention's function (float64, every layout, mask kind and projection
shape), unfuse_attention rewrites models without changing them and refuses what it cannot convert exactly, and
the rewritten attention exports with both ONNX exporters and matches ONNX Runtime at two batch sizes."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.compress.core.attention import PlainAttention, additive_mask, unfuse_attention
from minreal.export.verify import verify_parity

E, HEADS, N, L, S = 16, 4, 3, 5, 7
TOL64 = {"rtol": 1e-12, "atol": 1e-12}


def _mha(**kwargs) -> nn.MultiheadAttention:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, HEADS, **kwargs).double().eval()
    for p in (mha.in_proj_bias, mha.out_proj.bias):
        if p is not None:
            nn.init.normal_(p, std=0.5)
    return mha


def _inputs(mha: nn.MultiheadAttention, batch_first: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(N, n, d, generator=g, dtype=torch.float64)
               for n, d in ((L, E), (S, mha.kdim), (S, mha.vdim)))
    return (q, k, v) if batch_first else tuple(t.transpose(0, 1) for t in (q, k, v))


def _masks(kind: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    padding = torch.zeros(N, S, dtype=torch.bool)
    padding[0, -2:] = padding[2, 0] = True
    banded = torch.ones(L, S, dtype=torch.bool).triu(3)  # True: may not attend (nn.MultiheadAttention's convention)
    return {"none": {}, "bool-attn": {"attn_mask": banded},
            "float-attn-per-head": {"attn_mask": torch.randn(N * HEADS, L, S, generator=g, dtype=torch.float64)},
            "bool-padding": {"key_padding_mask": padding},
            "float-padding": {"key_padding_mask": torch.randn(N, S, generator=g, dtype=torch.float64)},
            "both": {"attn_mask": banded, "key_padding_mask": padding}}[kind]


MHA_KINDS = {"default": {}, "no-bias": {"bias": False}, "kdim-vdim": {"kdim": 6, "vdim": 5}}


@pytest.mark.parametrize("weights", [(False, True), (True, True), (True, False)],
                         ids=["no-weights", "averaged-weights", "per-head-weights"])
@pytest.mark.parametrize("mask", ["none", "bool-attn", "float-attn-per-head", "bool-padding", "float-padding", "both"])
@pytest.mark.parametrize("kind", sorted(MHA_KINDS))
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
def test_plain_attention_is_multihead_attention(batch_first: bool, kind: str, mask: str,
                                                weights: tuple[bool, bool]) -> None:
    """Same output and weights as nn.MultiheadAttention in float64, for its masks, layouts and projection shapes."""
    mha = _mha(batch_first=batch_first, **MHA_KINDS[kind])
    plain = PlainAttention.from_multihead(mha).eval()
    need, average = weights
    call = {**_masks(mask), "need_weights": need, "average_attn_weights": average}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nn.MultiheadAttention on a bool/float mask pair
        want, got = mha(*_inputs(mha, batch_first), **call), plain(*_inputs(mha, batch_first), **call)
    torch.testing.assert_close(got[0], want[0], **TOL64)
    if need:
        torch.testing.assert_close(got[1], want[1], **TOL64)
    else:
        assert got[1] is None and want[1] is None


def test_unbatched_and_causal_calls() -> None:
    """Unbatched inputs (L, E) and the ``is_causal`` hint with its mask give nn.MultiheadAttention's results;
    ``is_causal`` without a mask (which nn.MultiheadAttention refuses) applies the causal mask."""
    mha = _mha(batch_first=True)
    plain = PlainAttention.from_multihead(mha).eval()
    x = torch.randn(L, E, dtype=torch.float64)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    with torch.no_grad():
        for call in ({}, {"average_attn_weights": False}, {"key_padding_mask": torch.tensor([0, 0, 0, 1, 0]) > 0}):
            for want, got in zip(mha(x, x, x, **call), plain(x, x, x, **call)):
                torch.testing.assert_close(got, want, **TOL64)
        xb = x.expand(2, L, E)
        want = mha(xb, xb, xb, attn_mask=causal, is_causal=True, need_weights=False)[0]
        torch.testing.assert_close(plain(xb, xb, xb, attn_mask=causal, is_causal=True, need_weights=False)[0], want,
                                   **TOL64)
        torch.testing.assert_close(plain(xb, xb, xb, is_causal=True, need_weights=False)[0], want, **TOL64)


def test_dropout_acts_in_training_only() -> None:
    """With dropout 0.5: eval computes the function exactly; training draws the same dropout on the weights as
    nn.MultiheadAttention from the same generator state (need_weights=True), and differs from eval."""
    mha = _mha(batch_first=True, dropout=0.5)
    plain = PlainAttention.from_multihead(mha)
    q, k, v = _inputs(mha, True)
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(q, k, v)[0], mha.eval()(q, k, v)[0], **TOL64)
        torch.manual_seed(3)
        want = mha.train()(q, k, v)
        torch.manual_seed(3)
        got = plain.train()(q, k, v)
    torch.testing.assert_close(got[0], want[0], **TOL64)
    torch.testing.assert_close(got[1], want[1], **TOL64)
    assert not torch.allclose(got[0], plain.eval()(q, k, v)[0])


def test_additive_mask_merges_both_masks() -> None:
    """True (may not attend) becomes −∞, floats add, a per-head mask splits into (batch, heads)."""
    attn = torch.arange(N * HEADS * L * S, dtype=torch.float64).reshape(N * HEADS, L, S)
    pad = torch.zeros(N, S, dtype=torch.bool)
    pad[1, 2] = True
    mask = additive_mask(attn, pad, N, HEADS, torch.float64)
    assert mask.shape == (N, HEADS, L, S)
    assert torch.isinf(mask[1, :, :, 2]).all() and torch.isfinite(mask[[0, 2]]).all()
    assert torch.equal(mask[0, 1], attn[1])
    assert additive_mask(None, None, N, HEADS, torch.float64) is None


class _Blocks(nn.Module):
    """Two attention layers the rewrite converts (self- and cross-attention) and two it must refuse."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(E, HEADS, batch_first=True)
        self.cross = nn.MultiheadAttention(E, 2, kdim=6, vdim=6, bias=False)
        self.bias_kv = nn.MultiheadAttention(E, HEADS, batch_first=True, add_bias_kv=True)
        self.zero = nn.MultiheadAttention(E, HEADS, batch_first=True, add_zero_attn=True)
        self.memory = nn.Linear(E, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.self_attn(x, x, x)[0]
        m = self.memory(x).transpose(0, 1)
        h = h + self.cross(h.transpose(0, 1), m, m)[0].transpose(0, 1)
        h = h + self.bias_kv(h, h, h, need_weights=False)[0]
        return h + self.zero(h, h, h, need_weights=False)[0]


def test_unfuse_converts_what_it_can_and_names_what_it_refuses() -> None:
    torch.manual_seed(4)
    model = _Blocks().double().eval()
    x = torch.randn(N, L, E, dtype=torch.float64)
    result = unfuse_attention(model)
    assert result.unfused == ["self_attn", "cross"]
    assert set(result.refused) == {"bias_kv", "zero"}
    assert "add_bias_kv" in result.refused["bias_kv"] and "add_zero_attn" in result.refused["zero"]
    assert isinstance(result.model.self_attn, PlainAttention) and isinstance(result.model.cross, PlainAttention)
    assert type(result.model.bias_kv) is nn.MultiheadAttention and type(model.self_attn) is nn.MultiheadAttention
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), model(x), **TOL64)
    same = unfuse_attention(model, inplace=True)
    assert same.model is model and isinstance(model.cross, PlainAttention)
    alone = unfuse_attention(_mha(batch_first=True))
    assert alone.unfused == [""] and isinstance(alone.model, PlainAttention)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
def test_unfused_transformer_encoder_takes_the_plain_path(batch_first: bool) -> None:
    """torch's TransformerEncoder reads the fused weights for its fast and nested-tensor paths: after the rewrite
    it takes the plain path and computes the same function (float32 against its fused kernels, padding masked)."""
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(E, HEADS, 32, dropout=0.0, batch_first=batch_first)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # enable_nested_tensor with batch_first=False
        model = nn.TransformerEncoder(layer, 2).eval()
    new = unfuse_attention(model).model
    assert all(isinstance(block.self_attn, PlainAttention) for block in new.layers) and not new.use_nested_tensor
    x = torch.randn(N, L, E) if batch_first else torch.randn(L, N, E)
    pad = torch.zeros(N, L, dtype=torch.bool)
    pad[1, -2:] = True
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the original's nested tensors are a prototype
        want, got = model(x, src_key_padding_mask=pad), new(x, src_key_padding_mask=pad)
        if want.is_nested:
            want = want.to_padded_tensor(0.0)
        keep = ~pad if batch_first else ~pad.T  # the nested path leaves padded positions at zero
        torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(new(x), model(x), rtol=1e-5, atol=1e-5)


class _Block(nn.Module):
    """Self-attention under a causal mask and a head; optionally adds the attention weights to the output."""

    def __init__(self, batch_first: bool, need_weights: bool) -> None:
        super().__init__()
        self.batch_first, self.need_weights = batch_first, need_weights
        self.attn = nn.MultiheadAttention(E, HEADS, batch_first=batch_first)
        self.head = nn.Linear(E, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if self.batch_first else x.transpose(0, 1)
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        out, weights = self.attn(h, h, h, need_weights=self.need_weights, attn_mask=causal)
        out = self.head(out if self.batch_first else out.transpose(0, 1))
        return out + weights.sum(-1, keepdim=True) if self.need_weights else out


def _export(model: nn.Module, x: torch.Tensor, path: Path, dynamo: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(model, (x,), str(path), dynamo=True, opset_version=18, input_names=["input"],
                              dynamic_shapes=({0: torch.export.Dim("batch")},), external_data=False, verbose=False)
        else:
            torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=18, input_names=["input"],
                              output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit-weights"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
def test_unfused_attention_exports_with_ort_parity(batch_first: bool, need_weights: bool, dynamo: bool,
                                                   tmp_path: Path) -> None:
    """Both attention routes (SDPA, explicit weights) export at opset 18 with either exporter and match ONNX
    Runtime at batch sizes 3 and 7 (rtol 1e-4, atol 1e-5)."""
    torch.manual_seed(6)
    model = _Block(batch_first, need_weights).eval()
    new = unfuse_attention(model).model.eval()
    x = torch.randn(7, L, E)
    with torch.no_grad():
        torch.testing.assert_close(new(x), model(x), rtol=1e-5, atol=1e-5)
    path = tmp_path / "attention.onnx"
    _export(new, x[:2], path, dynamo)
    parity = verify_parity(new, path, [x[:3], x], rtol=1e-4, atol=1e-5)
    assert parity.passed and parity.batch_sizes == [3, 7]


def test_copy_keeps_grad_flags_and_dtype() -> None:
    mha = _mha(batch_first=True)
    mha.out_proj.weight.requires_grad_(False)
    plain = PlainAttention.from_multihead(copy.deepcopy(mha))
    assert not plain.out_proj.weight.requires_grad and plain.q_proj.weight.requires_grad
    assert {p.dtype for p in plain.parameters()} == {torch.float64}
    assert (plain.embed_dim, plain.kdim, plain.vdim, plain.head_dim) == (E, E, E, E // HEADS)
    with pytest.raises(ValueError, match="add_bias_kv"):
        PlainAttention.from_multihead(nn.MultiheadAttention(E, HEADS, add_bias_kv=True))
