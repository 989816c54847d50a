"""Tests for minreal.compress.core.width.graph: channel groups found on the traced graph, and what it refuses."""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Callable
from pathlib import Path

import minreal_width_zoo as zoo  # registered by this folder's conftest.py
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minreal.compress.core.width
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.width import Cut, analyse, apply_cuts


def test_option_a_shortcut_joins_the_16_32_64_channel_streams_in_one_group(analysed) -> None:
    """He et al. (2016) §4.2 option A pads the 16-channel stream to 32 and 64 with zeros: one group of 64 atoms,
    the narrower stream at its pad offset inside the wider one."""
    a = analysed("resnet20")
    g = a.wg.group("conv1")
    assert g.size == 64 and not g.frozen
    assert {u.target for u in g.uses if u.role == "producer"} == \
        {"conv1"} | {f"layer{i}.{j}.conv2" for i in (1, 2, 3) for j in range(3)}
    assert {len(a.wg.channel_atoms(g, v)) for v in g.values} == {16, 32, 64}
    pads = [rw for rw in a.wg.rewrites if rw.kind == "pad"]
    assert [(rw.before, rw.after) for rw in pads] == [(8, 8), (16, 16)]
    stem = next(u.source for u in g.uses if u.target == "layer1.0.conv1")
    wide, widest = (a.wg.channel_atoms(g, rw.node) for rw in pads)
    assert wide[8:24] == a.wg.channel_atoms(g, stem) and widest[16:48] == wide
    assert sorted(widest) == list(range(64))


def test_width_analysis_does_not_use_torch_pruning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch-Pruning's DepGraph ties F.pad's streams position by position (see analysis.py): not a dependency.
    A ``None`` entry in ``sys.modules`` makes any import of it fail while the analysis and a cut run."""
    monkeypatch.setitem(sys.modules, "torch_pruning", None)
    model, x = zoo.build("resnet20"), zoo.example("resnet20")
    wg = analyse(model, x)
    assert apply_cuts(wg, zoo.cuts_of(wg))(x).shape == (2, 10)
    imported = set()
    for path in Path(minreal.compress.core.width.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    assert not {name for name in imported if name.split(".")[0] == "torch_pruning"}


def test_flatten_repeats_each_channel_once_per_spatial_position(analysed) -> None:
    a = analysed("flat_cnn")
    g = a.wg.group("conv2")
    fc_input = next(u.source for u in g.uses if u.target == "fc")
    assert a.wg.channel_atoms(g, fc_input) == [c for c in range(12) for _ in range(4 * 4)]


def test_grouped_conv_ties_each_conv_group_into_one_atom(grouped_cnn: nn.Module) -> None:
    """Conv(3→16) → Conv(16→32, groups=4) → depthwise Conv(32, groups=32): the 4 conv groups are the atoms."""
    wg = analyse(grouped_cnn, torch.randn(2, 3, 12, 12))
    g = wg.group("0")
    assert g.size == 4 and not g.frozen
    assert wg.channel_atoms(g, "_1") == [k for k in range(4) for _ in range(4)]  # grouped conv: 4 inputs per group
    assert wg.channel_atoms(g, "_5") == [k for k in range(4) for _ in range(8)]  # depthwise: 8 outputs per group


def test_model_input_and_output_channels_are_frozen(analysed) -> None:
    a = analysed("small_cnn")
    frozen = {g.name: g.frozen for g in a.wg.groups if g.frozen}
    assert frozen == {"0:in": "input_1: model input", "11": "_11: model output"}


class _PicksChannel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(x))
        return self.conv2(h) + h[:, 3].unsqueeze(1)


class _UnknownOp(_PicksChannel):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.cumsum(self.conv1(x), dim=1))


class _UnknownLayer(_PicksChannel):
    def __init__(self) -> None:
        super().__init__()
        self.lrn = nn.LocalResponseNorm(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.lrn(self.conv1(x)))


class _Chunks(nn.Module):
    """A gated unit: the conv's 16 channels split in halves (whose sizes a cut would change)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 16, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.chunk(self.conv1(x), 2, dim=1)
        return self.conv2(a * torch.sigmoid(b))


class _UsesAttentionWeights(nn.Module):
    """A cut attention layer (SlimAttention) does not return the attention weights."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.attn, self.conv2 = nn.Linear(6, 16), nn.MultiheadAttention(16, 4, batch_first=True), \
            nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x)
        out, weights = self.attn(h, h, h)
        return self.conv2(out) + weights.sum(-1, keepdim=True)


class _BiasKV(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.attn, self.conv2 = nn.Linear(6, 16), nn.MultiheadAttention(16, 4, add_bias_kv=True), \
            nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x)
        return self.conv2(self.attn(h, h, h, need_weights=False)[0])


UNSUPPORTED = [
    pytest.param(_PicksChannel, "getitem", "indexing into the channel dimension", id="x[:, 3]"),
    pytest.param(_UnknownOp, "cumsum", "operation 'cumsum' is not understood", id="unknown-op"),
    pytest.param(_UnknownLayer, "lrn", "LocalResponseNorm is not understood", id="unknown-layer"),
    pytest.param(_Chunks, "chunk", "'chunk' that does not return one tensor", id="chunk"),
    pytest.param(_UsesAttentionWeights, "getitem_1", "attention weights are used", id="attention-weights"),
    pytest.param(_BiasKV, "attn", "bias_k/bias_v", id="attention-bias-kv"),
]


@pytest.mark.parametrize(("factory", "node", "reason"), UNSUPPORTED)
def test_unsupported_pattern_freezes_its_group_and_names_the_node(factory: Callable[[], nn.Module], node: str,
                                                                    reason: str) -> None:
    model = factory().eval()
    x = torch.randn(2, 3, 8, 8) if isinstance(model.conv1, nn.Conv2d) else torch.randn(5, 2, 6)
    wg = analyse(model, x)
    g = wg.group("conv1")
    assert g.frozen.startswith(f"{node}: ") and reason in g.frozen
    assert (node, g.frozen.split(": ", 1)[1]) in wg.unsupported
    assert g not in wg.cuttable()
    with pytest.raises(CompressionError, match=f"'conv1' cannot be cut: {node}: ") as info:
        apply_cuts(wg, {"conv1": Cut(range(g.size - 1))})
    assert "\n" not in str(info.value)
    with torch.no_grad():  # keeping a frozen group whole is allowed and changes nothing
        assert torch.equal(apply_cuts(wg, {"conv1": Cut(range(g.size))})(x), model(x))


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y * 2 if y.sum() > 0 else F.relu(y)


def test_data_dependent_control_flow_is_one_line_error() -> None:
    with pytest.raises(CompressionError, match="cannot be traced") as info:
        analyse(_Branches(), torch.randn(2, 4))
    assert "\n" not in str(info.value) and "_Branches" in str(info.value)


def test_an_untraceable_model_is_refused_with_the_line_of_its_code_and_a_way_out() -> None:
    """zoo (issue 44): torchvision's detection models were refused in torch.fx's words, cut mid-word ("Proxy object
    cannot be iterated. This can be attempted when ... for a more detailed explanatio"): the refusal names the line
    of the model's own code where tracing stopped, torch's first sentence, and what to do instead."""
    lines, start = inspect.getsourcelines(_Branches.forward)
    line = start + next(i for i, text in enumerate(lines) if "y.sum() > 0" in text)
    with pytest.raises(CompressionError) as info:
        analyse(_Branches(), torch.randn(2, 4))
    said = str(info.value)
    assert f"_Branches cannot be traced at {Path(__file__).name}:{line} (forward): TraceError: " in said
    assert said.endswith("give a factory returning the part that traces (e.g. the backbone) or use factorize, "
                         "which needs no trace")
    assert "\n" not in said


class _DecoratedKwargs(nn.Module):
    """A forward wrapped by a decorator and taking **kwargs, as transformers 5 writes GPT2LMHeadModel's."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 4)

    def _forward(self, x: torch.Tensor, /, scale: float = 1.0, *, shift: float = 0.0, **kwargs: object
                 ) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x))) * scale + shift


def test_a_decorated_forward_taking_kwargs_is_traced_with_its_decorator() -> None:
    """Review: a GPT2LMHeadModel given directly was refused as "co_varnames is too small (Python control flow on a
    tensor)": torch.fx cannot trace a decorated root forward that takes **kwargs. The trace now calls the decorated
    forward from one with the unwrapped signature's parameters (positional-only, defaults and keyword-only kept): the
    decorator still runs (it doubles the output here), the hidden width may shrink, and every channel kept gives the
    model back exactly; the model itself is left as it was."""
    import functools

    def doubled(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: object, **kwargs: object) -> object:
            return 2 * fn(*args, **kwargs)
        return call

    class Model(_DecoratedKwargs):
        forward = doubled(_DecoratedKwargs._forward)

    torch.manual_seed(0)
    model, x = Model().eval(), torch.randn(2, 4)
    wg = analyse(model, x)
    assert [g.name for g in wg.cuttable()] == ["fc1"] and not wg.gm.meta["opaque"]
    with torch.no_grad():
        assert torch.equal(wg.gm(x), model(x)) and torch.equal(apply_cuts(wg, {"fc1": Cut(range(16))})(x), model(x))
        assert torch.equal(model(x), 2 * model.fc2(F.relu(model.fc1(x))))
    assert type(model) is Model and "forward" in vars(Model)


def _logged(forward: Callable) -> Callable:
    """A decorator on ``forward``, as transformers wraps its layers' (the traceback holds the wrapped function)."""
    import functools

    @functools.wraps(forward)
    def wrapper(*args: object, **kwargs: object) -> object:
        return forward(*args, **kwargs)
    return wrapper


class _DecoratedBranches(_Branches):
    @_logged
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class _GatedMLP(nn.Module):
    """A block torch.fx cannot trace (a branch on a tensor, as a Hugging Face attention's shape arithmetic), then an
    MLP it can."""

    def __init__(self, gate: nn.Module) -> None:
        super().__init__()
        self.gate, self.fc1, self.fc2 = gate, nn.Linear(4, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(self.gate(x))))


@pytest.mark.parametrize("gate", [_Branches, _DecoratedBranches])
def test_a_block_fx_cannot_trace_is_kept_whole_and_the_rest_is_cut(gate: type) -> None:
    """zoo (issue 44): every Hugging Face model was refused by the width methods because torch.fx cannot trace its
    attention and embedding layers. A submodule whose forward stops the trace (decorated or not) is kept whole as one
    layer, its channels as they are, and the MLP after it is a group that may shrink; keeping every channel gives the
    model back exactly, and the report names the block kept whole. A failure in the model's own forward is still
    refused (the tests above)."""
    from minreal.compress import compress
    from minreal.compress.core.data import Dataset
    from minreal.compress.methods.wanda import WandaConfig

    torch.manual_seed(0)
    model = _GatedMLP(gate()).eval()
    x = torch.randn(2, 4)
    wg = analyse(model, x)
    assert list(wg.gm.meta["opaque"]) == [gate.__name__]
    assert "cannot be used as inputs to control flow" in wg.gm.meta["opaque"][gate.__name__]
    hidden = wg.group("fc1")
    assert hidden.size == 32 and not hidden.frozen and [g.name for g in wg.cuttable()] == ["fc1"]
    with torch.no_grad():
        assert torch.equal(apply_cuts(wg, {"fc1": Cut(range(32))})(x), model(x))
    data = Dataset(torch.randn(64, 4))
    new, report = compress(model, data, "wanda", WandaConfig(mac_ratio=0.7, width_multiple=4))
    # the gate's 16 MACs whole, the hidden width 32 -> 20 (24 would be 0.76): (16 + 2 * 4 * 20) / 272
    assert report.mac_ratio == pytest.approx((16 + 2 * 4 * 20) / (16 + 2 * 4 * 32), abs=1e-12)
    assert any(n.startswith("kept whole as single layers") and gate.__name__ in n for n in report.notes)
    with torch.no_grad():
        assert new(data.x).shape == model(data.x).shape


class _Masked(nn.Module):
    """A Hugging Face-style forward: an optional mask the caller may leave out, and outputs filtered by type."""

    def __init__(self, filtered: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2, self.filtered = nn.Linear(4, 16), nn.Linear(16, 4), filtered

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> dict:
        if mask is not None and mask.ndim == 2:  # a placeholder for mask would make this a branch on a tensor
            x = x * mask
        out = {"hidden": self.fc2(F.relu(self.fc1(x))), "note": "not a tensor"}
        if self.filtered:  # a traced value is a Proxy, not a Tensor: the trace would return an empty dict
            return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        return {"hidden": out["hidden"]}


def test_parameters_the_example_does_not_feed_are_traced_at_their_defaults() -> None:
    """The hub's Hugging Face wrappers take ``attention_mask=None``: traced as a placeholder it was a tensor, and the
    model's ``mask.ndim == 2`` a branch on a tensor, so every Hugging Face model was refused."""
    x, model = torch.randn(2, 4), _Masked()
    wg = analyse(model, x)
    assert [g.name for g in wg.cuttable()] == ["fc1"] and not wg.gm.meta["opaque"]
    with torch.no_grad():  # the graph runs on the input alone and computes what the model does without a mask
        assert torch.equal(wg.gm(x)["hidden"], model(x)["hidden"])
        assert torch.equal(apply_cuts(wg, {"fc1": Cut(range(16))})(x)["hidden"], model(x)["hidden"])


def test_a_trace_that_returns_less_than_the_model_is_refused() -> None:
    """Code that keeps only values that are tensors keeps none of torch.fx's Proxies: the graph would return an
    empty dict (the hub's wrappers did, before they kept Proxies). The trace is compared with the model's own
    outputs and refused in one line."""
    with pytest.raises(CompressionError, match=r"^the torch.fx graph of _Masked returns 0 tensor\(s\) where the "
                                               r"model returns 1 .*use factorize"):
        analyse(_Masked(filtered=True), torch.randn(2, 4))


class _Counting(nn.Module):
    """Decides a value in Python when it runs (a call counter): the trace bakes in the value it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.calls = nn.Linear(4, 4), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(x) * self.calls


def test_a_trace_that_computes_other_values_than_the_model_is_refused() -> None:
    with pytest.raises(CompressionError, match=r"^the torch.fx graph of _Counting computes other values than the "
                                               r"model on the example \(a batch of 2; output 0: largest difference"):
        analyse(_Counting(), torch.randn(2, 4))


def _scaled(sizes: list) -> list:
    sizes[0] = 2  # changes its argument, as torchvision's video Swin changes its window sizes
    return sizes


torch.fx.wrap("_scaled")  # a leaf of the trace, as torchvision wraps _get_window_and_shift_size


class _ChangesItsArgument(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * _scaled([1, x.shape[1]])[0]


def test_a_graph_that_does_not_replay_the_model_is_refused_with_its_operation_and_cause() -> None:
    """zoo (issue 44): swin3d_t was refused with torch.fx's wrapper ("ShapeProp error for: node=%... : [num_users=2]
    = call_function[target=...") cut at 200 characters: the refusal names the graph's operation, the underlying
    error and the way out."""
    with pytest.raises(CompressionError) as info:
        analyse(_ChangesItsArgument(), torch.randn(2, 4))
    said = str(info.value)
    assert said.startswith("cannot run the traced _ChangesItsArgument on an example input of shape input (4,) at "
                           "its operation _scaled: TypeError: 'immutable_list' object does not support mutation")
    assert said.endswith("use factorize, which needs no trace") and "\n" not in said


def test_a_block_whose_graph_does_not_replay_is_kept_whole_and_the_rest_is_cut() -> None:
    """zoo (issue 44): swin3d_t and swin3d_s were refused by wanda because the traced graph of their attention
    blocks does not replay (torchvision's window-size function changes a list the graph holds immutable). The block
    within whose forward the failing operation was traced is kept whole, the trace starts again, and the MLP after it
    is cut; keeping every channel gives the model back exactly. A failure in the model's own forward is still refused
    (the test above)."""
    torch.manual_seed(0)
    model = _GatedMLP(_ChangesItsArgument()).eval()
    x = torch.randn(2, 4)
    wg = analyse(model, x)
    assert wg.gm.meta["opaque"] == {
        "_ChangesItsArgument": "its traced graph does not replay: 'immutable_list' object does not support mutation"}
    assert wg.gm.meta["opaque_modules"] == ["gate"]
    assert [g.name for g in wg.cuttable()] == ["fc1"]
    with torch.no_grad():
        assert torch.equal(apply_cuts(wg, {"fc1": Cut(range(32))})(x), model(x))


class _OwnLinear(nn.Linear):
    """A layer subclass that keeps nn.Linear's forward: a leaf of the trace, like torchvision's Conv3DSimple."""


class _DecidesWhenTraced(nn.Module):
    """Slices fewer features while torch.fx traces it than when it runs: the graph's call of its layer fails."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = _OwnLinear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x[:, : 3 if torch.fx._symbolic_trace.is_fx_tracing() else 4])


class _PassesItsList(nn.Module):
    """Gives a list to a block that changes it: kept whole, the block's call fails in the graph next."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _ChangesItsList()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x, [1, x.shape[1]])


class _ChangesItsList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, sizes: list) -> torch.Tensor:
        return self.lin(x) * _scaled(sizes)[0]


@pytest.mark.parametrize(("gate", "kept"), [(_DecidesWhenTraced, ["_DecidesWhenTraced"]),
                                            (_PassesItsList, ["_ChangesItsList", "_PassesItsList"])])
def test_a_failing_call_is_charged_to_the_module_that_makes_it(gate: type, kept: list[str]) -> None:
    """A failing call of a layer (a leaf already) keeps whole the module that calls it, not the layer's class, which
    would change nothing and freeze every layer of that class; a block whose call fails once its inner block is kept
    whole is kept whole in turn."""
    torch.manual_seed(0)
    model = _GatedMLP(gate()).eval()
    x = torch.randn(2, 4)
    wg = analyse(model, x)
    assert list(wg.gm.meta["opaque"]) == kept and wg.gm.meta["opaque_modules"] == ["gate"]
    assert [g.name for g in wg.cuttable()] == ["fc1"]
    with torch.no_grad():
        assert torch.equal(apply_cuts(wg, {"fc1": Cut(range(32))})(x), model(x))


def test_a_layer_subclass_that_keeps_its_forward_is_traced_as_the_layer(analysed) -> None:
    """torchvision's video ResNets build their convolutions as subclasses of ``nn.Conv3d`` defined in torchvision
    (mc3_18's ``Conv3DNoTemporal``): traced through, they were bare ``conv3d`` calls the rules did not understand,
    every group of the model was frozen and width methods refused it. Traced whole, they shrink like ``nn.Conv3d``:
    the stem, the block's first convolution and the residual stream (the block's second convolution tied to its
    1×1×1 shortcut by the sum) are groups, and the 3-D pooling before the head keeps the channels."""
    a = analysed("tiny_video")
    modules = {n.target for n in a.wg.gm.graph.nodes if n.op == "call_module"}
    assert {"conv1.0", "conv2.0", "pool"} <= modules
    assert a.wg.unsupported == [("x", "model input"), ("fc", "model output")]
    assert {g.name: g.size for g in a.wg.cuttable()} == {"stem.0": 8, "conv1.0": 12, "conv2.0": 12}
    stream = a.wg.group("conv2.0")
    assert {u.target for u in stream.uses if u.role == "producer"} == {"conv2.0", "downsample.0"}


class _DoubledConv(nn.Conv2d):
    """Keeps ``nn.Conv2d.forward`` but convolves with twice its weight in ``_conv_forward``: not the layer the width
    rules read."""

    def _conv_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return super()._conv_forward(x, 2 * weight, bias)


def test_a_layer_subclass_with_a_convolution_of_its_own_is_traced_through() -> None:
    """Only a subclass that keeps both ``forward`` and ``_conv_forward`` is a whole layer node; one overriding
    ``_conv_forward`` is traced into its operations (the doubled weight and the convolution), as user code is."""
    from minreal.compress.core.width.tracing import trace

    torch.manual_seed(0)
    model = nn.Sequential(_DoubledConv(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 1)).eval()
    gm = trace(model, torch.randn(2, 3, 6, 6))
    assert {n.target for n in gm.graph.nodes if n.op == "call_module"} == {"1", "2"}
    assert {n.target for n in gm.graph.nodes if n.op == "get_attr"} == {"0.weight", "0.bias"}
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)


def test_a_model_in_training_mode_with_dropout_traces() -> None:
    """The graph and the model are compared in eval mode: in training mode dropout (and BatchNorm's batch
    statistics) would make them differ on every call; the model's training flags are left as they were."""
    model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 4)).train()
    wg = analyse(model, torch.randn(8, 4))
    assert [g.name for g in wg.cuttable()] == ["0"] and model.training and wg.gm.training


class _Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj, self.gamma = nn.Linear(16, 16), nn.Parameter(torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > -1e9:  # a branch on a tensor: kept whole
            x = x * 2
        return self.proj(x)


class _Reaching(nn.Module):
    """Calls a layer and reads a parameter of a module that is kept whole, from its own code (found in review: both
    were cut, and the kept-whole module then failed on the narrower layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.op, self.fc0, self.fc1 = _Untraceable(), nn.Linear(4, 16), nn.Linear(4, 16)
        self.fc2, self.fc3 = nn.Linear(16, 4), nn.Linear(16, 4)
        self.fc4, self.fc5 = nn.Linear(4, 16), nn.Linear(16, 4)  # a branch of its own, which may shrink

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.op(self.fc0(x))
        h = self.op.proj(F.relu(self.fc1(x))) * self.op.gamma
        return self.fc2(F.relu(h)) + self.fc3(y) + self.fc5(F.relu(self.fc4(x)))


def test_layers_and_parameters_inside_a_kept_whole_module_are_never_cut() -> None:
    from minreal.compress import compress
    from minreal.compress.core.data import Dataset
    from minreal.compress.methods.wanda import WandaConfig

    torch.manual_seed(0)
    model = _Reaching().eval()
    wg = analyse(model, torch.randn(2, 4))
    assert wg.gm.meta["opaque_modules"] == ["op"]
    assert [g.name for g in wg.cuttable()] == ["fc4"]
    data = Dataset(torch.randn(32, 4))
    new, _ = compress(model, data, "wanda", WandaConfig(mac_ratio=0.9, width_multiple=4))
    with torch.no_grad():
        assert new(data.x).shape == (32, 4) and new.op.proj.weight.shape == (16, 16)


class _Odd(nn.Module):
    """A tuple default, a NaN and an empty output, and noise sampled in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, size: tuple = (4, 4)) -> tuple:
        h = self.fc2(F.relu(self.fc1(x))) + 0.1 * torch.randn_like(x)
        return h, torch.log(h), h[:, :0]


def test_tuple_defaults_nan_and_empty_outputs_and_sampled_noise_trace() -> None:
    """Found in review: a tuple default made torch.fx write invalid code, a NaN or an empty output broke the output
    comparison, and a model sampling noise in eval mode was refused; the graph and the model are compared under one
    random state."""
    wg = analyse(_Odd().eval(), torch.randn(2, 4))
    assert [g.name for g in wg.cuttable()] == ["fc1"] and wg.gm.meta["fixed_args"] == {}


class _InlineReLU(nn.Module):
    """Builds a layer without parameters inside its forward, as DistilBertForSequenceClassification does
    (``nn.ReLU()(pooled_output)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.ReLU()(self.fc1(x)))


class _InlineLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.Linear(16, 4)(self.fc1(x))


def test_a_layer_without_parameters_built_inside_forward_is_traced_through() -> None:
    """Review: DistilBertForSequenceClassification was refused by every width method and depth as "module is not
    installed as a submodule (Python control flow on a tensor)": its forward builds ``nn.ReLU()`` inline. Such a
    layer is now traced as the function it calls (the hidden width may shrink, every channel kept gives the model
    back); one with parameters (made anew at every call) is still refused, in words that no longer say control
    flow."""
    torch.manual_seed(0)
    model, x = _InlineReLU().eval(), torch.randn(2, 4)
    wg = analyse(model, x)
    assert [g.name for g in wg.cuttable()] == ["fc1"] and not wg.gm.meta["opaque"]
    with torch.no_grad():
        assert torch.equal(apply_cuts(wg, {"fc1": Cut(range(16))})(x), model(x))
    with pytest.raises(CompressionError) as info:
        analyse(_InlineLinear().eval(), x)
    said = str(info.value)
    assert "NameError: module is not installed as a submodule" in said and "control flow" not in said
    assert "register it in __init__, as an attribute or in an nn.ModuleList" in said


class _InlineDropout(nn.Module):
    def __init__(self, kept: bool) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 4)
        self.drops = [nn.Dropout(0.5)] if kept else None  # a list: model.eval() does not reach it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        drop = self.drops[0] if self.drops else nn.Dropout(0.5)
        return self.fc2(drop(self.fc1(x)))


@pytest.mark.parametrize("kept", [False, True])
def test_a_dropout_in_training_mode_outside_the_registered_layers_is_refused(kept: bool) -> None:
    """Review: traced through, a fresh nn.Dropout (in training mode, which model.eval() does not reach) made the
    compressed model's output random, and compress succeeded; it is refused, saying how to register it."""
    with pytest.raises(CompressionError) as info:
        analyse(_InlineDropout(kept).eval(), torch.randn(2, 4))
    assert "not one of its registered submodules" in str(info.value)


def test_a_parameter_named_like_the_generated_code_s_own_names_is_traced() -> None:
    """Review: a decorated forward with a parameter named ``_forward`` shadowed the name the generated forward called
    the decorated one by ("'NoneType' object is not callable")."""
    import functools

    def passed(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: object, **kwargs: object) -> object:
            return fn(*args, **kwargs)
        return call

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 4)

        @passed
        def forward(self, x: torch.Tensor, _forward: object = None, _defaults: object = None,
                    **kwargs: object) -> torch.Tensor:
            return self.fc2(F.relu(self.fc1(x)))

    torch.manual_seed(0)
    model, x = Model().eval(), torch.randn(2, 4)
    wg = analyse(model, x)
    assert [g.name for g in wg.cuttable()] == ["fc1"]
    with torch.no_grad():
        assert torch.equal(wg.gm(x), model(x))


def test_a_forward_parameter_defaulting_to_a_tensor_is_refused_naming_it() -> None:
    """Review: ``forward(self, x, bias=torch.ones(4))`` failed as "name '_tensor_constant0' is not defined" (torch.fx
    writes the tensor into the graph's code as a name it never defines): refused in one line naming the parameter."""
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, bias: torch.Tensor = torch.ones(4)) -> torch.Tensor:  # noqa: B008
            return self.fc(x) + bias

    with pytest.raises(CompressionError) as info:
        analyse(Model().eval(), torch.randn(2, 4))
    assert str(info.value) == ("Model.forward's parameter 'bias' defaults to a tensor, which torch.fx cannot trace; "
                               "default it to None, or make the tensor a buffer of the model (register_buffer)")


class _Noisy(nn.Module):
    """A parameterless layer of the user's that acts otherwise in training."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn_like(x) if self.training else x


class _InlineLayer(nn.Module):
    def __init__(self, make: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.make = make
        self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.make()(self.fc1(x)))


class _ScaledDropout(nn.Dropout):
    """Reads ``training`` only in its base's forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


class _HelperNoise(nn.Module):
    """Reads ``training`` only in a helper method."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._noise(x)

    def _noise(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn_like(x) if self.training else x


class _Doubled(nn.Module):
    """Doubles its input; kept from pretraining (a docstring naming training is not code reading it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2  # no training here either


@pytest.mark.parametrize("make", [lambda: nn.RReLU(), lambda: nn.AlphaDropout(0.2), _Noisy,
                                  lambda: nn.BatchNorm1d(16, affine=False, track_running_stats=False),
                                  lambda: _ScaledDropout(0.5), _HelperNoise],
                         ids=["rrelu", "alpha_dropout", "user", "batch_norm", "subclass", "helper"])
def test_an_inline_layer_that_acts_otherwise_in_training_is_refused(make: Callable[[], nn.Module]) -> None:
    """Review: only dropout was refused among layers built inside forward in training mode; nn.RReLU or a layer of
    the user's branching on ``self.training`` went through, the compressed model random (and a parameterless batch
    norm failed with a raw ValueError). Each is refused in one line saying to register it."""
    with pytest.raises(CompressionError) as info:
        analyse(_InlineLayer(make).eval(), torch.randn(2, 4))
    said = str(info.value)
    assert "not one of its registered submodules" in said and "\n" not in said


@pytest.mark.parametrize("make", [nn.ReLU, nn.GELU, nn.Tanh, nn.Identity, lambda: nn.Dropout(0.0), _Doubled])
def test_an_inline_layer_that_acts_the_same_in_training_is_traced_through(make: Callable[[], nn.Module]) -> None:
    torch.manual_seed(0)
    model, x = _InlineLayer(make).eval(), torch.randn(2, 4)
    wg = analyse(model, x)
    assert [g.name for g in wg.cuttable()] == ["fc1"]
    with torch.no_grad():
        assert torch.equal(apply_cuts(wg, {"fc1": Cut(range(16))})(x), model(x))
