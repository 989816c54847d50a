"""Multiply-accumulate (MAC) counts: per layer by rules run from forward hooks (what the allocators use), and
for the whole model by torch's own :class:`torch.utils.flop_counter.FlopCounterMode` (what reports state).

The two agree exactly on models made only of layers with a rule (Linear, Conv1d/2d/3d incl. grouped, and
factorised pairs of them): torch counts 2·MACs FLOPs per matmul/convolution and ignores bias adds, as the rules
do. They differ where the rules see no layer (a module calling ``torch.matmul``, attention's score and value
products) and inside SSM layers, whose rule counts the recurrence x⁺ = Ax + Bu, y = Cx + Du while torch counts
the matmuls the PyTorch implementation runs (the projections B·u and C·x, the chunked kernel convolution; an
FFT it has no formula for, which :class:`TorchCount` lists in ``uncounted_ops``). The whole-model count
(:func:`whole_model_macs`, :func:`model_macs`) is torch's, with SSM layers counted by their rule; CPU fused attention,
for which torch has no formula, by ours (the score and value products, as torch counts attention on GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from .evaluate import eval_mode, hooks_removed
from .inputs import Inputs, args_of, call

__all__ = ["LayerCost", "CostTable", "count_costs", "linear_macs", "conv_macs", "register_mac_rule", "MacRule",
           "attention_macs", "TorchCount", "count_macs_torch", "model_macs", "uncovered_modules", "whole_model_macs",
           "mac_rule", "computes_as", "node_flops"]


@dataclass
class LayerCost:
    """Cost of one counted layer for one sample of the example input."""

    name: str
    kind: str
    params: int
    macs: int
    positions: int = 1
    defines_cost: bool = False
    """The rule is the layer's cost in the whole-model count too (:func:`register_mac_rule`'s ``defines_cost``)."""


@dataclass
class CostTable:
    """Per-layer costs; layers with parameters that are not counted are listed by name."""

    layers: dict[str, LayerCost] = field(default_factory=dict)
    not_counted: list[str] = field(default_factory=list)
    total_params: int = 0

    @property
    def macs(self) -> int:
        return sum(c.macs for c in self.layers.values())

    @property
    def counted_params(self) -> int:
        return sum(c.params for c in self.layers.values())


def linear_macs(layer: nn.Linear, out: torch.Tensor) -> int:
    """MACs of a Linear layer per sample: rows × in × out."""
    rows = math.prod(out.shape[1:-1]) if out.dim() > 1 else 1
    return rows * layer.in_features * layer.out_features


def conv_macs(layer: nn.modules.conv._ConvNd, out: torch.Tensor) -> int:
    """MACs of a convolution per sample: output positions × C_out × (C_in/groups) × prod(kernel)."""
    positions = math.prod(out.shape[2:])
    k = math.prod(layer.kernel_size)
    return positions * layer.out_channels * (layer.in_channels // layer.groups) * k


def attention_macs(layer: nn.MultiheadAttention, out: torch.Tensor) -> int:
    """MACs of ``nn.MultiheadAttention``'s four projections, as the same layer written with four Linears would be
    counted: per query position E² (query) + E² (output), per key position E·kdim + E·vdim, keys taken as long as
    the queries (self-attention). The score and value products (L·S·E each) are left to the torch count, as they
    are for attention written with plain Linears. ``out`` is the attention output; with ``batch_first=False`` the
    count is for the whole batch (the caller divides by the batch size)."""
    positions = math.prod(out.shape[1:-1]) if layer.batch_first else math.prod(out.shape[:-1])
    e = layer.embed_dim
    return positions * (2 * e * e + e * layer.kdim + e * layer.vdim)


MacRule = Callable[[nn.Module, torch.Tensor], int]  # (layer, its output) -> MACs per sample

_MAC_RULES: dict[type, MacRule] = {
    nn.Linear: linear_macs,
    nn.Conv1d: conv_macs,
    nn.Conv2d: conv_macs,
    nn.Conv3d: conv_macs,
    nn.MultiheadAttention: attention_macs,
}


#: Layer types whose rule is their cost in the whole-model count (:func:`whole_model_macs`), not torch's count.
_DEFINING: set[type] = set()


def register_mac_rule(module_type: type, rule: MacRule, defines_cost: bool = False) -> None:
    """Count MACs of ``module_type`` layers with ``rule`` (per sample); a second rule for a type is an error.

    ``defines_cost``: the whole-model count takes the rule for such a layer instead of torch's count of it, for a
    layer whose computation in torch depends on the path its forward takes, not on its structure (an SSM layer
    runs an FFT in eager mode, which torch cannot count, and a chunked convolution, whose cost is the chunk
    size's, when exported or in another form): its before and after would otherwise be counted two ways.
    """
    if module_type in _MAC_RULES:
        raise ValueError(f"a MAC rule for {module_type.__name__} is already registered")
    _MAC_RULES[module_type] = rule
    if defines_cost:
        _DEFINING.add(module_type)


#: The methods in which a layer's computation lives: a subclass inheriting them computes what its base does.
_COMPUTATION = ("forward", "_conv_forward")


def computes_as(module: nn.Module, kinds: Container[type]) -> type | None:
    """The class among ``kinds`` whose computation ``module`` runs, or None.

    That is ``module``'s nearest class in its MRO that is among ``kinds`` (its own class first), provided the
    module's class inherits that class's ``forward`` and, for convolutions, ``_conv_forward`` unchanged: a
    subclass that only builds the layer its own way (torchvision's video ``Conv3DSimple(nn.Conv3d)``) computes as
    its base; one overriding either (timm's ``StdConv2d``, which standardises its weight) does not.
    """
    cls = type(module)
    base = next((c for c in cls.__mro__ if c in kinds), None)
    if base is None or any(getattr(cls, f, None) is not getattr(base, f, None) for f in _COMPUTATION):
        return None
    return base


def mac_rule(module: nn.Module) -> MacRule | None:
    """The MAC rule that counts ``module``: its class's, or that of the registered base it computes as
    (:func:`computes_as`); None for a layer with no rule."""
    base = computes_as(module, _MAC_RULES)
    return None if base is None else _MAC_RULES[base]


def _own_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters(recurse=False))


def count_costs(model: nn.Module, example_input: Inputs) -> CostTable:
    """Count params and per-sample MACs of every layer with a MAC rule by running ``example_input`` once.

    Linear/Conv have rules here; other packages add theirs with :func:`register_mac_rule` (SSM layers). A
    subclass of a ruled layer is counted by its base's rule when it computes as its base (:func:`mac_rule`).
    A layer whose output's first dimension is not the batch is counted whole and divided by the batch size. Modules
    with their own parameters and no rule (BatchNorm, ...) are listed in ``not_counted``. A layer no sample of
    ``example_input`` reaches (an expert its gate never picks) is not in the table: finding the layers to compress
    passes several samples, a whole-model count one (:func:`count_macs_torch` counts one too).
    """
    table = CostTable(total_params=sum(p.numel() for p in model.parameters()))
    batch = len(example_input)
    hooks = []

    def make_hook(name: str, rule):
        def hook(mod: nn.Module, _inp, out: torch.Tensor | tuple) -> None:
            out = out[0] if isinstance(out, tuple) else out  # MultiheadAttention: (output, weights)
            macs = rule(mod, out) if out.shape[0] == batch else rule(mod, out) // max(batch, 1)
            prev = table.layers.get(name)
            total = macs + (prev.macs if prev else 0)
            positions = 1 if out.dim() <= 2 else (math.prod(out.shape[1:-1])
                                                  if isinstance(mod, (nn.Linear, nn.MultiheadAttention))
                                                  else math.prod(out.shape[2:]))
            table.layers[name] = LayerCost(name, type(mod).__name__, _own_params(mod), total, positions,
                                           computes_as(mod, _DEFINING) is not None)
        return hook

    for name, mod in model.named_modules():
        rule = mac_rule(mod)
        if rule is not None:
            hooks.append(mod.register_forward_hook(make_hook(name, rule)))
        elif _own_params(mod) > 0:
            table.not_counted.append(name or type(mod).__name__)
    with hooks_removed(hooks), eval_mode(model), torch.no_grad():
        call(model, example_input)
    return table


def _fused_attention_flops(query_shape: Any, key_shape: Any, value_shape: Any, *_: Any, **__: Any) -> int:
    """FLOPs of fused attention (2 per multiply-add) from its query (..., L, E), key (..., S, E) and value
    (..., S, Ev) shapes: the score product L·S·E and the value product L·S·Ev for each of the query's leading
    (batch, head) indices, as torch counts attention on GPUs; key and value heads shared by several query heads
    (grouped-query attention) count once per query head, as the kernel computes them. A causal mask is not
    subtracted (torch's own formula does not either)."""
    *lead, length, features = query_shape
    return 2 * math.prod(lead) * length * key_shape[-2] * (features + value_shape[-1])


#: Formulas torch's FlopCounterMode lacks: CPU fused attention (``F.scaled_dot_product_attention`` and
#: ``nn.MultiheadAttention(need_weights=False)`` on CPUs), the op torch counts on GPUs as
#: ``aten._scaled_dot_product_flash_attention``.
_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _fused_attention_flops}

#: Substrings of aten op names that do heavy arithmetic but may have no FlopCounterMode formula (FFTs, the fused
#: attention of ``nn.MultiheadAttention``'s inference fast path); such ops seen during a count are listed in
#: :attr:`TorchCount.uncounted_ops`, and the modules they ran in in :attr:`TorchCount.uncounted_in`.
_HEAVY_OPS = ("fft", "attention", "transformer")


@dataclass
class TorchCount:
    """Whole-model MACs of one forward pass on one sample, as :class:`FlopCounterMode` counts them (FLOPs / 2).

    Attributes
    ----------
    macs : int
        Total MACs.
    by_op : dict of str to int
        MACs per aten op (``"aten.addmm"``, ``"aten.convolution"``, ...).
    own_macs : dict of str to int
        MACs per module name (``""`` is the root) not inside any of its submodules' calls; only non-zero entries.
    uncounted_ops : list of str
        Heavy ops torch ran but has no formula for (e.g. ``aten._fft_r2c``); their cost is missing from ``macs``.
    module_macs : dict of str to int
        MACs per module name including its submodules (``""`` is the root).
    uncounted_in : list of str or None
        The modules (``""`` is the root; sorted, each once) in which ops of ``uncounted_ops`` ran, the innermost
        running module for each op; None where not known (this torch's counter does not say, a count made by hand):
        then every ruled layer may be short.
    """

    macs: int
    by_op: dict[str, int] = field(default_factory=dict)
    own_macs: dict[str, int] = field(default_factory=dict)
    uncounted_ops: list[str] = field(default_factory=list)
    module_macs: dict[str, int] = field(default_factory=dict)
    uncounted_in: list[str] | None = None


class _UncountedOps(TorchDispatchMode):
    """Records the heavy ops that have no flop formula and the innermost module each ran in (run inside
    ``counter``, whose module tracker names the modules running, ``Root.child.sub``)."""

    def __init__(self, counter: FlopCounterMode, root: str) -> None:
        super().__init__()
        self.seen: set[str] = set()
        self.tracker, self.root = getattr(counter, "mod_tracker", None), root
        self.places: set[str] | None = set() if hasattr(self.tracker, "parents") else None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = str(func.overloadpacket)
        if func.overloadpacket not in flop_registry and func.overloadpacket not in _FORMULAS \
                and any(h in name for h in _HEAVY_OPS):
            self.seen.add(name)
            if self.places is not None:
                running = [p for p in self.tracker.parents if p == self.root or p.startswith(self.root + ".")]
                self.places.add(max(running, key=len, default=self.root)[len(self.root) + 1:])
        return func(*args, **(kwargs or {}))


def _module_totals(counts: dict[str, dict[Any, int]], root: str) -> dict[str, int]:
    """FlopCounterMode's per-module FLOPs (keys ``Root.child.sub``) as MACs by module name (``""`` = root)."""
    out = {}
    for key, ops in counts.items():
        if key == root or key.startswith(root + "."):
            out[key[len(root) + 1:]] = sum(ops.values()) // 2
    return out


def _own_totals(totals: dict[str, int]) -> dict[str, int]:
    """Inclusive per-module totals minus those of the nearest counted submodules (a module's own work)."""
    own = dict(totals)
    for name, total in totals.items():
        if name:
            prefixes = [name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)] + [""]
            parent = next(p for p in prefixes if p in totals)
            own[parent] -= total
    return own


def count_macs_torch(model: nn.Module, example_input: Inputs) -> TorchCount:
    """Count whole-model MACs with torch's FlopCounterMode on the first sample of ``example_input``.

    Runs in eval mode with autograd enabled and the floating-point parameters requiring gradients (frozen ones for
    the count only), so modules with an inference fast path (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``)
    take the composite path that export traces and torch can count; nothing is trained. A forward that cannot run
    so (it changes a frozen parameter in place, or mixes in tensors made under inference mode) is counted with the
    flags as they are. Module names are the model's own (its first name for a module it holds twice).
    """
    return _thawed_if_it_runs(model, lambda: _count(model, example_input))


def _thawed_if_it_runs(model: nn.Module, count: Callable[[], Any]) -> Any:
    """``count()`` with ``model``'s frozen parameters thawed (:func:`_grads_required`), or, where the forward cannot
    run so (it changes one in place, it mixes in tensors made under inference mode), with the flags as they are:
    counted as it runs, fast paths and all."""
    thawed: list[nn.Parameter] = []
    try:
        with _grads_required(model) as thawed:
            return count()
    except Exception:
        if not thawed:
            raise
    return count()


def _count(model: nn.Module, example_input: Inputs) -> TorchCount:
    """:func:`count_macs_torch`'s count, the parameters' flags as they are."""
    root = type(model).__name__
    counter = FlopCounterMode(display=False, custom_mapping=_FORMULAS)
    uncounted = _UncountedOps(counter, root)
    with eval_mode(model), torch.enable_grad(), counter, uncounted:
        call(model, example_input[:1])
    names = _canonical_names(model, counter, root)
    totals = {names.get(k, k): v for k, v in _module_totals(counter.get_flop_counts(), root).items()}
    own = _own_totals(totals)
    by_op = {str(op): n // 2 for op, n in counter.get_flop_counts().get("Global", {}).items()}
    places = None if uncounted.places is None else sorted({names.get(p, p) for p in uncounted.places})
    return TorchCount(counter.get_total_flops() // 2, by_op, {k: v for k, v in own.items() if v > 0},
                      sorted(uncounted.seen), totals, places)


def _canonical_names(model: nn.Module, counter: FlopCounterMode, root: str) -> dict[str, str]:
    """The counter's module names (``Root.`` dropped) → the module's first name in ``model.named_modules()``, the
    name the rules use: torch's module tracker names a module shared by two parents after the last one. Empty (the
    names taken as they are) where this torch's tracker keeps no map of modules to names."""
    known = getattr(getattr(counter, "mod_tracker", None), "_known_modules", None)
    if known is None:
        return {}
    names: dict[str, str] = {}
    for name, module in model.named_modules():
        tracked = known.get(module)
        if isinstance(tracked, str) and (tracked == root or tracked.startswith(root + ".")):
            names.setdefault(tracked[len(root) + 1:], name)
    return names


@contextmanager
def _grads_required(model: nn.Module) -> Iterator[list[nn.Parameter]]:
    """Frozen floating-point parameters of ``model`` require gradients inside the block (the inference fast paths of
    attention layers run when none does, and torch cannot count them) and are frozen again after it, also when
    setting a flag fails; yields those it thawed. Tensors made under inference mode are left as they are."""
    thawed: list[nn.Parameter] = []
    try:
        for p in model.parameters():
            if not p.requires_grad and p.is_floating_point() and not p.is_inference():
                try:
                    p.requires_grad_(True)
                except RuntimeError:  # a tensor that cannot require gradients (a view, say): left frozen
                    continue
                thawed.append(p)
        yield thawed
    finally:
        for p in thawed:
            p.requires_grad_(False)


def node_flops(gm: fx.GraphModule, example_input: Inputs) -> dict[str, int]:
    """torch's FLOPs of each node of a traced graph on the first sample of ``example_input``, by node name: one forward
    through an fx interpreter, counted as :func:`count_macs_torch` counts (eval mode, autograd on, frozen parameters
    thawed for the count, or as they are where the forward cannot run so, the same formulas). Their sum halved is
    torch's whole-model MAC count of ``gm``; ops torch cannot count and the layers whose rule defines their cost
    (:func:`whole_model_macs`) are not in them."""
    return _thawed_if_it_runs(gm, lambda: _node_flops(gm, example_input))


def _node_flops(gm: fx.GraphModule, example_input: Inputs) -> dict[str, int]:
    """:func:`node_flops`'s count, the parameters' flags as they are."""
    counter = FlopCounterMode(display=False, custom_mapping=_FORMULAS)
    flops: dict[str, int] = {}

    class _Counted(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            before = counter.get_total_flops()
            out = super().run_node(n)
            flops[n.name] = counter.get_total_flops() - before
            return out

    with eval_mode(gm), torch.enable_grad(), counter:
        _Counted(gm).run(*args_of(example_input[:1]))
    return flops


def model_macs(model: nn.Module, example_input: Inputs) -> int:
    """The whole model's MACs of one sample, as compression reports state them and budgets count them:
    :func:`whole_model_macs` of torch's count and the rules' on the first sample of ``example_input``."""
    return whole_model_macs(count_macs_torch(model, example_input), count_costs(model, example_input[:1]))


def whole_model_macs(count: TorchCount, rules: CostTable) -> int:
    """torch's count, with the layers whose rule defines their cost (SSM layers, :func:`register_mac_rule`)
    counted by their rule, and each other ruled layer in which torch ran an op it has no formula for counted by its
    rule where that is more.

    Without this, an SSM layer would count as nearly free where its forward runs an FFT (eager mode) and as its
    chunked convolution where it does not (its compressed form, or when exported), so a truncation to half the
    states could count as three times the MACs. A layer inside one whose rule defines its cost is in that rule, and
    an op torch cannot count inside such a layer is too. Only the innermost ruled layer around each uncounted op is
    topped up (an outer layer's rule covers that layer's, and its own work torch counted); where this torch does
    not say in which module an op ran, every ruled layer is.
    """
    defining = [name for name, layer in rules.layers.items() if layer.defines_cost]
    top = [name for name in defining if not _inside(name, defining)]
    total = count.macs + sum(rules.layers[name].macs - count.module_macs.get(name, 0) for name in top)
    ruled = [name for name in rules.layers if name not in top and not _inside(name, top)]
    if count.uncounted_in is None:  # not known where: every ruled layer may be short
        under = ruled if count.uncounted_ops else []
    else:
        places = [p for p in count.uncounted_in if p not in top and not _inside(p, top)]
        under = {max((n for n in ruled if n == p or _inside(p, [n])), key=len, default=None) for p in places} - {None}
    return total + sum(max(0, rules.layers[name].macs - count.module_macs.get(name, 0)) for name in under)


def _inside(name: str, outer: list[str]) -> bool:
    """Whether module ``name`` is a submodule of one of ``outer`` (``""`` is the root)."""
    return any(o != name and (o == "" or name.startswith(o + ".")) for o in outer)


def uncovered_modules(model: nn.Module, count: TorchCount) -> list[str]:
    """Modules in which torch counted MACs that no per-layer rule covers (their own work, not a ruled child's).

    A module with a rule (and everything inside it) is covered; ``""`` names work done by the root itself.
    ``nn.MultiheadAttention``'s rule counts its projections only, so its score and value products stay uncovered.
    """
    ruled = [name for name, mod in model.named_modules() if mac_rule(mod) is not None
             and not isinstance(mod, nn.MultiheadAttention)]
    inside = lambda name: any(name == r or name.startswith(r + ".") or not r for r in ruled)  # noqa: E731
    return sorted(name or type(model).__name__ for name in count.own_macs if not inside(name))
