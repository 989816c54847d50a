"""Residual blocks on a traced graph, and their removal.

A *residual block* is a sum ``y = s + f(x)`` (``operator.add``/``iadd``, ``torch.add`` or ``Tensor.add`` of two
tensors of ``y``'s shape) where ``f``, the *branch*, is a set of nodes that all descend from the block input ``x``,
feed nothing but ``y`` and each other, and hold at least one layer with parameters; other inputs of the branch
(an attention mask, constants) must not descend from ``x``. The skip ``s`` is ``x`` itself, reached through
identity operations only (``nn.Identity``, dropout, ``contiguous``), or a *shortcut*: parameter-free operations
of one tensor (the option-A subsample-and-pad of a CIFAR ResNet, a scaled skip). A block with a shortcut is
removable only when its branch is exactly zero (``y`` then *is* its shortcut); a skip through a layer with
parameters (a projection) is not a skip here and such a sum is not a block.

This finds ResNet basic and bottleneck blocks, MobileNetV2 inverted residuals and the attention and MLP
sub-blocks of pre- and post-LN transformer layers (removing both sub-blocks of a layer removes the layer). A sum
whose branch holds other blocks is left alone (its inner blocks are removed one by one).

Removal replaces ``y`` by ``s``; the branch's nodes become dead and go, with the submodules nothing else calls. A
ReLU of a value that a ReLU produced goes too (``relu(relu(v)) = relu(v)``), so a removed ResNet block (``relu(x +
f(x))`` with ``x`` itself a ReLU output) leaves no node at all.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

__all__ = ["Block", "find_blocks", "remove_blocks", "graph_nodes", "blocks_named", "drop_unused_results"]

_ADDS = {operator.add, operator.iadd, torch.add}
_IDENTITY_MODULES = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
_IDENTITY_METHODS = {"contiguous", "clone", "detach"}
_RELU_FUNCTIONS = {F.relu, torch.relu, torch.relu_}
_RELU_METHODS = {"relu", "relu_"}
# operations whose result may share its first input's memory (an in-place write into one reaches the other)
_ALIAS_METHODS = {"contiguous", "detach", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten",
                  "transpose", "permute", "squeeze", "unsqueeze", "expand", "expand_as", "t", "narrow", "select",
                  "as_strided", "unfold", "__getitem__"}
_ALIAS_FUNCTIONS = {operator.getitem, torch.flatten, torch.reshape, torch.transpose, torch.permute, torch.squeeze,
                    torch.unsqueeze, torch.narrow, torch.select, torch.t, torch.detach, torch.unflatten}
_ALIAS_MODULES = (*_IDENTITY_MODULES, nn.Flatten, nn.Unflatten)
# memory formats a skip can be copied into where its layout differs from the sum's (both ONNX exporters take them)
_RELAYOUT = (torch.contiguous_format, torch.channels_last)


@dataclass(frozen=True)
class Block:
    """One residual block of a traced graph, by node names (stable across traces of the same model).

    ``add``: the residual sum; ``skip``: its operand that stays; ``branch``: the nodes removed with it (the branch
    output last); ``modules``: qualified names of the layers the branch calls; ``shortcut``: empty when the skip is
    the block input through identity operations, else the shortcut's operations (``"getitem, pad"``).
    """

    name: str
    add: str
    skip: str
    branch: tuple[str, ...]
    modules: tuple[str, ...]
    shortcut: str = ""

    @property
    def identity(self) -> bool:
        """Whether the skip is the block input itself (the branch can go, whatever it computes)."""
        return not self.shortcut


def graph_nodes(gm: fx.GraphModule) -> dict[str, fx.Node]:
    """The graph's nodes by name."""
    return {n.name: n for n in gm.graph.nodes}


def _shape(node: fx.Node) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def _layout(node: fx.Node) -> tuple[object, tuple[int, ...] | None, torch.memory_format | None]:
    """The dtype, strides and dense memory format (contiguous, channels-last; None for another layout) the trace
    recorded for ``node``'s value."""
    meta = node.meta.get("tensor_meta")
    return (getattr(meta, "dtype", None), tuple(getattr(meta, "stride", ()) or ()) or None,
            getattr(meta, "memory_format", None))


def _sum_operands(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """The two tensor operands of a residual sum node of equal shapes, or None."""
    is_add = ((node.op == "call_function" and node.target in _ADDS)
              or (node.op == "call_method" and node.target in ("add", "add_")))
    if not is_add or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return None
    shape, dtype = _shape(node), _layout(node)[0]
    same = shape is not None and _shape(a) == shape == _shape(b) and _layout(a)[0] == dtype == _layout(b)[0]
    return (a, b) if same else None


def _is_identity(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return type(modules[node.target]) in _IDENTITY_MODULES
    return node.op == "call_method" and node.target in _IDENTITY_METHODS


def _is_alias(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether ``node``'s result may share the memory of its first argument (a view, ``contiguous``, identity)."""
    if not node.args or not isinstance(node.args[0], fx.Node):
        return False
    if node.op == "call_module":
        return isinstance(modules.get(node.target), _ALIAS_MODULES)
    if node.op == "call_method":
        return node.target in _ALIAS_METHODS
    return node.op == "call_function" and node.target in _ALIAS_FUNCTIONS


def _alias_root(node: fx.Node, modules: dict[str, nn.Module]) -> fx.Node:
    """The value ``node`` is a view or alias of (``node`` itself when it owns its memory)."""
    while _is_alias(node, modules):
        node = node.args[0]
    return node


def _alias_group(node: fx.Node, modules: dict[str, nn.Module]) -> set[fx.Node]:
    """``node`` and every value that may share its memory through views and aliases taken of it."""
    group, stack = {node}, [node]
    while stack:
        source = stack.pop()
        for user in source.users:
            if user not in group and _is_alias(user, modules) and user.args[0] is source:
                group.add(user)
                stack.append(user)
    return group


def _single_input(node: fx.Node, modules: dict[str, nn.Module]) -> fx.Node | None:
    """The one tensor input of a parameter-free operation, or None."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return None
    if node.op == "call_module" and any(True for _ in modules[node.target].parameters()):
        return None
    inputs = node.all_input_nodes
    return inputs[0] if len(inputs) == 1 else None


def _in_place(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether the operation writes into its first input (``relu_``, ``inplace=True``, ``nn.ReLU(inplace=True)``)."""
    if node.op == "call_module":
        return bool(getattr(modules.get(node.target), "inplace", False))
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.startswith("_")
    if node.op == "call_function":
        return bool(node.kwargs.get("inplace")) or getattr(node.target, "__name__", "").endswith("_")
    return False


def drop_unused_results(gm: fx.GraphModule) -> fx.GraphModule:
    """Erase the ``getitem`` nodes nothing uses (``x, _ = attn(...)`` leaves one per unused output), so that they do
    not count as readers outside a branch. In place; returns ``gm``."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def _descendants(start: fx.Node) -> set[fx.Node]:
    seen, stack = set(), [start]
    while stack:
        for user in stack.pop().users:
            if user not in seen:
                seen.add(user)
                stack.append(user)
    return seen


def _branch(add: fx.Node, out: fx.Node, below: set[fx.Node], modules: dict[str, nn.Module]
            ) -> list[fx.Node] | None:
    """The nodes of the branch ending at ``out`` (those of its ancestors that descend from the block input,
    ``below``), in graph order, or None when one of them feeds anything outside the branch or writes in place into
    a value from outside it (removing the branch would then change what the rest reads)."""
    members, stack = {out}, [out]
    while stack:
        for arg in stack.pop().all_input_nodes:
            if arg in below and arg not in members:
                members.add(arg)
                stack.append(arg)
    if any(user not in members and user is not add for n in members for user in n.users):
        return None
    if any(n.op in ("placeholder", "output") for n in members):
        return None
    # an in-place write into a branch value that is a view or alias of one from outside writes into that one
    if any(_in_place(n, modules) and n.all_input_nodes and _alias_root(n.all_input_nodes[0], modules) not in members
           for n in members):
        return None
    return [n for n in add.graph.nodes if n in members]


def _candidate(add: fx.Node, skip: fx.Node, out: fx.Node, modules: dict[str, nn.Module]
               ) -> tuple[list[fx.Node], str] | None:
    """(branch nodes, shortcut description) when ``add = skip + out`` is a residual block, else None."""
    chain, x = [], skip
    while x is not None:
        below = _descendants(x)
        if out in below:
            branch = _branch(add, out, below, modules)
            if branch is None or not any(n.op == "call_module" and any(True for _ in modules[n.target].parameters())
                                         for n in branch):
                return None
            shortcut = [n for n in reversed(chain) if not _is_identity(n, modules)]
            return branch, ", ".join(_describe(n) for n in shortcut)
        chain.append(x)
        x = _single_input(x, modules)
    return None


def _describe(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _block_names(found: list[tuple[fx.Node, fx.Node, list[fx.Node], str]]) -> list[str]:
    """Each block's name: the longest common module prefix of the layers its branch calls, with the layers below
    that prefix when two blocks share it (a transformer layer's attention and MLP sub-blocks)."""
    prefixes, children = [], []
    for add, _, branch, _ in found:
        targets = [n.target.split(".") for n in branch if n.op == "call_module"]
        common: list[str] = []
        for parts in zip(*targets):
            if len(set(parts)) != 1:
                break
            common.append(parts[0])
        prefixes.append(".".join(common) or add.name)
        kids = dict.fromkeys(t[len(common)] for t in targets if len(t) > len(common))
        children.append("+".join(kids))
    counts = {p: prefixes.count(p) for p in prefixes}
    names = [p if counts[p] == 1 or not c else f"{p}/{c}" for p, c in zip(prefixes, children)]
    seen = {n: names.count(n) for n in names}  # a layer applied twice (shared weights): one block per application
    return [n if seen[n] == 1 else f"{n}@{add.name}" for n, (add, *_) in zip(names, found)]


def find_blocks(gm: fx.GraphModule) -> tuple[list[Block], list[tuple[str, str]]]:
    """The residual blocks of a traced, shape-propagated graph (see the module docstring), in graph order, and the
    residual sums left alone, as (add node, reason)."""
    modules = dict(gm.named_modules())
    found = []
    for node in gm.graph.nodes:
        operands = _sum_operands(node)
        if operands is None:
            continue
        for skip, out in (operands, operands[::-1]):
            hit = _candidate(node, skip, out, modules)
            if hit is not None:
                found.append((node, skip, *hit))
                break
    adds = {add for add, *_ in found}
    kept, left = [], []
    for entry in found:
        nested = [a.name for a in adds if a in entry[2]]
        (_, strides, dense), skip_strides = _layout(entry[0]), _layout(entry[1])[1]
        if nested:
            left.append((entry[0].name, f"its branch holds the residual blocks at {', '.join(nested)}"))
        elif strides != skip_strides and dense not in _RELAYOUT:  # removal could not give the sum's layout back
            left.append((entry[0].name, f"its skip's memory layout (strides {skip_strides}) differs from the sum's "
                                        f"({strides}), which is neither contiguous nor channels-last"))
        else:
            kept.append(entry)
    names = _block_names(kept)
    blocks = [Block(name, add.name, skip.name, tuple(n.name for n in branch),
                    tuple(dict.fromkeys(n.target for n in branch if n.op == "call_module")), shortcut)
              for name, (add, skip, branch, shortcut) in zip(names, kept)]
    return blocks, left


def _is_relu(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return type(modules.get(node.target)) is nn.ReLU
    if node.op == "call_method":
        return node.target in _RELU_METHODS
    return node.op == "call_function" and node.target in _RELU_FUNCTIONS


def _through_identity(node: fx.Node, modules: dict[str, nn.Module]) -> fx.Node:
    while _is_identity(node, modules) and len(node.all_input_nodes) == 1:
        node = node.all_input_nodes[0]
    return node


def _drop_repeated_relus(gm: fx.GraphModule) -> None:
    """Replace each ReLU whose input is (through identity operations) a ReLU's output by that input."""
    modules = dict(gm.named_modules())
    for node in list(gm.graph.nodes):
        if _is_relu(node, modules) and len(node.all_input_nodes) == 1:
            source = node.all_input_nodes[0]
            if _is_relu(_through_identity(source, modules), modules):
                node.replace_all_uses_with(source)
                _erase_dead(gm.graph, [node])


def _writes_into_skip(add: fx.Node, skip: fx.Node, gone: set[str], modules: dict[str, nn.Module]) -> bool:
    """Whether replacing ``add`` by ``skip`` would let an in-place operation on the sum (or on a view of it) write
    into memory that something else reads: the skip's other readers (through its views and aliases too), the model's
    input (the caller's tensor) or a buffer. A ReLU in place on a skip that is a ReLU's output writes the values it
    holds already (``relu(relu(v)) = relu(v)``), so it changes nothing."""
    idempotent = _is_relu(_through_identity(skip, modules), modules)
    writers = [u for a in _alias_group(add, modules) for u in a.users
               if _in_place(u, modules) and u.args and u.args[0] is a and not (idempotent and _is_relu(u, modules))]
    if not writers:
        return False
    root = _alias_root(skip, modules)
    group = _alias_group(root, modules)
    readers = [u for a in group for u in a.users if u not in group and u is not add and u.name not in gone]
    return bool(readers) or root.op in ("placeholder", "get_attr")


def remove_blocks(gm: fx.GraphModule, blocks: Iterable[Block]) -> fx.GraphModule:
    """A copy of ``gm`` with each block's sum replaced by its skip and the dead branch, unused layers and repeated
    ReLUs gone. Exact for identity skips: the result computes the original with those branches set to zero. The skip
    is copied where an in-place operation after the sum would otherwise write into it (:func:`_writes_into_skip`),
    and given the sum's memory format where its own strides differ (a later ``view`` needs the sum's layout)."""
    new = copy.deepcopy(gm)
    nodes = graph_nodes(new)
    dead: list[fx.Node] = []
    instead: dict[str, fx.Node] = {}  # a removed sum -> what replaced it (the skip of one block can be another's sum)
    modules = dict(new.named_modules())
    blocks = sorted(blocks, key=lambda b: list(nodes).index(b.add))
    gone = {n for b in blocks for n in (b.add, *b.branch)}
    for block in blocks:
        add, skip = nodes[block.add], instead.get(block.skip, nodes[block.skip])
        (_, strides, dense), skip_strides = _layout(add), _layout(nodes[block.skip])[1]
        relayout = dense in _RELAYOUT and strides != skip_strides
        copy_it = _writes_into_skip(add, skip, gone, modules)
        if copy_it or relayout:
            with new.graph.inserting_after(skip):
                if copy_it:  # in the sum's format where the layouts differ, else the skip's own
                    skip = new.graph.call_method("clone", (skip,), {"memory_format": dense} if relayout else {})
                else:
                    fmt = {} if dense is torch.contiguous_format else {"memory_format": dense}
                    skip = new.graph.call_method("contiguous", (skip,), fmt)
        add.replace_all_uses_with(skip)
        instead[block.add] = skip
        dead.append(add)
    attrs = {n.target for n in new.graph.nodes if n.op == "get_attr"}
    _erase_dead(new.graph, dead)
    _drop_repeated_relus(new)
    new.graph.lint()
    new.delete_all_unused_submodules()
    _delete_unread_attributes(new, attrs - {n.target for n in new.graph.nodes if n.op == "get_attr"})
    new.recompile()
    return new


def _delete_unread_attributes(gm: fx.GraphModule, targets: Iterable[str]) -> None:
    """Delete the parameters and buffers named ``targets`` that only removed nodes read (a layer scale ``gamma *
    f(x)`` held by the model itself, not by a layer of the branch), unless a layer still called owns them."""
    called = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    for target in targets:
        owner, _, name = target.rpartition(".")
        if any(owner == c or owner.startswith(c + ".") for c in called):
            continue
        try:
            module = gm.get_submodule(owner)
        except AttributeError:  # its module went with the branch
            continue
        if name in module._parameters or name in module._buffers:
            delattr(module, name)


def _erase_dead(graph: fx.Graph, dead: list[fx.Node]) -> None:
    """Erase the ``dead`` nodes, then every input of an erased node left without users (a removed branch goes
    whole, with what only it used; nodes that were unused before are not touched)."""
    while dead:
        node = dead.pop()
        if node.users or node.op in ("placeholder", "output") or getattr(node, "_erased", False):
            continue
        inputs = node.all_input_nodes
        graph.erase_node(node)
        dead.extend(inputs)


def blocks_named(blocks: Sequence[Block], names: Iterable[str]) -> list[Block]:
    """The blocks with those names, in the given order."""
    by_name = {b.name: b for b in blocks}
    return [by_name[n] for n in names]
