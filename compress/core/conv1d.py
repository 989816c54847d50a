"""transformers' ``Conv1D`` (GPT-2's projections) read as the nn.Linear it is.

``Conv1D`` computes ``y = x @ W + b`` with ``W`` stored in × out, the transpose of an nn.Linear's weight; no rule
of minreal reads it as a Linear. :func:`rewrite_conv1d` gives a copy of a model with each such layer replaced by the
nn.Linear of weight ``W.T`` and the same bias, once a probe input shows the layer computes exactly that and the
rewritten model gives the original's outputs on the example. A layer of that name that fails either check is left
as it is, with the reason.
"""

from __future__ import annotations

import torch
from torch import nn

from .evaluate import eval_mode, flatten_outputs
from .inputs import Inputs, call
from .surgery import replace_modules

__all__ = ["CONV1D", "conv1d_refusal", "rewrite_conv1d", "transposed_linears"]

CONV1D = "Conv1D"
"""The class name of transformers' transposed Linear (``transformers.pytorch_utils.Conv1D``)."""
PROBE_SHAPE = (2, 3)
"""Leading dimensions of the probe input a layer is run on (its last dimension is the layer's input width)."""


def conv1d_refusal(layer: nn.Module) -> str | None:
    """Why ``layer`` is not a transposed Linear ``y = x @ W + b`` (2-D floating ``W`` stored in × out, bias of one
    element per column or none, no submodules), or None when it is.

    The check runs ``layer`` on a seeded probe input of shape (2, 3, in) in its own dtype and device and compares
    with ``x @ W + b`` in float64, element by element, within ``2 (n + 2) eps (|x| @ |W| + |b|)`` (n = in, eps of
    the layer's dtype): the forward error bound of an inner product of length n, ``γ_n |x|ᵀ|w|`` (Higham,
    *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1), plus the bias's rounding, doubled. The
    layer's forward hooks run on the probe too.
    """
    weight, bias = getattr(layer, "weight", None), getattr(layer, "bias", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        return "its weight is not a 2-D floating-point tensor"
    if next(layer.children(), None) is not None:
        return "it has submodules"
    if weight.is_meta:
        return "its weight is on the meta device (no values to probe)"
    n_in, n_out = weight.shape
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n_out,)):
        return f"its bias is not a tensor of {n_out} elements"
    x = torch.randn(*PROBE_SHAPE, n_in, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    probe = x.to(weight.device, weight.dtype)
    with torch.no_grad():
        try:
            got = layer(probe)
        except Exception as exc:  # any failure on the probe means: not a transposed Linear
            return f"it fails on a probe input of shape {tuple(probe.shape)} ({type(exc).__name__}: {exc})"
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (*PROBE_SHAPE, n_out):
            return f"on a probe input of shape {tuple(probe.shape)} it does not return shape {(*PROBE_SHAPE, n_out)}"
        x, w = probe.double().cpu(), weight.detach().double().cpu()
        b = torch.zeros(n_out, dtype=torch.float64) if bias is None else bias.detach().double().cpu()
        error = (got.double().cpu() - (x @ w + b)).abs()
        bound = 2 * (n_in + 2) * torch.finfo(weight.dtype).eps * (x.abs() @ w.abs() + b.abs())
    if not bool((error <= bound).all()):
        return "on a probe input it does not compute x @ W + b with W stored in × out"
    return None


def transposed_linears(model: nn.Module) -> tuple[dict[str, nn.Linear], dict[str, str]]:
    """The layers of ``model`` whose class is named ``Conv1D``: those that are transposed Linears
    (:func:`conv1d_refusal`) as the nn.Linear computing the same function (parameters copied, the layer itself
    untouched), and the others with the reason, each by qualified name in module order."""
    linears: dict[str, nn.Linear] = {}
    left: dict[str, str] = {}
    for name, mod in model.named_modules():
        if type(mod).__name__ != CONV1D:
            continue
        reason = conv1d_refusal(mod)
        if reason is None:
            linears[name] = _as_linear(mod)
        else:
            left[name] = reason
    return linears, left


def _as_linear(layer: nn.Module) -> nn.Linear:
    """The nn.Linear of a transposed Linear: no random initialisation; weight and bias are copies (never views of
    the layer's, so training one model does not change the other)."""
    weight, bias = layer.weight, layer.bias
    linear = nn.Linear(weight.shape[0], weight.shape[1], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight.detach().t().clone(memory_format=torch.contiguous_format),
                                 requires_grad=weight.requires_grad)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().clone(), requires_grad=bias.requires_grad)
    return linear.train(layer.training)


def rewrite_conv1d(model: nn.Module, example: Inputs) -> tuple[nn.Module, list[str], dict[str, str]]:
    """``model`` with its transposed Linears rewritten as nn.Linear (a copy; ``model`` itself when there are none),
    the names rewritten, and the layers named ``Conv1D`` left as they are with the reason.

    The copy must give ``model``'s outputs on ``example`` (each tensor output within ``sqrt(eps)`` of its largest
    magnitude; other objects, such as a key/value cache, are passed over): a parent that reads a layer's
    ``weight`` or ``nf`` itself would compute something else, or fail, once the layer is an nn.Linear; then every
    layer is left, with that reason.
    """
    linears, left = transposed_linears(model)
    if not linears:
        return model, [], left
    rewritten = replace_modules(model, linears)
    problem = _changed_function(model, rewritten, example)
    if problem:
        return model, [], {**{n: problem for n in linears}, **left}
    return rewritten, list(linears), left


def _changed_function(model: nn.Module, rewritten: nn.Module, example: Inputs) -> str | None:
    """Why ``rewritten`` does not compute ``model``'s function on ``example``, or None."""
    try:
        with eval_mode(model), eval_mode(rewritten), torch.no_grad():
            want = flatten_outputs(call(model, example), skip_other=True)  # a cache object is no output to compare
            got = flatten_outputs(call(rewritten, example), skip_other=True)
    except Exception as exc:  # the parent relies on the Conv1D class itself
        return f"the model fails once its Conv1D layers are nn.Linear ({type(exc).__name__}: {exc})"
    if len(want) != len(got):
        return f"once its Conv1D layers are nn.Linear the model returns {len(got)} outputs, not {len(want)}"
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        if a.shape != b.shape:
            return f"once its Conv1D layers are nn.Linear the model's output {i} has shape {tuple(b.shape)}, not " \
                   f"{tuple(a.shape)}"
        if not a.is_floating_point():
            continue
        scale = float(a.double().abs().max()) if a.numel() else 0.0
        worst = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        if not worst <= torch.finfo(a.dtype).eps ** 0.5 * scale:
            return (f"once its Conv1D layers are nn.Linear the model's output {i} moves by {worst:.3g} (largest "
                    f"magnitude {scale:.3g}); a parent may read their weights itself")
    return None
