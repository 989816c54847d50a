"""Tests for minreal.compress.core.width.surgery: keep sets, compensation and the resized modules, on the model list.

Exactness is checked in float64, where the cut and the original evaluate the same real-valued function and
differ only by float64 rounding (relative ~1e-16 amplified by the depth): we require the difference to be below
float32's unit roundoff u = 2^-24 times the output's magnitude — exact to the precision float32 can even
represent the output — while a mis-cut (a live channel removed, channels shifted, a stale BN) changes outputs
by O(1) (see test_the_exactness_check_sees_a_wrong_keep_set).
"""

from __future__ import annotations

import copy

import minreal_width_zoo as zoo  # registered by this folder's conftest.py
import pytest
import torch
from torch import fx, nn

from minreal.compress.core.errors import CompressionError
from minreal.compress.core.width import Cut, SlimAttention, WidthGraph, analyse, apply_cuts

U = zoo.UNIT_ROUNDOFF


def _float64_outputs(*modules: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return [zoo.as_float64(m)(x.double()) for m in modules]


def _assert_same_function(cut: nn.Module, reference: nn.Module, x: torch.Tensor) -> None:
    got, want = _float64_outputs(cut, reference, x=x)
    scale = float(want.abs().max())
    assert scale > 0
    assert float((got - want).abs().max()) <= U * scale


@pytest.mark.parametrize("name", zoo.MODELS)
def test_keeping_every_channel_computes_exactly_the_original(analysed, name: str) -> None:
    """Keep sets that keep everything, with and without an identity merge (W·I = W in any float order):
    the same float32 operations run, so the outputs are bitwise equal (same process, shapes and threads).
    The merge is a dense [size, kept] matrix folded in float64 (out·size² multiply-adds per consumer): groups
    wider than 256 are left out to keep vit_b_16's and convnext_tiny's 3072-wide MLPs from costing a minute."""
    a = analysed(name)
    plain = apply_cuts(a.wg, {g.name: Cut(range(g.size)) for g in a.wg.groups})
    merged = apply_cuts(a.wg, {g.name: Cut(range(g.size), merge=torch.eye(g.size)) for g in a.wg.cuttable()
                               if g.size <= 256})
    with torch.no_grad():
        want = a.model(a.x)
        assert torch.equal(plain(a.x), want) and torch.equal(merged(a.x), want)


@pytest.mark.parametrize("name", zoo.MODELS)
def test_cutting_dead_channels_is_exact(analysed, name: str) -> None:
    """Every cuttable group loses ⌈size/4⌉ atoms made dead beforehand (producer rows and per-channel affine
    parameters zero, running statistics untouched): they are 0 at every state point, so removing them is exact.

    Groups normalised by a LayerNorm (convnext_tiny's stage streams) are left out: LayerNorm divides by the
    mean and variance over *all* its channels, so a zero channel still moves μ = Σx/C and σ² = Σ(x−μ)²/C of the
    others and removing it changes every kept output (see test_layer_norm_groups_cut_to_new_shapes)."""
    a = analysed(name)
    cuts = zoo.cuts_of(a.wg, skip=zoo.layer_norm_groups(a.wg))
    assert cuts
    dead = zoo.dead_copy(a.wg, cuts)
    cut = apply_cuts(dead, cuts)
    assert zoo.parameter_count(cut) < zoo.parameter_count(a.model)
    _assert_same_function(cut, dead.gm, a.x)


def test_the_exactness_check_sees_a_wrong_keep_set(analysed) -> None:
    """Channels 1, 5, 9, … are dead; keeping them and cutting live ones instead must fail the check by far."""
    a = analysed("resnet20")
    cuts = zoo.cuts_of(a.wg)
    dead = zoo.dead_copy(a.wg, cuts)
    wrong = {name: Cut([(k + 1) % a.wg.group(name).size for k in cut.keep]) for name, cut in cuts.items()}
    got, want = _float64_outputs(apply_cuts(dead, wrong), dead.gm, x=a.x)
    assert float((got - want).abs().max()) > 1e-3 * float(want.abs().max())


def _resolve(root: nn.Module, dotted: str) -> object:
    value: object = root
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


B2, B3 = "trunk_output.block2.block2-0.f", "encoder.layers.encoder_layer_0"
KINDS = [  # (model, group, size before, {attribute of the cut model: value after removing a quarter})
    pytest.param("resnet18", "layer2.0.conv2", 128, {
        "layer2.0.conv2.out_channels": 96, "layer2.0.downsample.0.out_channels": 96, "layer2.0.bn2.num_features": 96,
        "layer2.0.downsample.1.num_features": 96, "layer2.1.conv2.out_channels": 96,
        "layer2.1.conv1.in_channels": 96, "layer3.0.conv1.in_channels": 96,
        "layer3.0.downsample.0.in_channels": 96}, id="residual-add"),
    pytest.param("resnet50", "layer1.0.conv3", 256, {
        "layer1.0.downsample.0.out_channels": 192, "layer1.2.conv3.out_channels": 192,
        "layer1.1.conv1.in_channels": 192, "layer2.0.conv1.in_channels": 192}, id="bottleneck-residual"),
    pytest.param("resnet20", "conv1", 64, {
        "conv1.out_channels": 12, "layer2.0.conv1.in_channels": 12, "layer2.0.conv2.out_channels": 24,
        "layer3.0.conv1.in_channels": 24, "layer3.2.conv2.out_channels": 48, "linear.in_features": 48},
        id="option-a-pad"),
    pytest.param("densenet121", "features.conv0", 256, {
        "features.conv0.out_channels": 48, "features.denseblock1.denselayer1.conv2.out_channels": 24,
        "features.denseblock1.denselayer2.norm1.num_features": 72,
        "features.denseblock1.denselayer6.conv1.in_channels": 168,
        "features.transition1.norm.num_features": 192, "features.transition1.conv.in_channels": 192},
        id="concat"),
    pytest.param("regnet_x_400mf", f"{B2}.a.0", 4, {
        f"{B2}.a.0.out_channels": 48, f"{B2}.b.0.groups": 3, f"{B2}.b.0.in_channels": 48,
        f"{B2}.b.0.out_channels": 48, f"{B2}.b.1.num_features": 48, f"{B2}.c.0.in_channels": 48}, id="grouped-conv"),
    pytest.param("mobilenet_v2", "features.2.conv.0.0", 96, {
        "features.2.conv.1.0.groups": 72, "features.2.conv.1.0.in_channels": 72,
        "features.2.conv.1.0.out_channels": 72, "features.2.conv.2.in_channels": 72}, id="depthwise-conv"),
    pytest.param("flat_cnn", "conv2", 12, {"conv2.out_channels": 9, "bn2.num_features": 9, "fc.in_features": 144},
                 id="flatten-linear"),
    pytest.param("vit_b_16", f"{B3}.self_attention:in", 12, {
        f"{B3}.self_attention.__class__.__name__": "SlimAttention", f"{B3}.self_attention.num_heads": 9,
        f"{B3}.self_attention.in_proj_weight.shape": (3 * 9 * 64, 768),
        f"{B3}.self_attention.out_proj.in_features": 9 * 64}, id="attention-heads"),
    pytest.param("vit_b_16", f"{B3}.mlp.0", 3072, {f"{B3}.mlp.0.out_features": 2304, f"{B3}.mlp.3.in_features": 2304},
                 id="mlp-hidden"),
    pytest.param("convnext_tiny", "features.0.0", 96, {
        "features.1.0.block.0.groups": 72, "features.1.0.block.2.normalized_shape": (72,),
        "features.1.0.layer_scale.shape": (72, 1, 1), "features.1.2.block.5.out_features": 72,
        "features.2.0.weight.shape": (72,), "features.2.1.in_channels": 72}, id="layer-norm"),
    pytest.param("mobilenet_v3_small", "features.4.block.0.0", 96, {
        "features.4.block.2.fc2.out_channels": 72, "features.4.block.2.fc1.in_channels": 72,
        "features.4.block.1.0.groups": 72, "features.4.block.3.0.in_channels": 72}, id="squeeze-excitation"),
    pytest.param("efficientnet_b0", "features.2.0.block.0.0", 96, {
        "features.2.0.block.2.fc2.out_channels": 72, "features.2.0.block.2.fc1.in_channels": 72,
        "features.2.0.block.1.0.groups": 72, "features.2.0.block.3.0.in_channels": 72}, id="squeeze-excitation-b0"),
]


@pytest.mark.parametrize(("name", "group", "size", "after"), KINDS)
def test_group_kind_is_cut_by_a_quarter(analysed, name: str, group: str, size: int, after: dict) -> None:
    """One group of each kind loses a quarter of its atoms; every layer it spans is resized consistently
    (that the result computes the right function is test_cutting_dead_channels_is_exact's job)."""
    a = analysed(name)
    g = a.wg.group(group)
    assert g.size == size and not g.frozen
    keep = zoo.three_quarters(size)
    assert len(keep) <= 0.75 * size
    cut = apply_cuts(a.wg, {group: Cut(keep)})
    assert {k: tuple(v) if isinstance(v, torch.Size) else v for k, v in
            ((k, _resolve(cut, k)) for k in after)} == after
    with torch.no_grad():
        y, want = cut(a.x), a.model(a.x)
    assert y.shape == want.shape and bool(y.isfinite().all())


def test_layer_norm_groups_cut_to_new_shapes(analysed) -> None:
    """convnext_tiny: the four stage streams are normalised by LayerNorms (not exact to cut, see above); cut
    together they still give a plain module that runs, with every normalised shape rewritten."""
    a = analysed("convnext_tiny")
    streams = zoo.layer_norm_groups(a.wg)
    assert streams == {"features.0.0", "features.2.1", "features.4.1", "features.6.1"}
    cut = apply_cuts(a.wg, {name: Cut(zoo.three_quarters(a.wg.group(name).size)) for name in streams})
    shapes = [n.args[1] for n in cut.graph.nodes if n.op == "call_function" and n.target.__name__ == "layer_norm"]
    assert shapes == [(72,), (72,), (144,), (288,), (576,)]  # the stem's and the downsamplers' LayerNorm2d
    assert cut.get_submodule("classifier.0").weight.shape == (576,)
    assert cut.get_submodule("classifier.2").in_features == 576
    with torch.no_grad():
        assert cut(a.x).shape == (2, 1000)


def test_option_a_cut_rewrites_the_pad_amounts_and_is_exact(analysed) -> None:
    """Remove 4 of the 16 stem channels, 2 + 1 of layer 2's 8 + 8 pad channels, 4 + 8 of layer 3's 16 + 16:
    the pads become (6, 7) and (12, 8), the streams 12, 25 and 45 channels wide."""
    a = analysed("resnet20")
    g = a.wg.group("conv1")
    wide, widest = (a.wg.channel_atoms(g, rw.node) for rw in a.wg.rewrites if rw.kind == "pad")
    removed = set(wide[8:24][:4]) | {*wide[:2], wide[-1]} | {*widest[:4], *widest[-8:]}
    cuts = {"conv1": Cut([i for i in range(64) if i not in removed])}
    dead = zoo.dead_copy(a.wg, cuts)
    cut = apply_cuts(dead, cuts)
    pads = [n.args[1] for n in cut.graph.nodes if n.op == "call_function" and n.target.__name__ == "pad"]
    assert pads == [(0, 0, 0, 0, 6, 7), (0, 0, 0, 0, 12, 8)]
    assert (cut.conv1.out_channels, cut.get_submodule("layer2.0.conv2").out_channels, cut.linear.in_features) == \
        (12, 25, 45)
    _assert_same_function(cut, dead.gm, a.x)


def test_literal_view_size_is_rewritten() -> None:
    """``x.view(x.size(0), 12 * 4 * 4)`` holds the channel count as a constant: a cut rewrites it (9 · 16)."""
    model = zoo.randomise_norms(zoo.FlatCNN(literal_view=True)).eval()
    x = zoo.example("flat_cnn")
    wg = analyse(model, x)
    cuts = {"conv2": Cut(zoo.three_quarters(12))}
    dead = zoo.dead_copy(wg, cuts)
    cut = apply_cuts(dead, cuts)
    views = [n.args[1:] for n in cut.graph.nodes if n.op == "call_method" and n.target == "view"]
    assert len(views) == 1 and views[0][1] == 144 and cut.fc.in_features == 144
    _assert_same_function(cut, dead.gm, x)


def _twin(wg: WidthGraph, gm: fx.GraphModule, group: str, a: int, b: int) -> None:
    """Make atom ``b`` of ``group`` an exact copy of atom ``a``: every producer row and per-channel parameter
    (running statistics too) at ``b``'s positions takes the value at ``a``'s, occurrence by occurrence."""
    g = wg.group(group)
    with torch.no_grad():
        for u in g.uses:
            if u.role == "consumer":
                continue
            atoms = [g.atoms.index(wg.find(s)) for s in u.slots]
            src = [i for i, t in enumerate(atoms) if t == a]
            dst = [i for i, t in enumerate(atoms) if t == b]
            p = zoo.parameter(gm, u.target, u.param)
            p.index_copy_(u.dim, torch.tensor(dst), p.index_select(u.dim, torch.tensor(src)))


@pytest.mark.parametrize(("name", "group", "a", "b"), [
    ("small_cnn", "3", 2, 9),
    ("flat_cnn", "conv2", 3, 7),  # an atom spans 16 columns of the Linear after the flatten
    ("resnet20", "conv1", 1, 6),  # a residual stream through both option-A pads
    ("regnet_x_400mf", f"{B2}.a.0", 0, 2),  # whole conv groups of 16 channels
])
def test_merging_an_exact_twin_into_its_original_is_exact(analysed, name: str, group: str, a: int, b: int) -> None:
    """x_b = x_a at every state point, so removing b with merge row e_a (its outgoing weights added to a's) keeps
    the function; without the merge the same cut changes it."""
    an = analysed(name)
    twins = copy.copy(an.wg)
    twins.gm = copy.deepcopy(an.wg.gm)
    _twin(an.wg, twins.gm, group, a, b)
    size = an.wg.group(group).size
    keep = [i for i in range(size) if i != b]
    merge = torch.zeros(size, size - 1)
    merge[keep, range(size - 1)] = 1.0
    merge[b, keep.index(a)] = 1.0
    _assert_same_function(apply_cuts(twins, {group: Cut(keep, merge=merge)}), twins.gm, an.x)
    got, want = _float64_outputs(apply_cuts(twins, {group: Cut(keep)}), twins.gm, x=an.x)
    assert float((got - want).abs().max()) > 1e-4 * float(want.abs().max())


@pytest.mark.parametrize("bias", [True, False], ids=["consumer-bias", "consumer-without-bias"])
def test_removing_a_constant_channel_with_its_offset_is_exact(bias: bool) -> None:
    """Hidden unit 7 of an MLP is relu(0·x + 0.7) = 0.7 for every input; removed with offset 0.7, the next
    Linear's bias takes W[:, 7]·0.7 (a new bias when it had none) and the function is unchanged."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8, bias=bias), nn.ReLU(), nn.Linear(8, 5))
    with torch.no_grad():
        model[0].weight[7] = 0.0
        model[0].bias[7] = 0.7
    x = torch.randn(16, 12)
    wg = analyse(model.eval(), x)
    offset = torch.zeros(16)
    offset[7] = 0.7
    cut = apply_cuts(wg, {"0": Cut([i for i in range(16) if i != 7], offset=offset)})
    assert cut.get_submodule("2").in_features == 15 and cut.get_submodule("2").bias is not None
    _assert_same_function(cut, model, x)


@pytest.mark.parametrize(("cut", "message"), [
    (Cut([]), "keep set must be 1..32 indices"),
    (Cut([0, 32]), "keep set must be 1..32 indices"),
    (Cut([0, 1], merge=torch.zeros(32, 3)), "merge matrix must be 32×2"),
    (Cut([0, 1], merge=torch.ones(32, 2)), "rows of kept channels in the merge matrix must be the identity"),
    (Cut([0, 1], offset=torch.ones(32)), "offset must have 32 entries, zero on kept channels"),
])
def test_bad_cut_is_one_line_error(analysed, cut: Cut, message: str) -> None:
    a = analysed("mlp")
    with pytest.raises(CompressionError, match=message) as info:
        apply_cuts(a.wg, {"1": cut})
    assert "\n" not in str(info.value) and "'1'" in str(info.value)


def test_unknown_group_is_one_line_error(analysed) -> None:
    with pytest.raises(CompressionError, match="no channel group named 'nope'") as info:
        apply_cuts(analysed("mlp").wg, {"nope": Cut([0])})
    assert "\n" not in str(info.value)


def test_group_norm_groups_are_cut_whole_and_exactly() -> None:
    """GroupNorm(4, 16) normalises each group of 4 channels by its own statistics: its groups are the atoms,
    and a whole dead group (zero weight and bias) can be removed without touching the others' statistics."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.GroupNorm(4, 16), nn.ReLU(), nn.Conv2d(16, 4, 3)).eval()
    x = torch.randn(2, 3, 8, 8)
    wg = analyse(model, x)
    assert wg.group("0").size == 4
    cuts = {"0": Cut([0, 2, 3])}
    dead = zoo.dead_copy(wg, cuts)
    cut = apply_cuts(dead, cuts)
    norm = cut.get_submodule("1")
    assert (norm.num_groups, norm.num_channels, cut.get_submodule("3").in_channels) == (3, 12, 12)
    _assert_same_function(cut, dead.gm, x)


def test_prelu_slopes_are_cut_with_their_channels() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.PReLU(8), nn.Conv2d(8, 4, 3)).eval()
    with torch.no_grad():
        model[1].weight.uniform_(0.1, 0.5)
    x = torch.randn(2, 3, 8, 8)
    wg = analyse(model, x)
    cuts = {"0": Cut(zoo.three_quarters(8))}
    dead = zoo.dead_copy(wg, cuts)
    cut = apply_cuts(dead, cuts)
    assert cut.get_submodule("1").weight.shape == (6,) and cut.get_submodule("1").num_parameters == 6
    _assert_same_function(cut, dead.gm, x)


def _attention_pair(batch_first: bool) -> tuple[nn.MultiheadAttention, SlimAttention]:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    nn.init.normal_(mha.in_proj_bias, std=0.1)
    nn.init.normal_(mha.out_proj.bias, std=0.1)
    slim = SlimAttention(mha.in_proj_weight, mha.in_proj_bias, copy.deepcopy(mha.out_proj), 4, 4, batch_first, 0.0)
    return mha, slim.eval()


def _masks(kind: str) -> dict[str, torch.Tensor]:
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)  # True: may not attend (MHA's convention)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[:, -1] = True
    return {"none": {}, "bool-attn-mask": {"attn_mask": causal},
            "float-attn-mask": {"attn_mask": torch.randn(5, 5, generator=torch.Generator().manual_seed(1))},
            "key-padding": {"key_padding_mask": padding},
            "both": {"attn_mask": causal, "key_padding_mask": padding}}[kind]


@pytest.mark.parametrize("mask", ["none", "bool-attn-mask", "float-attn-mask", "key-padding", "both"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
def test_slim_attention_with_every_head_is_multihead_attention(batch_first: bool, mask: str) -> None:
    """SlimAttention built from a MultiheadAttention's weights computes the same function (float64), and in
    float32 stays within 8× the float32 rounding error of MultiheadAttention itself (measured against float64)."""
    mha, slim = _attention_pair(batch_first)
    x = torch.randn(3, 5, 16) if batch_first else torch.randn(5, 3, 16)
    masks = _masks(mask)
    with torch.no_grad():
        want64 = copy.deepcopy(mha).double()(x.double(), x.double(), x.double(), need_weights=False,
                                              **{k: v.double() if v.is_floating_point() else v
                                                 for k, v in masks.items()})[0]
        got64 = copy.deepcopy(slim).double()(x.double(), x.double(), x.double(),
                                             **{k: v.double() if v.is_floating_point() else v
                                                for k, v in masks.items()})[0]
        want32 = mha(x, x, x, need_weights=False, **masks)[0]
        got32 = slim(x, x, x, **masks)[0]
    scale = float(want64.abs().max())
    assert float((got64 - want64).abs().max()) <= U * scale
    error = float((want32.double() - want64).abs().max())
    assert float((got32 - want32).abs().max()) <= 8 * error + U * scale


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
def test_attention_cut_by_embedding_or_heads_is_exact(batch_first: bool) -> None:
    """Cutting only the embedding channels the attention reads replaces it by a SlimAttention with every head;
    cutting a head as well gives 3 heads of 4. Both exact when the removed channels and head are dead."""
    model = zoo.randomise_norms(zoo.TinyAttention(batch_first)).eval()
    x = torch.randn(2, 5, 6) if batch_first else torch.randn(5, 2, 6)
    wg = analyse(model, x)
    heads, embedding = "attn:in", "embed"
    assert {g.name for g in wg.cuttable()} == {heads, embedding, "attn"}
    for cuts in ({embedding: Cut(zoo.three_quarters(16))},
                 {embedding: Cut(zoo.three_quarters(16)), heads: Cut([0, 2, 3])}):
        dead = zoo.dead_copy(wg, cuts)
        cut = apply_cuts(dead, cuts)
        assert isinstance(cut.attn, SlimAttention) and cut.attn.num_heads == len(cuts.get(heads, Cut(range(4))).keep)
        assert cut.attn.in_proj_weight.shape == (3 * 4 * cut.attn.num_heads, 12)
        _assert_same_function(cut, dead.gm, x)


class _FunctionalBatchNorm(nn.BatchNorm2d):
    """timm's ``BatchNormAct2d`` in small: a BatchNorm subclass whose own ``forward`` calls ``F.batch_norm`` (traced
    through, so the graph holds the functional call and its four tensors as attributes), then an activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                     self.eps)
        return torch.relu(x)


class _AtenBatchNorm(nn.BatchNorm2d):
    """The same through ``torch.batch_norm``, whose arguments come in ATen's order (weight and bias first)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, False, 0.0, self.eps,
                                False)


class _KeywordBatchNorm(nn.BatchNorm2d):
    """The functional form with every tensor passed by keyword."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.batch_norm(input=x, running_mean=self.running_mean, running_var=self.running_var,
                                        weight=self.weight, bias=self.bias, training=False, eps=self.eps)


@pytest.mark.parametrize("norm", [_FunctionalBatchNorm, _AtenBatchNorm, _KeywordBatchNorm])
def test_functional_batch_norm_is_cut_with_its_channels(norm: type[nn.BatchNorm2d]) -> None:
    """zoo (issue 44): timm's EfficientNet, MobileNetV3 and RegNetY froze almost every group (width cuts reached 0.99
    of the MACs at best) because the functional batch_norm their BatchNormAct2d calls was not understood; its
    channels are now cut with their running statistics and affine parameters, exactly."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), norm(8), nn.Conv2d(8, 8, 3, groups=8), norm(8),
                          nn.Conv2d(8, 4, 1)).eval()
    with torch.no_grad():
        for bn in (model[1], model[3]):
            bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-1, 1)
    x = torch.randn(2, 3, 10, 10)
    wg = analyse(model, x)
    assert [g.name for g in wg.cuttable()] == ["0"]  # the depthwise conv ties both norms to conv 0's channels
    cuts = {"0": Cut(zoo.three_quarters(8))}
    dead = zoo.dead_copy(wg, cuts)
    cut = apply_cuts(dead, cuts)
    assert all(cut.get_submodule(f"{i}").get_buffer("running_mean").shape == (6,) for i in (1, 3))
    assert cut.get_submodule("2").weight.shape[0] == 6 and cut.get_submodule("4").in_channels == 6
    _assert_same_function(cut, dead.gm, x)
