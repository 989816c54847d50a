"""Multi-head attention as plain modules: separate q/k/v/out projections a method can factorise like any Linear.

:class:`torch.nn.MultiheadAttention` keeps q/k/v in one ``in_proj_weight`` and reads ``out_proj.weight`` itself,
so none of its projections can be replaced by a layer pair. :func:`unfuse_attention` rewrites each one into a
:class:`PlainAttention` — ``q_proj``/``k_proj``/``v_proj``/``out_proj`` :class:`torch.nn.Linear` layers called
through ``forward`` around the same scaled dot-product attention (Vaswani et al. 2017, "Attention Is All You
Need", eq. 1 and §3.2.2) — with the same call signature and the same results.

``need_weights=True`` (nn.MultiheadAttention's default, which plain ``attn(x, x, x)[0]`` calls keep) computes the
weights explicitly, exactly as nn.MultiheadAttention does; ``need_weights=False`` (torchvision's ViT,
nn.TransformerEncoderLayer) runs :func:`torch.nn.functional.scaled_dot_product_attention`. Both export to ONNX
with either exporter (opset 18). Dropout on the attention weights acts in training only.

References
----------
.. [1] Vaswani et al. 2017, "Attention Is All You Need", eq. 1 and §3.2.2.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .surgery import replace_modules

__all__ = ["AttentionBase", "PlainAttention", "Unfused", "additive_mask", "multihead_attention",
           "unfuse_attention", "unfuse_refusal"]

Tensor = torch.Tensor


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask (True: may not attend) as 0/−∞; a float mask as it is, in ``dtype``."""
    if mask.dtype == torch.bool:
        return torch.zeros_like(mask, dtype=dtype).masked_fill(mask, float("-inf"))
    return mask.to(dtype)


def additive_mask(attn_mask: Tensor | None, key_padding_mask: Tensor | None, batch: int, heads: int,
                  dtype: torch.dtype) -> Tensor | None:
    """nn.MultiheadAttention's two masks merged into one float mask added to the logits, broadcastable to
    (batch, heads, L, S): boolean True (may not attend, the opposite of SDPA's convention) becomes −∞, a float
    mask is added as it is. ``attn_mask`` is (L, S) or (batch·heads, L, S); ``key_padding_mask`` is (batch, S)."""
    mask = None
    if attn_mask is not None:
        mask = _additive(attn_mask, dtype)
        if mask.dim() == 3:
            mask = mask.reshape(batch, heads, mask.shape[1], mask.shape[2])
    if key_padding_mask is not None:
        pad = _additive(key_padding_mask, dtype).reshape(batch, 1, 1, key_padding_mask.shape[-1])
        mask = pad if mask is None else mask + pad
    return mask


def _causal(lq: int, ls: int, like: Tensor) -> Tensor:
    """The additive causal mask (query i sees keys 0..i), as SDPA's ``is_causal`` builds it."""
    hidden = torch.ones(lq, ls, dtype=torch.bool, device=like.device).triu(1)
    return _additive(hidden, like.dtype)


def _heads(x: Tensor, heads: int) -> Tensor:
    """(N, L, heads·d) → (N, heads, L, d)."""
    return x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads).transpose(1, 2)


def multihead_attention(q: Tensor, k: Tensor, v: Tensor, heads: int, mask: Tensor | None = None,
                        need_weights: bool = False, dropout_p: float = 0.0) -> tuple[Tensor, Tensor | None]:
    """softmax(q kᵀ/√d + mask) v per head (Vaswani et al. 2017, eq. 1) on projected batch-first tensors.

    Parameters
    ----------
    q, k, v : Tensor
        queries (N, L, heads·d), keys (N, S, heads·d) and values (N, S, heads·d_v).
    heads : int
        number of heads the last axes split into.
    mask : Tensor | None
        additive float mask broadcastable to (N, heads, L, S) (see :func:`additive_mask`).
    need_weights : bool
        also return the per-head attention weights (N, heads, L, S), after dropout as
        nn.MultiheadAttention returns them; computed explicitly instead of by SDPA.
    dropout_p : float
        dropout probability on the attention weights (pass 0 outside training).

    Returns
    -------
    tuple[Tensor, Tensor | None]
        The heads' outputs concatenated, (N, L, heads·d_v), and the weights or None.
    """
    qh, kh, vh = _heads(q, heads), _heads(k, heads), _heads(v, heads)
    if not need_weights:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, dropout_p=dropout_p)
        return out.transpose(1, 2).flatten(2), None
    logits = (qh * (1.0 / math.sqrt(qh.shape[-1]))) @ kh.transpose(-2, -1)
    weights = torch.softmax(logits if mask is None else logits + mask, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return (weights @ vh).transpose(1, 2).flatten(2), weights


class AttentionBase(nn.Module):
    """Shared call of the attention modules that stand in for :class:`torch.nn.MultiheadAttention`: masks,
    layouts (batch-first, sequence-first, unbatched) and weights as it has them; subclasses give
    :meth:`project` (the q/k/v projections of batch-first inputs) and an ``out_proj`` module.

    ``_qkv_same_embed_dim`` is False so that torch's transformer layers, which read it to choose their fused
    fast path, take the plain path that calls this module.
    """

    _qkv_same_embed_dim = False

    def __init__(self, num_heads: int, batch_first: bool, dropout: float) -> None:
        super().__init__()
        self.num_heads, self.batch_first, self.dropout = num_heads, batch_first, dropout

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (N, L or S, heads·d) of batch-first inputs."""
        raise NotImplementedError

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        """nn.MultiheadAttention's call: ``(output, weights)``, weights None unless ``need_weights``, averaged
        over heads when ``average_attn_weights``. ``is_causal`` is a hint that ``attn_mask`` is causal (the
        mask is used); without ``attn_mask`` the causal mask is built (nn.MultiheadAttention refuses that)."""
        batched = query.dim() == 3
        query, key, value = (_batch_first(t, batched, self.batch_first) for t in (query, key, value))
        if key_padding_mask is not None and not batched:
            key_padding_mask = key_padding_mask.unsqueeze(0)
        q, k, v = self.project(query, key, value)
        mask = additive_mask(attn_mask, key_padding_mask, q.shape[0], self.num_heads, q.dtype)
        if is_causal and attn_mask is None:
            causal = _causal(q.shape[1], k.shape[1], q)
            mask = causal if mask is None else mask + causal
        out, weights = multihead_attention(q, k, v, self.num_heads, mask, need_weights,
                                           self.dropout if self.training else 0.0)
        out = _restore_layout(self.out_proj(out), batched, self.batch_first)
        if weights is not None:
            weights = weights.mean(1) if average_attn_weights else weights
            weights = weights if batched else weights.squeeze(0)
        return out, weights


def _batch_first(x: Tensor, batched: bool, batch_first: bool) -> Tensor:
    if not batched:
        return x.unsqueeze(0)
    return x if batch_first else x.transpose(0, 1)


def _restore_layout(x: Tensor, batched: bool, batch_first: bool) -> Tensor:
    if not batched:
        return x.squeeze(0)
    return x if batch_first else x.transpose(0, 1)


class PlainAttention(AttentionBase):
    """Multi-head attention with separate ``q_proj``/``k_proj``/``v_proj``/``out_proj`` modules called through
    ``forward`` (so each may be replaced, e.g. by a factorised pair); a drop-in for
    :class:`torch.nn.MultiheadAttention` (same call and results, see :class:`AttentionBase`).

    ``in_proj_bias`` is None (there is no fused input projection): torch's transformer layers read it to choose
    their fused fast path and take the plain one instead.
    """

    in_proj_bias = None
    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
    """Names of the projection submodules."""

    def __init__(self, q_proj: nn.Module, k_proj: nn.Module, v_proj: nn.Module, out_proj: nn.Module,
                 num_heads: int, batch_first: bool = False, dropout: float = 0.0) -> None:
        super().__init__(num_heads, batch_first, dropout)
        qk = {q_proj.out_features, k_proj.out_features}
        if len(qk) != 1 or q_proj.out_features % num_heads or v_proj.out_features % num_heads:
            raise ValueError(f"q/k projections must have equal widths and q/k/v widths must split into {num_heads} "
                             f"heads; got q {q_proj.out_features}, k {k_proj.out_features}, v {v_proj.out_features}")
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = q_proj, k_proj, v_proj, out_proj
        self.embed_dim, self.kdim, self.vdim = q_proj.in_features, k_proj.in_features, v_proj.in_features
        self.head_dim = q_proj.out_features // num_heads

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.q_proj(query), self.k_proj(key), self.v_proj(value)

    @classmethod
    def from_multihead(cls, mha: nn.MultiheadAttention) -> "PlainAttention":
        """The same attention as ``mha`` (copies of its weights); ValueError when :func:`unfuse_refusal` says
        it cannot be converted exactly."""
        reason = unfuse_refusal(mha)
        if reason:
            raise ValueError(f"cannot convert this nn.MultiheadAttention exactly: {reason}")
        e = mha.embed_dim
        if mha._qkv_same_embed_dim:
            weights = mha.in_proj_weight.split(e)
        else:
            weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        biases = (None,) * 3 if mha.in_proj_bias is None else mha.in_proj_bias.split(e)
        q, k, v = (_linear(w, b) for w, b in zip(weights, biases))
        out = _linear(mha.out_proj.weight, mha.out_proj.bias)
        return cls(q, k, v, out, mha.num_heads, mha.batch_first, mha.dropout)


def _linear(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """An nn.Linear holding copies of ``weight`` (out × in) and ``bias``, same dtype, device and grad flag."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight.detach().clone(), requires_grad=weight.requires_grad)
    if bias is not None:
        layer.bias = nn.Parameter(bias.detach().clone(), requires_grad=bias.requires_grad)
    return layer


def unfuse_refusal(mha: nn.Module) -> str | None:
    """Why ``mha`` cannot become a :class:`PlainAttention` computing the same function, or None if it can."""
    if type(mha) is not nn.MultiheadAttention:
        return f"{type(mha).__name__} subclasses nn.MultiheadAttention and may compute something else"
    if mha.bias_k is not None:
        return "add_bias_kv=True appends learnt key/value rows, which PlainAttention does not have"
    if mha.add_zero_attn:
        return "add_zero_attn=True appends a zero key/value row, which PlainAttention does not have"
    return None


@dataclass
class Unfused:
    """Result of :func:`unfuse_attention`: the model, the attention layers now :class:`PlainAttention` and the
    ones left as nn.MultiheadAttention with the reason; ``conv1d``: the layers
    :func:`~minreal.compress.core.lowrank_plan.factorisable_model` rewrote from transformers' ``Conv1D`` into
    nn.Linear, and ``conv1d_left`` the layers of that name it left, with the reason
    (:func:`~minreal.compress.core.conv1d.rewrite_conv1d`)."""

    model: nn.Module
    unfused: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    conv1d: list[str] = field(default_factory=list)
    conv1d_left: dict[str, str] = field(default_factory=dict)


def unfuse_attention(model: nn.Module, inplace: bool = False) -> Unfused:
    """``model`` (a deep copy unless ``inplace``) with every nn.MultiheadAttention replaced by the
    :class:`PlainAttention` computing the same function; those :func:`unfuse_refusal` refuses are left and
    reported by name. nn.TransformerEncoder's nested-tensor path (which reads the fused weights) is turned off
    where its layers were unfused."""
    target = model if inplace else copy.deepcopy(model)
    result = Unfused(target)
    found = {n: m for n, m in target.named_modules() if isinstance(m, nn.MultiheadAttention)}
    for name, mha in found.items():
        reason = unfuse_refusal(mha)
        if reason:
            result.refused[name or type(mha).__name__] = reason
        else:
            result.unfused.append(name)
    plain = {n: PlainAttention.from_multihead(found[n]) for n in result.unfused}
    if "" in plain:  # the model is itself an attention layer
        result.model = plain.pop("")
    replace_modules(result.model, plain, inplace=True)
    for mod in result.model.modules():
        if isinstance(mod, nn.TransformerEncoder) and any(isinstance(getattr(layer, "self_attn", None), PlainAttention)
                                                          for layer in mod.layers):
            mod.use_nested_tensor = False
    return result
