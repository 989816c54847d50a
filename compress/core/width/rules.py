"""What each operation of a traced model does to its channels: the rules of the width analysis.

Every tensor with a channel dimension gets a *slot list*: one slot id per channel position. Operations
constrain slots:

- conv/linear outputs get fresh slots (the producer's rows); their inputs are read by the consumer's columns;
- per-channel operations (BatchNorm, also called as `F.batch_norm`, activations, pools, dropout, LayerNorm over the
  channels) keep the list;
- elementwise operations of several tensors (residual additions, squeeze-excitation products) tie the slots
  position by position (a broadcast size-1 dimension ties nothing);
- ``torch.cat`` on the channel dimension concatenates the lists (channel offsets);
- ``F.pad`` on the channel dimension adds fresh zero slots (the option-A shortcut), so the padded stream and
  the narrower stream it came from share the original channels at their offset;
- grouped and depthwise convolutions and GroupNorm tie all slots of one group: groups shrink whole;
- flatten/view that merge the channel with trailing dimensions repeat each slot once per trailing position;
- ``nn.MultiheadAttention`` reads and writes the embedding channels and owns one slot per head.

Whatever a rule does not understand freezes the channels it touches (the model's inputs and outputs always are).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import fx, nn

from ..errors import CompressionError
from .graph import Rewrite, SizeRead, Use, WidthGraph, _Chan, _shape

__all__ = ["apply_rules"]

# Layers whose output keeps the input's channels (one per position) and which own no per-channel parameters.
_PASS_MODULES = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh,
                 nn.LeakyReLU, nn.ELU, nn.Mish, nn.PReLU, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
                 nn.Identity,
                 nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
                 nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool1d,
                 nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.Upsample, nn.Softplus)
_PASS_FUNCTIONS = {"relu", "relu_", "relu6", "gelu", "silu", "hardswish", "hardsigmoid", "sigmoid", "tanh",
                   "leaky_relu", "elu", "mish", "dropout", "dropout1d", "dropout2d", "dropout3d", "max_pool1d",
                   "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
                   "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
                   "adaptive_max_pool3d", "interpolate", "contiguous", "clone", "float",
                   "detach", "stochastic_depth", "hardtanh", "softplus", "abs", "neg", "exp", "sqrt"}
_ELEMENTWISE = {operator.add, operator.iadd, operator.mul, operator.imul, operator.sub, operator.isub,
                operator.truediv, operator.itruediv, operator.pow}
_ELEMENTWISE_NAMES = {"add", "add_", "mul", "mul_", "sub", "sub_", "div", "div_", "where", "maximum", "minimum",
                      "pow"}


def apply_rules(wg: WidthGraph) -> None:
    """Visit every node of ``wg.gm`` in graph order and record its slots, uses and rewrites in ``wg``; a node whose
    rule fails freezes the channels of its inputs (a :class:`CompressionError` propagates)."""
    modules = dict(wg.gm.named_modules())
    for node in wg.gm.graph.nodes:
        try:
            _visit(wg, node, modules)
        except CompressionError:
            raise
        except Exception as exc:
            wg.unsupported.append((node.name, f"analysis failed ({type(exc).__name__}: {exc})"))
            for arg in _tensor_args(node):
                chan = wg.values.get(arg.name)
                if chan is not None:
                    wg.freeze(chan.slots, node.name, "not understood by the width analysis")


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) or n)
    return found


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _set(wg: WidthGraph, node: fx.Node, chan: _Chan | None) -> None:
    """Record ``chan`` as the channels of ``node``'s value — only if that value really has them there: an
    operation that changes the size of the tracked dimension (a pool or interpolation over a channels-last
    axis) or returns something else (a pool's indices) freezes the channels instead of mis-tying them."""
    if chan is None:
        return
    shape = _shape(node)
    if shape is None or not -len(shape) <= chan.dim < len(shape) or shape[chan.dim] != len(chan.slots):
        wg.freeze(chan.slots, node.name, "operation changes or hides the tracked channel dimension")
        return
    wg.values[node.name] = chan


def _chan_of(wg: WidthGraph, value: Any) -> _Chan | None:
    return wg.values.get(value.name) if isinstance(value, fx.Node) else None


def _fn_name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _visit(wg: WidthGraph, node: fx.Node, modules: dict[str, nn.Module]) -> None:
    shape = _shape(node)
    if node.op == "placeholder":
        if shape is not None and len(shape) >= 2:
            chan = _Chan(1, wg.fresh(shape[1]))
            wg.freeze(chan.slots, node.name, "model input")
            _set(wg, node, chan)
        return
    if node.op == "output":
        for arg in _tensor_args(node):
            chan = _chan_of(wg, arg)
            if chan is not None:
                wg.freeze(chan.slots, arg.name, "model output")
        return
    if node.op == "get_attr":
        return
    if node.op == "call_module":
        _visit_module(wg, node, modules[node.target])
        return
    name = _fn_name(node)
    if _visit_size_read(wg, node, name):
        return
    reads = _sizes_in(wg, node)
    if reads and name not in ("view", "reshape"):
        if shape is None and not any(_shape(a) is not None for a in _tensor_args(node)):  # arithmetic on sizes
            wg.sizes[node.name] = SizeRead([s for r in reads for s in r.slots], reads[0].source, exact=False)
            return
        touched = [s for a in _tensor_args(node) if (c := _chan_of(wg, a)) is not None for s in c.slots]
        # F.layer_norm(h, (d,)): the cut rewrites the normalised shape to the group's new width, so a channel count
        # of the normalised channels themselves stays consistent; zeros(b, d), x * d ** -0.5, split(x, d) do not
        normed = _normalised_channels(wg, node) if name == "layer_norm" else None
        wg.size_uses += [(node.name, r, touched, normed.slots if normed is not None and r.exact else None)
                         for r in reads]
    if node.target is operator.getitem:
        _visit_getitem(wg, node)
    elif node.target in _ELEMENTWISE or name in _ELEMENTWISE_NAMES:
        _visit_elementwise(wg, node)
    elif name in _PASS_FUNCTIONS:
        _set(wg, node, _chan_of(wg, node.args[0]) if node.args else None)
    elif name == "cat" or name == "concat":
        _visit_cat(wg, node)
    elif name == "pad":
        _visit_pad(wg, node)
    elif name in ("flatten",):
        _visit_reshape(wg, node)
    elif name in ("view", "reshape"):
        _visit_reshape(wg, node)
    elif name in ("permute", "transpose", "movedim"):
        _visit_permute(wg, node)
    elif name in ("mean", "sum", "amax", "amin"):
        _visit_reduce(wg, node)
    elif name == "layer_norm":
        _visit_functional_layer_norm(wg, node)
    elif name == "batch_norm":
        _visit_functional_batch_norm(wg, node)
    elif name in ("softmax", "log_softmax"):
        _visit_softmax(wg, node)
    elif name in ("size", "dim", "getattr"):
        return
    elif shape is None:  # several tensors (chunk, split, max with indices) or a non-tensor result
        _unknown(wg, node, f"operation {name!r} that does not return one tensor is not understood")
    else:
        _unknown(wg, node, f"operation {name!r} is not understood")


def _visit_size_read(wg: WidthGraph, node: fx.Node, name: str) -> bool:
    """Whether ``node`` reads sizes of a tensor: ``x.shape``, ``x.size()`` (a shape), ``x.size(i)``, ``x.numel()``,
    an item or slice of a shape read, the ``numel()`` of one. Where the value holds the tensor's channel count it goes
    to ``wg.sizes``."""
    if (name == "getattr" and node.args[1:] == ("shape",)) or name in ("size", "numel", "nelement"):
        x = node.args[0]
        read = wg.sizes.get(x.name) if isinstance(x, fx.Node) and name in ("numel", "nelement") else None
        if read is not None:  # x.shape.numel(), x.shape[1:].numel(): a product that holds the channel count
            wg.sizes[node.name] = SizeRead(read.slots, read.source, exact=False, product=read.position >= 0)
            return True
        chan, ndim = _chan_of(wg, x), len(_shape(x) or ())
        if chan is None or not ndim:
            return True
        dim = _arg(node, 1, "dim") if name == "size" else None
        if name in ("numel", "nelement"):
            wg.sizes[node.name] = SizeRead(chan.slots, x.name, exact=False)
        elif dim is None:
            wg.sizes[node.name] = SizeRead(chan.slots, x.name, True, chan.dim % ndim, ndim)
        elif int(dim) % ndim == chan.dim % ndim:
            wg.sizes[node.name] = SizeRead(chan.slots, x.name)
        return True
    src = node.args[0] if node.target is operator.getitem else None
    read = wg.sizes.get(src.name) if isinstance(src, fx.Node) else None
    if read is None or read.position < 0:
        return False
    idx = node.args[1]
    if isinstance(idx, int):
        if idx % read.length == read.position:
            wg.sizes[node.name] = SizeRead(read.slots, read.source)
    elif isinstance(idx, slice) and all(v is None or isinstance(v, int) for v in (idx.start, idx.stop, idx.step)):
        kept = list(range(read.length))[idx]
        if read.position in kept:
            wg.sizes[node.name] = SizeRead(read.slots, read.source, read.exact, kept.index(read.position), len(kept))
    else:
        wg.sizes[node.name] = SizeRead(read.slots, read.source, exact=False)
    return True


def _sizes_in(wg: WidthGraph, node: fx.Node) -> list[SizeRead]:
    """The channel counts among ``node``'s arguments (:func:`_visit_size_read`)."""
    return [wg.sizes[a.name] for a in _tensor_args(node) if a.name in wg.sizes]


def _unknown(wg: WidthGraph, node: fx.Node, reason: str) -> None:
    for arg in _tensor_args(node):
        chan = _chan_of(wg, arg)
        if chan is not None:
            wg.freeze(chan.slots, node.name, reason)


def _visit_module(wg: WidthGraph, node: fx.Node, mod: nn.Module) -> None:
    x = node.args[0] if node.args else None
    chan = _chan_of(wg, x)
    in_shape = _shape(x) if isinstance(x, fx.Node) else None
    if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        _visit_conv(wg, node, mod, chan, in_shape)
    elif isinstance(mod, nn.Linear):
        _visit_linear(wg, node, mod, chan, in_shape)
    elif isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
        if chan is None or chan.dim != 1:
            _unknown(wg, node, "BatchNorm over a dimension that is not the channel dimension")
            return
        for p in ("weight", "bias", "running_mean", "running_var"):
            if getattr(mod, p, None) is not None:
                wg.uses.append(Use(node.target, p, 0, chan.slots, "affine", node.name))
        _set(wg, node, chan)
    elif isinstance(mod, nn.LayerNorm):
        if chan is None:
            return
        ndim = len(in_shape or ())
        k = len(mod.normalized_shape)
        if chan.dim < ndim - k:  # normalised over other dimensions: the channels pass through
            _set(wg, node, chan)
        elif k == 1 and chan.dim == ndim - 1 and mod.elementwise_affine:
            for p in ("weight", "bias"):
                if getattr(mod, p, None) is not None:
                    wg.uses.append(Use(node.target, p, 0, chan.slots, "affine", node.name))
            _set(wg, node, chan)
        else:
            _unknown(wg, node, "LayerNorm over several dimensions including the channels")
    elif isinstance(mod, nn.GroupNorm):
        if chan is None or chan.dim != 1 or not mod.affine:
            _unknown(wg, node, "GroupNorm without affine parameters or not over dimension 1")
            return
        per = mod.num_channels // mod.num_groups
        for g in range(mod.num_groups):
            for s in chan.slots[g * per + 1:(g + 1) * per]:
                wg.union(chan.slots[g * per], s)
        wg.norm_groups[node.target] = per
        if mod.affine:
            for p in ("weight", "bias"):
                wg.uses.append(Use(node.target, p, 0, chan.slots, "affine", node.name))
        _set(wg, node, chan)
    elif isinstance(mod, nn.PReLU) and mod.num_parameters > 1:
        if chan is None or chan.dim != 1:
            _unknown(wg, node, "PReLU with one slope per channel over a dimension that is not the channels")
            return
        wg.uses.append(Use(node.target, "weight", 0, chan.slots, "affine", node.name))
        _set(wg, node, chan)
    elif isinstance(mod, _PASS_MODULES):
        _set(wg, node, chan)
    elif isinstance(mod, nn.Flatten):
        _visit_reshape(wg, node)
    elif isinstance(mod, nn.MultiheadAttention):
        _visit_attention(wg, node, mod)
    elif isinstance(mod, (nn.Softmax, nn.LogSoftmax)):
        _visit_softmax(wg, node, dim=mod.dim)
    else:
        _unknown(wg, node, f"layer type {type(mod).__name__} is not understood")


def _visit_conv(wg: WidthGraph, node: fx.Node, mod: nn.Conv2d, chan: _Chan | None,
                in_shape: tuple[int, ...] | None) -> None:
    if chan is not None and chan.dim != 1:
        _unknown(wg, node, "convolution input whose channels are not dimension 1")
        chan = None
    out = wg.fresh(mod.out_channels)
    g = mod.groups
    if g == 1:
        if chan is not None:
            wg.uses.append(Use(node.target, "weight", 1, chan.slots, "consumer", node.name, node.args[0].name))
        wg.uses.append(Use(node.target, "weight", 0, out, "producer", node.name))
        if mod.bias is not None:
            wg.uses.append(Use(node.target, "bias", 0, out, "producer", node.name))
    else:
        a, b = mod.in_channels // g, mod.out_channels // g
        if chan is None:
            wg.freeze(out, node.name, "grouped convolution of a tensor whose channels are not tracked")
            ins = wg.fresh(mod.in_channels)
        else:
            ins = chan.slots
        for k in range(g):
            lead = out[k * b]
            for s in out[k * b + 1:(k + 1) * b] + ins[k * a:(k + 1) * a]:
                wg.union(lead, s)
        wg.conv_groups[node.target] = (a, b)
        wg.uses.append(Use(node.target, "weight", 0, out, "affine", node.name))
        if mod.bias is not None:
            wg.uses.append(Use(node.target, "bias", 0, out, "affine", node.name))
    _set(wg, node, _Chan(1, out))


def _visit_linear(wg: WidthGraph, node: fx.Node, mod: nn.Linear, chan: _Chan | None,
                  in_shape: tuple[int, ...] | None) -> None:
    last = len(in_shape) - 1 if in_shape else -1
    if chan is not None and chan.dim != last:
        _unknown(wg, node, "Linear over a dimension that is not the tracked channel dimension")
        chan = None
    if chan is not None:
        wg.uses.append(Use(node.target, "weight", 1, chan.slots, "consumer", node.name, node.args[0].name))
    out = wg.fresh(mod.out_features)
    wg.uses.append(Use(node.target, "weight", 0, out, "producer", node.name))
    if mod.bias is not None:
        wg.uses.append(Use(node.target, "bias", 0, out, "producer", node.name))
    _set(wg, node, _Chan(last if last >= 0 else 1, out))


def _visit_attention(wg: WidthGraph, node: fx.Node, mod: nn.MultiheadAttention) -> None:
    """Embedding channels in (query/key/value, read by the in-projection) and out (written by out_proj); one
    slot per head owns its rows of the q/k/v projections and its columns of out_proj."""
    args = [node.args[i] if len(node.args) > i else node.kwargs.get(k) for i, k in enumerate(("query", "key", "value"))]
    chans = [_chan_of(wg, a) for a in args]
    same_input = all(a is args[0] for a in args)
    if not mod._qkv_same_embed_dim or not same_input or mod.bias_k is not None or mod.add_zero_attn:
        _unknown(wg, node, "attention with separate query/key/value inputs or projections, bias_k/bias_v or "
                           "add_zero_attn is left whole")
        out = wg.fresh(mod.embed_dim)
        wg.freeze(out, node.name, "attention left whole")
        wg.values[node.name + "#0"] = _Chan(-1, out)
        return
    q = chans[0]
    dim = len(_shape(args[0]) or ()) - 1
    if q is not None and q.dim == dim:
        wg.uses.append(Use(node.target, "in_proj_weight", 1, q.slots, "consumer", node.name, args[0].name))
    elif q is not None:
        _unknown(wg, node, "attention input whose channels are not the last dimension")
    heads = wg.fresh(mod.num_heads)
    hd = mod.head_dim
    rows = [h for _ in range(3) for h in heads for _ in range(hd)]
    wg.uses.append(Use(node.target, "in_proj_weight", 0, rows, "affine", node.name))
    if mod.in_proj_bias is not None:
        wg.uses.append(Use(node.target, "in_proj_bias", 0, rows, "affine", node.name))
    wg.uses.append(Use(node.target, "out_proj.weight", 1, [h for h in heads for _ in range(hd)], "affine",
                       node.name))
    wg.heads[node.target] = heads
    out = wg.fresh(mod.embed_dim)
    wg.uses.append(Use(node.target, "out_proj.weight", 0, out, "producer", node.name))
    if mod.out_proj.bias is not None:
        wg.uses.append(Use(node.target, "out_proj.bias", 0, out, "producer", node.name))
    wg.values[node.name + "#0"] = _Chan(dim, out)


def _visit_getitem(wg: WidthGraph, node: fx.Node) -> None:
    src, idx = node.args
    if isinstance(src, fx.Node) and _shape(src) is None:  # an item of a tuple output (attention, split)
        chan = wg.values.get(f"{src.name}#{idx}") if isinstance(idx, int) else None
        if chan is not None:
            _set(wg, node, chan)
        elif src.op == "call_module" and f"{src.name}#0" in wg.values and node.users:
            # attention weights: a resized attention layer (SlimAttention) does not return them
            wg.freeze([s for u in wg.uses if u.node == src.name for s in u.slots], node.name,
                      "attention weights are used")
        return
    chan = _chan_of(wg, src)
    if chan is None:
        return
    index = idx if isinstance(idx, tuple) else (idx,)
    ndim = len(_shape(src) or ())
    if any(i is Ellipsis for i in index):
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (ndim - (len(index) - 1 - index.count(None))) + index[k + 1:]
    dim_in, dim_out = 0, 0
    for i in index:
        if i is None:
            dim_out += 1
            continue
        if dim_in == chan.dim:
            if isinstance(i, slice) and i == slice(None):
                _set(wg, node, _Chan(dim_out, chan.slots))
            else:
                _unknown(wg, node, "indexing into the channel dimension")
            return
        if not isinstance(i, slice) and not isinstance(i, int):
            _unknown(wg, node, "advanced indexing of a tensor with tracked channels")
            return
        dim_in += 1
        dim_out += 0 if isinstance(i, int) else 1
    _set(wg, node, _Chan(dim_out + (chan.dim - dim_in), chan.slots))


def _visit_elementwise(wg: WidthGraph, node: fx.Node) -> None:
    out_shape = _shape(node)
    if out_shape is None:
        return
    n = len(out_shape)
    lead: _Chan | None = None
    operands = [a for a in list(node.args) + list(node.kwargs.values()) if isinstance(a, fx.Node)]
    for a in operands:
        chan = _chan_of(wg, a)
        if chan is None:
            continue
        a_shape = _shape(a) or ()
        d = chan.dim + n - len(a_shape)
        if a_shape[chan.dim] == 1 and out_shape[d] != 1:
            continue  # broadcast along the channels: ties nothing
        if lead is None:
            lead = _Chan(d, chan.slots)
        elif lead.dim != d or len(lead.slots) != len(chan.slots):
            _unknown(wg, node, "elementwise operation of tensors whose channels do not line up")
            return
        else:
            for s, t in zip(lead.slots, chan.slots):
                wg.union(s, t)
    if lead is None:
        return
    for a in operands:
        if _chan_of(wg, a) is not None:
            continue
        a_shape = _shape(a)
        if a_shape is None:
            continue
        d = lead.dim - (n - len(a_shape))
        if d < 0 or a_shape[d] == 1:
            continue
        if a.op == "get_attr" and len(a.users) == 1:
            wg.uses.append(Use("", a.target, d, lead.slots, "affine", node.name))
        elif a.op == "get_attr":
            wg.freeze(lead.slots, node.name, f"parameter {a.target} is also used elsewhere")
        else:
            wg.freeze(lead.slots, node.name, f"combined with {a.name}, whose channels are not tracked")
    _set(wg, node, lead)


def _visit_cat(wg: WidthGraph, node: fx.Node) -> None:
    tensors = list(_arg(node, 0, "tensors"))
    dim = _arg(node, 1, "dim", 0)
    shapes = [_shape(t) for t in tensors]
    chans = [_chan_of(wg, t) for t in tensors]
    ndim = len(shapes[0] or ())
    dim = dim % ndim if ndim else dim
    if all(c is not None and c.dim == dim for c in chans):
        _set(wg, node, _Chan(dim, [s for c in chans for s in c.slots]))
        return
    if all(c is not None and c.dim != dim for c in chans) and len({c.dim for c in chans}) == 1:
        for c in chans[1:]:
            for s, t in zip(chans[0].slots, c.slots):
                wg.union(s, t)
        _set(wg, node, chans[0])
        return
    _unknown(wg, node, "concatenation of tensors whose channels are not all tracked")


def _visit_pad(wg: WidthGraph, node: fx.Node) -> None:
    x = node.args[0]
    pad = list(_arg(node, 1, "pad"))
    mode = _arg(node, 2, "mode", "constant")
    chan = _chan_of(wg, x)
    if chan is None:
        return
    ndim = len(_shape(x) or ())
    k = ndim - 1 - chan.dim  # pairs count from the last dimension
    before, after = (pad[2 * k], pad[2 * k + 1]) if 2 * k + 1 < len(pad) else (0, 0)
    if before == 0 and after == 0:
        _set(wg, node, chan)
        return
    if mode != "constant" or before < 0 or after < 0 or not all(isinstance(p, int) for p in (before, after)):
        _unknown(wg, node, "padding of the channel dimension that is not a constant zero pad")
        return
    slots = wg.fresh(before) + chan.slots + wg.fresh(after)
    wg.rewrites.append(Rewrite(node.name, "pad", 2 * k, slots, before, after))
    _set(wg, node, _Chan(chan.dim, slots))


def _visit_reshape(wg: WidthGraph, node: fx.Node) -> None:
    out = _reshape(wg, node)
    if not _sizes_in(wg, node):
        return
    chan = _chan_of(wg, node.args[0])
    flat = len(node.args) > 1 and not isinstance(node.args[1], (tuple, list))
    sizes = list(node.args[1:]) if flat else list(_arg(node, 1, "shape", ()))
    if len(sizes) == 1 and isinstance(sizes[0], fx.Node) and sizes[0].name in wg.sizes:  # y.view(x.shape)
        read = wg.sizes[sizes[0].name]
        at = [(read.position, SizeRead(read.slots, read.source, read.exact))] if read.position >= 0 else [(-1, read)]
    else:
        at = [(p, wg.sizes[a.name]) for p, a in enumerate(sizes) if isinstance(a, fx.Node) and a.name in wg.sizes]
        at += [(-1, r) for r in _sizes_in(wg, node) if all(r is not q for _, q in at)]  # nested in other values
    for p, read in at:  # the channel count itself, where the same channels land: a cut resizes both alike
        same = out.slots if out is not None and chan is not None and read.exact and p == out.dim and \
            out.slots is chan.slots else None
        if same is None and out is not None and chan is not None and read.product and p == out.dim and \
                isinstance(node.args[0], fx.Node) and read.source == node.args[0].name:
            same = chan.slots  # the product of the tensor's own sizes where its channels are flattened: h.view(b, n)
        wg.size_uses.append((node.name, read, chan.slots if chan is not None else [], same))


def _reshape(wg: WidthGraph, node: fx.Node) -> _Chan | None:
    """The channels of a flatten/view/reshape (None where not tracked)."""
    x = node.args[0]
    chan = _chan_of(wg, x)
    if chan is None:
        return None
    src, dst = _shape(x), _shape(node)
    if src is None or dst is None:
        return None
    d = chan.dim
    before = math.prod(src[:d])
    # the output dimension e where the channel lands: same number of elements before it
    e, acc = 0, 1
    while e < len(dst) and (acc < before or (dst[e] == 1 and src[d] != 1)):  # size-1 dims (batch 1) lead
        acc *= dst[e]
        e += 1
    if acc != before or e >= len(dst):
        _unknown(wg, node, "reshape that splits or moves the channel dimension")
        return None
    if dst[e] == src[d]:
        slots = chan.slots
    elif dst[e] % src[d] == 0 and dst[e] == math.prod(src[d:d + _merged(src, d, dst[e])]):
        rep = dst[e] // src[d]
        slots = [s for s in chan.slots for _ in range(rep)]
    else:
        _unknown(wg, node, "reshape that splits the channel dimension")
        return None
    if node.op != "call_module" and _fn_name(node) in ("view", "reshape"):
        flat = not isinstance(node.args[1], (tuple, list))  # x.view(n, c) rather than x.view((n, c))
        sizes = list(node.args[1:]) if flat else list(node.args[1])
        if e < len(sizes) and isinstance(sizes[e], int) and sizes[e] == dst[e]:
            wg.rewrites.append(Rewrite(node.name, "shape", e, slots, before=int(flat)))
    _set(wg, node, _Chan(e, slots))
    return wg.values.get(node.name)


def _merged(src: tuple[int, ...], d: int, size: int) -> int:
    """How many dimensions from ``d`` multiply to ``size`` (0 when none)."""
    acc = 1
    for k in range(d, len(src)):
        acc *= src[k]
        if acc == size:
            return k - d + 1
    return 0


def _visit_permute(wg: WidthGraph, node: fx.Node) -> None:
    x = node.args[0]
    chan = _chan_of(wg, x)
    if chan is None:
        return
    ndim = len(_shape(x) or ())
    name = _fn_name(node)
    if name == "permute":
        dims = node.args[1:] if len(node.args) > 2 else _arg(node, 1, "dims")
        dims = [int(d) % ndim for d in dims]
        _set(wg, node, _Chan(dims.index(chan.dim), chan.slots))
    elif name == "transpose":
        a, b = (int(v) % ndim for v in node.args[1:3])
        new = b if chan.dim == a else a if chan.dim == b else chan.dim
        _set(wg, node, _Chan(new, chan.slots))
    else:
        _unknown(wg, node, "movedim is not understood")


def _visit_reduce(wg: WidthGraph, node: fx.Node) -> None:
    x = node.args[0]
    chan = _chan_of(wg, x)
    if chan is None:
        return
    ndim = len(_shape(x) or ())
    dims = _arg(node, 1, "dim")
    keep = bool(_arg(node, 2, "keepdim", False))
    if dims is None:
        _unknown(wg, node, "reduction over all dimensions including the channels")
        return
    dims = [int(d) % ndim for d in (dims if isinstance(dims, (tuple, list)) else [dims])]
    if chan.dim in dims:
        _unknown(wg, node, "reduction over the channel dimension")
        return
    shift = 0 if keep else sum(1 for d in dims if d < chan.dim)
    _set(wg, node, _Chan(chan.dim - shift, chan.slots))


def _visit_softmax(wg: WidthGraph, node: fx.Node, dim: int | None = None) -> None:
    x = node.args[0]
    chan = _chan_of(wg, x)
    if chan is None:
        return
    dim = _arg(node, 1, "dim") if dim is None else dim
    ndim = len(_shape(x) or ())
    if dim is None or int(dim) % ndim == chan.dim:
        _unknown(wg, node, "softmax over the channel dimension")
        return
    _set(wg, node, chan)


def _normalised_channels(wg: WidthGraph, node: fx.Node) -> _Chan | None:
    """The channels ``F.layer_norm`` normalises over, one dimension given as a tuple and it the channels' (the cut
    rewrites that shape to the new width); None otherwise."""
    x, shape = _arg(node, 0, "input"), _arg(node, 1, "normalized_shape")
    chan, ndim = _chan_of(wg, x), len(_shape(x) or ())
    if chan is None or not ndim or not isinstance(shape, (tuple, list)) or len(shape) != 1:
        return None
    return chan if chan.dim % ndim == ndim - 1 else None


def _visit_functional_layer_norm(wg: WidthGraph, node: fx.Node) -> None:
    x = _arg(node, 0, "input")
    chan = _chan_of(wg, x)
    if chan is None:
        return
    given = _arg(node, 1, "normalized_shape")
    if not isinstance(given, (tuple, list)):  # h.shape[-1:]: a shape computed in the trace
        _unknown(wg, node, "layer_norm whose normalised shape is computed from sizes")
        return
    shape = list(given)
    ndim = len(_shape(x) or ())
    if chan.dim < ndim - len(shape):
        _set(wg, node, chan)
        return
    if len(shape) != 1 or chan.dim != ndim - 1:
        _unknown(wg, node, "layer_norm over several dimensions including the channels")
        return
    for i, key in ((2, "weight"), (3, "bias")):
        p = _arg(node, i, key)
        if isinstance(p, fx.Node) and p.op == "get_attr" and len(p.users) == 1:
            wg.uses.append(Use("", p.target, 0, chan.slots, "affine", node.name))
        elif p is not None:
            _unknown(wg, node, "layer_norm with computed weights")
            return
    wg.rewrites.append(Rewrite(node.name, "norm_shape", 1, chan.slots))
    _set(wg, node, chan)


def _visit_functional_batch_norm(wg: WidthGraph, node: fx.Node) -> None:
    """``F.batch_norm(input, running_mean, running_var, weight, bias, ...)`` or ``torch.batch_norm(input, weight,
    bias, running_mean, running_var, ...)`` (timm's ``BatchNormAct2d`` calls the functional form from its own
    ``forward``): per channel over dimension 1, so its four tensors are cut with the channels, as
    ``nn.BatchNorm2d``'s are."""
    x = _arg(node, 0, "input")
    chan = _chan_of(wg, x)
    if chan is None:
        return
    if chan.dim != 1:
        _unknown(wg, node, "batch_norm over a dimension that is not the channel dimension")
        return
    aten = node.target is torch.batch_norm
    keys = ((1, "weight"), (2, "bias"), (3, "running_mean"), (4, "running_var")) if aten else \
        ((1, "running_mean"), (2, "running_var"), (3, "weight"), (4, "bias"))
    params = []
    for i, key in keys:
        p = _arg(node, i, key)
        if p is None:
            continue
        if not (isinstance(p, fx.Node) and p.op == "get_attr" and len(p.users) == 1):
            _unknown(wg, node, "batch_norm with computed or shared statistics or affine parameters")
            return
        params.append(p)
    for p in params:
        wg.uses.append(Use("", p.target, 0, chan.slots, "affine", node.name))
    _set(wg, node, chan)
