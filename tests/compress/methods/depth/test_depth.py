"""The ``depth`` method: which residual blocks it finds, that removing a zero branch is exact (torch and ONNX
Runtime), that each criterion ranks known dead blocks first and known vital ones last, and its refusals."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.core.width.tracing import trace
from minreal.compress.methods.depth import CRITERIA, DepthConfig, find_blocks, remove_blocks
from minreal.compress.methods.depth.graph import drop_unused_results
from minreal.compress.methods.depth.method import depth_prepare, depth_realise
from minreal.compress.models import CifarResNet, small_cnn
from minreal.export.onnx_export import to_onnx


def _resnet(blocks: int = 3, seed: int = 0) -> CifarResNet:
    torch.manual_seed(seed)
    model = CifarResNet(blocks_per_stage=blocks, in_channels=1).eval()
    for m in model.modules():  # non-trivial BN statistics, so that a branch is not zero by accident
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model


def _images(n: int = 48, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    return Dataset(torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def _zero_branch(block: nn.Module) -> None:
    with torch.no_grad():
        block.bn2.weight.zero_()
        block.bn2.bias.zero_()


def _blocks(model: nn.Module, x: torch.Tensor):
    gm = drop_unused_results(trace(model, x[:2]).eval())  # as depth traces
    return gm, *find_blocks(gm)


def _ort(path: Path, x: torch.Tensor) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_resnet_blocks_identity_and_option_a_shortcuts_are_told_apart() -> None:
    data = _images()
    _, blocks, left = _blocks(_resnet(), data.x)
    assert [b.name for b in blocks] == [f"layer{s}.{i}" for s in (1, 2, 3) for i in range(3)]
    assert not left
    shortcut = {b.name: b.shortcut for b in blocks if not b.identity}
    assert shortcut == {"layer2.0": "getitem, pad", "layer3.0": "getitem, pad"}  # option A: subsample, zero-pad
    assert all("conv1" in " ".join(b.modules) and "bn2" in " ".join(b.modules) for b in blocks)


def test_removing_a_zero_branch_is_exact_in_torch_and_leaves_no_node_in_onnx(tmp_path: Path) -> None:
    model, data = _resnet(), _images()
    _zero_branch(model.layer1[1])
    _zero_branch(model.layer3[2])
    gm, blocks, _ = _blocks(model, data.x)
    gone = [b for b in blocks if b.name in ("layer1.1", "layer3.2")]
    new = remove_blocks(gm, gone).eval()
    with torch.no_grad():
        ref, out = model(data.x), new(data.x)
    assert torch.equal(out, ref)  # relu(0 + x) is x for x = relu(...): bit for bit
    to_onnx(model, data.x[:2], tmp_path / "a.onnx", dynamic_batch=True)
    to_onnx(new, data.x[:2], tmp_path / "b.onnx", dynamic_batch=True)
    ops = [[n.op_type for n in onnx.load(tmp_path / f).graph.node] for f in ("a.onnx", "b.onnx")]
    for op, gone_per_block in (("Conv", 2), ("Relu", 2), ("Add", 1)):
        assert ops[1].count(op) == ops[0].count(op) - 2 * gone_per_block, op
    for n in (3, 7):
        np.testing.assert_allclose(_ort(tmp_path / "b.onnx", data.x[:n]), ref[:n].numpy(), rtol=1e-4, atol=1e-5)


def test_a_shortcut_block_is_removed_only_when_its_branch_is_exactly_zero() -> None:
    model, data = _resnet(), _images()
    prep = depth_prepare(model, data, DepthConfig(criterion="energy", mac_ratio=0.5))
    assert "layer2.0" not in prep.removable and "layer3.0" not in prep.removable
    assert "shortcut" in prep.reasons["layer2.0"]
    zeroed = copy.deepcopy(model)
    _zero_branch(zeroed.layer2[0])
    prep = depth_prepare(zeroed, data, DepthConfig(criterion="energy", mac_ratio=0.5))
    assert "layer2.0" in prep.removable and "layer3.0" not in prep.removable
    assert prep.order[0] == "layer2.0"  # zero energy: the first to go
    new, report = depth_realise(prep, DepthConfig(criterion="energy", mac_ratio=0.95))
    assert report.predicted["removed"] == ["layer2.0"]
    with torch.no_grad():
        torch.testing.assert_close(new(data.x), zeroed(data.x), rtol=0, atol=0)


@pytest.mark.parametrize("criterion", CRITERIA)
def test_each_criterion_ranks_dead_blocks_first_and_vital_blocks_last(criterion: str) -> None:
    model, data = _resnet(), _images(64)
    with torch.no_grad():
        model.layer1[2].bn2.weight.mul_(1e-3)  # nearly dead: its branch adds almost nothing
        model.layer1[2].bn2.bias.mul_(1e-3)
        model.layer3[1].bn2.weight.mul_(30.0)  # vital: its branch dominates the stream
        model.layer3[1].bn2.bias.mul_(30.0)
    prep = depth_prepare(model, data, DepthConfig(criterion=criterion, greedy_candidates=10))
    assert prep.order[0] == "layer1.2"
    assert prep.order[-1] == "layer3.1"


def test_budget_is_met_by_the_shortest_prefix_and_refused_when_out_of_reach() -> None:
    model, data = _resnet(), _images()
    prep = depth_prepare(model, data, DepthConfig(criterion="removal"))
    for ratio in (0.9, 0.7):
        new, report = depth_realise(prep, DepthConfig(criterion="removal", mac_ratio=ratio))
        reached = report.predicted["block_budget"]["reached"]
        removed = report.predicted["removed"]
        assert reached <= ratio and removed == prep.order[:len(removed)]
        before = reached + prep.macs[removed[-1]] / prep.total_macs  # one block fewer would not do
        assert before > ratio
    with pytest.raises(CompressionError, match="removing all 7 removable residual blocks leaves --mac-ratio"):
        depth_realise(prep, DepthConfig(criterion="removal", mac_ratio=0.05))


def test_registry_costs_agree_with_the_prepared_block_costs() -> None:
    model, data = _resnet(), _images()
    new, report = compress(model, data, "depth", DepthConfig(criterion="energy", mac_ratio=0.7))
    assert report.mac_ratio == pytest.approx(report.predicted["block_budget"]["reached"], abs=1e-9)
    assert report.mac_ratio <= 0.7


def test_excluded_blocks_stay_and_an_unknown_name_is_refused() -> None:
    model, data = _resnet(), _images()
    prep = depth_prepare(model, data, DepthConfig(criterion="energy", exclude=("layer1.0", "layer3.2.conv1")))
    assert {"layer1.0", "layer3.2"}.isdisjoint(prep.removable)
    with pytest.raises(CompressionError, match="--exclude layer9.0: no residual block"):
        depth_prepare(model, data, DepthConfig(exclude=("layer9.0",)))


def test_a_model_without_residual_blocks_is_refused_in_one_line() -> None:
    data = Dataset(torch.rand(16, 1, 8, 8))
    with pytest.raises(CompressionError) as err:
        compress(small_cnn(1, (8, 16)).eval(), data, "depth", DepthConfig(mac_ratio=0.8))
    assert "no removable residual block" in str(err.value) and "\n" not in str(err.value)


class _Layer(nn.Module):
    """A transformer layer, pre-LN or post-LN."""

    def __init__(self, d: int, norm_first: bool) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.norm_first:
            a = self.norm1(h)
            h = h + self.attn(a, a, a, need_weights=False)[0]
            return h + self.mlp(self.norm2(h))
        h = self.norm1(h + self.attn(h, h, h, need_weights=False)[0])
        return self.norm2(h + self.mlp(h))


class _Encoder(nn.Module):
    def __init__(self, norm_first: bool, layers: int = 3, d: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(d, norm_first) for _ in range(layers))
        self.head = nn.Linear(d, 4)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(1))


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-LN", "post-LN"])
def test_transformer_attention_and_mlp_sub_blocks_are_blocks(norm_first: bool) -> None:
    torch.manual_seed(0)
    model = _Encoder(norm_first).eval()
    x = torch.randn(8, 5, 16)
    gm, blocks, _ = _blocks(model, x)
    parts = ("/norm1+attn", "/norm2+mlp") if norm_first else (".attn", ".mlp")
    assert [b.name for b in blocks] == [f"layers.{i}{part}" for i in range(3) for part in parts]
    new = remove_blocks(gm, [b for b in blocks if b.name.startswith("layers.1")]).eval()
    shorter = copy.deepcopy(model)
    if norm_first:  # a pre-LN layer without its two branches is the identity: the layer is gone
        del shorter.layers[1]
    else:  # a post-LN layer keeps its two LayerNorms
        shorter.layers[1] = nn.Sequential(shorter.layers[1].norm1, shorter.layers[1].norm2)
    with torch.no_grad():
        torch.testing.assert_close(new(x), shorter(x), rtol=1e-6, atol=1e-6)


def test_latency_budget_removes_blocks_until_the_table_predicts_it(tmp_path: Path) -> None:
    import json

    from minreal.compress.core.cache import model_key

    model, data = _resnet(), _images()
    prep = depth_prepare(model, data, DepthConfig(criterion="energy"))
    savings = {n: 1.0 + i for i, n in enumerate(prep.removable)}  # made-up savings, ms; the whole model 40 ms
    table = tmp_path / "depth.json"
    table.write_text(json.dumps({"kind": "depth", "model_hash": model_key(model), "model_ms": 40.0,
                                 "blocks": {n: {"ms": 40.0 - s, "saving_ms": s} for n, s in savings.items()}}))
    cfg = DepthConfig(criterion="energy", latency_ratio=0.8, latency_table=str(table))
    _, report = depth_realise(prep, cfg)
    removed = report.predicted["removed"]
    predicted = (40.0 - sum(savings[n] for n in removed)) / 40.0
    assert report.predicted["whole_model_latency_ratio"] == pytest.approx(predicted) and predicted <= 0.8
    assert (40.0 - sum(savings[n] for n in removed[:-1])) / 40.0 > 0.8
    table.write_text(json.dumps({"kind": "width", "model_hash": model_key(model)}))
    with pytest.raises(CompressionError, match="is not a depth table"):
        depth_realise(prep, cfg)


class _Unpacked(nn.Module):
    """Pre-LN attention written ``h, _ = attn(...)``: the unused second output must not hide the block."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 3)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = self.norm(h)
        out, _ = self.attn(a, a, a)
        return self.head((h + out).mean(1))


def test_an_unused_second_output_does_not_hide_an_attention_block() -> None:
    torch.manual_seed(0)
    model, x = _Unpacked().eval(), torch.randn(4, 5, 16)
    gm, blocks, _ = _blocks(model, x)
    assert [b.modules for b in blocks] == [("norm", "attn")]
    new = remove_blocks(gm, blocks).eval()
    with torch.no_grad():
        torch.testing.assert_close(new(x), model.head(x.mean(1)), rtol=1e-6, atol=1e-6)


class _Shared(nn.Module):
    """One block applied twice (shared weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.blk = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.blk(x)
        x = x + self.blk(x)
        return self.head(x)


def test_a_block_applied_twice_is_two_blocks_with_two_names() -> None:
    torch.manual_seed(0)
    gm, blocks, _ = _blocks(_Shared().eval(), torch.randn(4, 8))
    assert len(blocks) == 2 and len({b.name for b in blocks}) == 2


class _InPlace(nn.Module):
    """``y = relu_(h + c(h))`` while ``h`` is read again later; and a branch that starts by writing into its input."""

    def __init__(self, write_input: bool) -> None:
        super().__init__()
        self.write_input = write_input
        self.c, self.h1, self.h2 = nn.Linear(8, 8), nn.Linear(8, 2), nn.Linear(8, 2)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1.0
        if self.write_input:
            return self.h1(h + self.c(torch.relu_(h)))
        y = self.act(h + self.c(h))
        return self.h1(y) + self.h2(h)


def test_in_place_writes_never_make_a_removal_inexact() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 8)
    model = _InPlace(write_input=False).eval()
    with torch.no_grad():
        model.c.weight.zero_()
        model.c.bias.zero_()
    gm, blocks, _ = _blocks(model, x)
    assert len(blocks) == 1
    new = remove_blocks(gm, blocks).eval()
    with torch.no_grad():
        torch.testing.assert_close(new(x), model(x), rtol=0, atol=0)  # the in-place ReLU gets a copy of h
    _, blocks, _ = _blocks(_InPlace(write_input=True).eval(), x)
    assert blocks == []  # removing that branch would also undo its write into h


class _Gated(nn.Module):
    """Residual blocks inside a forward torch.fx cannot trace (a branch on a tensor): kept whole as one layer."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > -1e9:
            x = x + self.a(x)
        return x + self.b(x)


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.fc = _Gated(), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + self.fc(x)


def test_residual_sums_inside_a_block_kept_whole_are_named_unseen() -> None:
    """A module torch.fx cannot trace through is kept whole: depth cannot see the residual sums inside it, and says
    so, in the report and in the refusal when nothing else is removable."""
    torch.manual_seed(0)
    data = Dataset(torch.randn(16, 8))
    with pytest.raises(CompressionError, match=r"^depth: _Outer has no removable residual block .*\(_Gated is traced "
                                               r"as one layer"):
        compress(_Outer().eval(), data, "depth", DepthConfig(mac_ratio=0.8))

    class WithBlock(nn.Module):  # a residual block of its own beside the module kept whole
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.fc1, self.fc2 = _Gated(), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.inner(x)
            return y + self.fc2(torch.relu(self.fc1(y)))

    prep = depth_prepare(WithBlock().eval(), data, DepthConfig())
    assert any(name == "_Gated" and "its own residual sums are not seen" in why for name, why in prep.left)


class _SizeChecked(nn.Module):
    """Two residual blocks behind a check of a size in Python (as Hugging Face's GPT2Model builds its masks): plain
    torch.fx fails inside this forward, so the module is kept whole."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3, self.fc4 = (nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 8:
            raise ValueError("expects 8 features")
        x = x + self.fc2(torch.relu(self.fc1(x)))
        return x + self.fc4(torch.relu(self.fc3(x)))


class _Checked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = _SizeChecked(), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_blocks_inside_a_module_plain_fx_keeps_whole_are_found_by_a_trace_carrying_values() -> None:
    """Review (a GPT2LMHeadModel behind a one-line wrapper): plain torch.fx keeps GPT2Model whole (a size check in
    its mask code), so depth found no block where width methods, tracing again with example values, cut inside it.
    Depth now traces again too: the blocks inside are found, one removed is exactly its branch gone (the model with
    that branch's last layer zeroed), the report says the trace fixed a decision, and realise traces the same way."""
    from minreal.compress.core.width.tracing import DECISIONS_NOTE

    torch.manual_seed(0)
    model, data = _Checked().eval(), Dataset(torch.randn(32, 8))
    assert trace(model, data.x[:2]).meta["opaque"].keys() == {"_SizeChecked"}
    config = DepthConfig(criterion="energy", mac_ratio=0.75, score_samples=32)
    prep = depth_prepare(model, data, config)
    assert prep.traced_values and len(prep.blocks) == 2 and len(prep.removable) == 2
    new, report = depth_realise(prep, config)
    (removed,) = report.predicted["removed"]
    last = {b.name: b for b in prep.blocks}[removed].modules[-1]
    expected = copy.deepcopy(model)
    with torch.no_grad():
        expected.get_submodule(last).weight.zero_()
        expected.get_submodule(last).bias.zero_()
        torch.testing.assert_close(new(data.x), expected(data.x), rtol=0, atol=0)
    assert any(n.startswith(DECISIONS_NOTE) for n in report.notes)
    assert report.predicted["traced_decisions"]


def test_a_parameter_budget_counts_a_shared_layer_once_with_the_last_of_its_blocks() -> None:
    torch.manual_seed(0)
    model, data = _Shared().eval(), Dataset(torch.randn(16, 8))  # one block applied twice
    prep = depth_prepare(model, data, DepthConfig(criterion="energy", score_samples=16))
    shared = sum(p.numel() for p in model.blk.parameters())
    assert set(prep.params.values()) == {0} and prep.params_freed(prep.removable) == shared == 144
    new, report = compress(model, data, "depth", DepthConfig(criterion="energy", param_ratio=0.5, score_samples=16))
    assert len(report.predicted["removed"]) == 2
    assert report.predicted["block_budget"]["reached"] == pytest.approx(report.param_ratio, rel=1e-12)
    assert sum(p.numel() for p in new.parameters()) == prep.total_params - shared


def _removal_costs(gm, blocks, x) -> tuple[dict[str, int], int]:
    """Each block's saving counted the long way: the whole model's MACs less those of a copy without the block."""
    from minreal.compress.core.costs import model_macs

    total = model_macs(gm, x)
    return {b.name: total - model_macs(remove_blocks(gm, [b]), x) for b in blocks}, total


@pytest.mark.parametrize("case", ["cifar_resnet", "mobilenet_v2", "swin_t", "shared_mask", "unused_in_place", "ssm"])
def test_block_costs_from_one_counted_forward_equal_removing_each_block(case: str) -> None:
    """What each block's removal saves, from one forward counted per node, equals the count of the model without it
    (torchvision's inverted residuals, Swin's attention with its relative-position bias, a mask that two blocks
    share, which the removal of one leaves); an SSM model, whose layers count by their rule, is counted the long way
    and agrees as well."""
    import torchvision

    from minreal.compress.core.costs import model_macs, node_flops
    from minreal.compress.methods.depth.method import _costs
    from minreal.compress.methods.ssm.classifier import SSMClassifier

    torch.manual_seed(0)
    if case == "cifar_resnet":
        model, x = _resnet(), _images().x[:2]
    elif case == "mobilenet_v2":
        model, x = torchvision.models.mobilenet_v2(width_mult=0.5).eval(), torch.rand(2, 3, 32, 32)
    elif case == "swin_t":
        model, x = torchvision.models.swin_t().eval(), torch.rand(2, 3, 32, 32)
    elif case == "shared_mask":
        model, x = _SharedMask().eval(), torch.rand(2, 6, 16)
    elif case == "unused_in_place":
        model, x = _UnusedInPlace().eval(), torch.rand(2, 6, 16)
    else:
        model, x = SSMClassifier(3, 16, 8, 3, 4).eval(), torch.rand(2, 20, 3)
    gm, blocks, _ = _blocks(model, x)
    assert len(blocks) >= 2
    fast = _costs(gm, blocks, x)
    assert fast == _removal_costs(gm, blocks, x)
    assert all(v > 0 for v in fast[0].values())
    one_forward = sum(node_flops(gm, x).values()) // 2 == model_macs(gm, x)
    assert one_forward == (case != "ssm")  # the SSM layers' FFT: torch's count is not the whole one there


class _UnusedInPlace(nn.Module):
    """Review: a gate made in place by a statement (``g.sigmoid_()``, a node nothing uses) that one branch reads:
    the removal keeps the gate's layer (the statement still reads it), so that block saves only its own."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.gate, self.a, self.b = (nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate(x)
        g.sigmoid_()
        h = self.stem(x)
        h = h + self.a(h) * g
        return h + self.b(h)


class _SharedMask(nn.Module):
    """Two gated residual blocks whose gate is one layer of the model's input that both branches read (it stays
    while one of them does), and a second gate only the first block reads (it goes with that block)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.q1, self.q2 = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.shared, self.own = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.shared(x)  # not descended from either block's input
        h = self.stem(x)
        h = h + self.q1(h) * gate * self.own(x)
        return h + self.q2(h) * gate


def test_scoring_batches_shrink_with_the_activations_and_the_scores_stay() -> None:
    """Fixed batches of 128 (64 with autograd) would hold GBs of activations at high resolutions; the batch now
    keeps one batch's largest activation under FORWARD_BYTES (all of them under BACKWARD_BYTES), and the scores
    do not depend on it."""
    from minreal.compress.core.width.tracing import BACKWARD_BYTES, FORWARD_BYTES, activation_batch
    from minreal.compress.methods.depth.criteria import energy_scores, observability_scores

    torch.manual_seed(0)
    big = CifarResNet(blocks_per_stage=1, in_channels=1).eval()
    gm, _, _ = _blocks(big, torch.rand(2, 1, 256, 256))
    largest = 16 * 256 * 256 * 4  # the stem's 16 channels at full resolution, float32, per sample
    assert activation_batch(gm, 128) == FORWARD_BYTES // largest == 64
    assert activation_batch(gm, 64, backward=True) < BACKWARD_BYTES // largest
    small, x = _resnet(), _images(40).x
    gm, blocks, _ = _blocks(small, x)
    assert activation_batch(gm, 128) == 128 and activation_batch(gm, 64, backward=True) == 64
    table = _TableLookup().eval()  # review: a 50000 x 64 parameter table is no activation of each sample
    gm_table, _, _ = _blocks(table, torch.randint(0, 50000, (2, 16)))
    assert activation_batch(gm_table, 128) == 128 and activation_batch(gm_table, 64, backward=True) == 64
    for a, b in zip(energy_scores(gm, blocks, x), energy_scores(gm, blocks, x, batch=7), strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    # Hutchinson probes are drawn per batch, so that estimate depends on the batches: small activations keep 64
    assert observability_scores(gm, blocks, x, 2, 0) == observability_scores(gm, blocks, x, 2, 0, batch=64)


class _TableLookup(nn.Module):
    """Token ids looked up in a large table held by the model (``F.embedding`` of a parameter: a get_attr node),
    then two residual blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(50000, 64))
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = F.embedding(ids, self.table)
        h = h + self.a(h)
        return h + self.b(h)
