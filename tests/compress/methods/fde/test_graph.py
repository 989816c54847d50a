"""fde's graph path (minreal.compress.methods.fde.graph, .graph_path): ε-FDE in every channel group of a traced model —
exact at ε = 0 on any input across residual, concatenation and plain groups, scaled merges only where the group is
positively homogeneous, dead channels, budgets by bisection, and refusals."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.methods.fde import FDEConfig, is_exported_program

ROOT = Path(__file__).resolve().parents[4]
EXACT = FDEConfig(merge_eps=0.0, remove_dead=False)


def _randomise_bn(model: nn.Module) -> None:
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.5)


def _copy_rows(conv: nn.Conv2d, bn: nn.BatchNorm2d | None, src: int, dst: int, scale: float = 1.0) -> None:
    """Channel ``dst`` := ``scale`` × channel ``src`` after BN (BN γ, β scaled; the conv row copied)."""
    with torch.no_grad():
        conv.weight[dst] = conv.weight[src]
        if conv.bias is not None:
            conv.bias[dst] = conv.bias[src]
        if bn is not None:
            for p in (bn.running_mean, bn.running_var):
                p[dst] = p[src]
            bn.weight[dst], bn.bias[dst] = scale * bn.weight[src], scale * bn.bias[src]


def _copy_bn(bn: nn.BatchNorm2d, src: int, dst: int) -> None:
    with torch.no_grad():
        for p in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
            p[dst] = p[src]


class _Block(nn.Module):
    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, hidden, 3, padding=1, bias=False), nn.BatchNorm2d(hidden)
        self.conv2, self.bn2 = nn.Conv2d(hidden, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))


class _ResidualNet(nn.Module):
    """Stem conv→BN→ReLU (8 channels), two residual blocks (8 → 6 → 8, identity shortcut), pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.blocks = nn.ModuleList([_Block(8, 6), _Block(8, 6)])
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.stem(x)))
        for block in self.blocks:
            x = F.relu(x + block(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _planted_residual() -> _ResidualNet:
    """Stream: 5 ≡ 2 and 6 = 2·1 at every writer (stem and both blocks' conv2, BN folded); block 0's hidden
    channels 3 and 4 differ in the columns of stream channels 2 and 5 but agree once those are summed."""
    torch.manual_seed(3)
    net = _ResidualNet().eval()
    _randomise_bn(net)
    _copy_rows(net.stem, net.bn, 2, 5)
    _copy_rows(net.stem, net.bn, 1, 6, scale=2.0)
    for block in net.blocks:
        _copy_rows(block.conv2, block.bn2, 2, 5)
        _copy_rows(block.conv2, block.bn2, 1, 6, scale=2.0)
    b = net.blocks[0]
    _copy_rows(b.conv1, b.bn1, 3, 4)
    with torch.no_grad():
        w = b.conv1.weight
        w[4, 5] = torch.randn(3, 3)
        w[4, 2] = w[3, 2] + w[3, 5] - w[4, 5]
    return net


class _DenseNet(nn.Module):
    """DenseNet-like: stem (4) → BN-ReLU-conv (3) → concat (7) → BN-ReLU-conv (3) → concat (10) → BN-ReLU → head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1, self.conv1 = nn.BatchNorm2d(4), nn.Conv2d(4, 3, 3, padding=1)
        self.bn2, self.conv2 = nn.BatchNorm2d(7), nn.Conv2d(7, 3, 3, padding=1)
        self.bn3, self.head = nn.BatchNorm2d(10), nn.Linear(10, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = self.stem(x)
        c1 = torch.cat([x0, self.conv1(F.relu(self.bn1(x0)))], 1)
        c2 = torch.cat([c1, self.conv2(F.relu(self.bn2(c1)))], 1)
        return self.head(F.adaptive_avg_pool2d(F.relu(self.bn3(c2)), 1).flatten(1))


def _planted_dense() -> _DenseNet:
    """One concat group of 10: stem 3 ≡ 1, first conv's 2 ≡ 0 (channels 6 ≡ 4), second conv's 1 ≡ 0 once the
    first merge sums its input columns (channels 8 ≡ 7); every BN over them agrees."""
    torch.manual_seed(5)
    net = _DenseNet().eval()
    _randomise_bn(net)
    _copy_rows(net.stem, None, 1, 3)
    _copy_rows(net.conv1, None, 0, 2)
    _copy_rows(net.conv2, None, 0, 1)
    with torch.no_grad():
        w = net.conv2.weight
        w[1, 6] = torch.randn(3, 3)
        w[1, 4] = w[0, 4] + w[0, 6] - w[1, 6]
        w[1, 3] = torch.randn(3, 3)
        w[1, 1] = w[0, 1] + w[0, 3] - w[1, 3]
    for bn, pairs in ((net.bn1, [(1, 3)]), (net.bn2, [(1, 3), (4, 6)]), (net.bn3, [(1, 3), (4, 6), (7, 8)])):
        for src, dst in pairs:
            _copy_bn(bn, src, dst)
    return net


class _PlainNet(nn.Module):
    """conv→BN→act→conv→BN→act→pool→linear as user code (not a Sequential)."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.act, self.head = act, nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn2(self.conv2(self.act(self.bn1(self.conv1(x))))))
        return self.head(x.mean((2, 3)))


def _planted_plain(act: nn.Module) -> _PlainNet:
    """conv1 channel 4 ≡ 1 and channel 6 = 3·channel 2 (after BN)."""
    torch.manual_seed(7)
    net = _PlainNet(act).eval()
    _randomise_bn(net)
    _copy_rows(net.conv1, net.bn1, 1, 4)
    _copy_rows(net.conv1, net.bn1, 2, 6, scale=3.0)
    return net


def _images(n: int = 24, size: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _assert_exact(model: nn.Module, new: nn.Module, size: int = 8) -> None:
    """Same outputs on inputs the merge never saw (float32 rounding of the summed weights)."""
    x = 3.0 * _images(16, size, seed=99)
    with torch.no_grad():
        ref, out = model(x), new(x)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_residual_group_merges_exactly() -> None:
    model = _planted_residual()
    new, rep = compress(model, Dataset(_images()), "fde", EXACT)
    widths = rep.predicted["group_widths"]
    assert widths["stem"] == [8, 6] and widths["blocks.0.conv1"] == [6, 5] and widths["blocks.1.conv1"] == [6, 6]
    stream = rep.layers[0].details
    assert stream["merged_blocks"] == [[1, 6], [2, 5]] and stream["mode"] == "scaled"
    assert rep.layers[1].details["merged_blocks"] == [[3, 4]]
    assert rep.predicted["output_deviation_bound"] is None and any("MLP-only" in n for n in rep.notes)
    assert rep.measured["max_output_deviation_data_float64"] < 1e-5
    assert rep.params_after == sum(p.numel() for p in new.parameters()) < rep.params_before
    _assert_exact(model, new)


def test_concat_group_merges_exactly() -> None:
    model = _planted_dense()
    new, rep = compress(model, Dataset(_images()), "fde", EXACT)
    (group,) = [lr for lr in rep.layers if lr.full_rank == 10]
    assert group.details["merged_blocks"] == [[1, 3], [4, 6], [7, 8]]
    assert new.conv2.in_channels == 5 and new.head.in_features == 7
    _assert_exact(model, new)


def test_plain_group_scaled_merges_only_when_homogeneous() -> None:
    relu, gelu = _planted_plain(nn.ReLU()), _planted_plain(nn.GELU())
    new, rep = compress(relu, Dataset(_images()), "fde", EXACT)
    assert rep.layers[0].details["merged_blocks"] == [[1, 4], [2, 6]]
    _assert_exact(relu, new)
    new, rep = compress(gelu, Dataset(_images()), "fde", EXACT)
    assert rep.layers[0].details["mode"] == "value" and rep.layers[0].details["merged_blocks"] == [[1, 4]]
    _assert_exact(gelu, new)


class _LayerScaleNet(nn.Module):
    """conv → ReLU → x·γ + β (per-channel parameters of shape [1, C, 1, 1]) → conv → pool → linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2, self.head = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 5, 3), nn.Linear(5, 2)
        self.gamma = nn.Parameter(torch.rand(1, 6, 1, 1) + 0.5)
        self.beta = nn.Parameter(torch.randn(1, 6, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x)) * self.gamma + self.beta
        return self.head(F.relu(self.conv2(x)).mean((2, 3)))


def test_per_channel_constants_must_agree() -> None:
    torch.manual_seed(13)
    model = _LayerScaleNet().eval()
    _copy_rows(model.conv1, None, 1, 4)
    _copy_rows(model.conv1, None, 2, 5)
    with torch.no_grad():
        model.gamma[0, 4], model.beta[0, 4] = model.gamma[0, 1], model.beta[0, 1]  # channel 5: γ differs from 2's
    new, rep = compress(model, Dataset(_images()), "fde", EXACT)
    assert rep.layers[0].details["merged_blocks"] == [[1, 4]] and tuple(new.gamma.shape) == (1, 5, 1, 1)
    _assert_exact(model, new)


class _TokenNet(nn.Module):
    """Linear → LayerNorm over the channels → GELU → Linear on [batch, tokens, channels]."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.norm(self.fc1(x)))).mean(1)


def test_layernorm_group_left_whole_with_the_reason() -> None:
    torch.manual_seed(17)
    model = _TokenNet().eval()
    with torch.no_grad():
        model.fc1.weight[5], model.fc1.bias[5] = model.fc1.weight[2], model.fc1.bias[2]
    new, rep = compress(model, Dataset(torch.randn(16, 5, 4)), "fde", EXACT)
    assert rep.predicted["group_widths"]["fc1"] == [8, 8] and rep.layers[0].action == "kept"
    assert "LayerNorm over the channels" in rep.predicted["groups_left_whole"]["fc1"]
    assert any(n.startswith("left whole: fc1 (LayerNorm") for n in rep.notes)


def test_tolerance_merges_near_duplicates() -> None:
    model = _planted_plain(nn.ReLU())
    with torch.no_grad():
        model.conv1.weight[5] = model.conv1.weight[0] + 1e-4 * torch.randn(3, 3, 3)
        model.conv1.bias[5] = model.conv1.bias[0]
    _copy_bn(model.bn1, 0, 5)
    _, exact = compress(model, Dataset(_images()), "fde", EXACT)
    _, loose = compress(model, Dataset(_images()), "fde", FDEConfig(merge_eps=0.05, remove_dead=False))
    assert exact.layers[0].details["merged_blocks"] == [[1, 4], [2, 6]]
    assert loose.layers[0].details["merged_blocks"] == [[0, 5], [1, 4], [2, 6]]
    assert 0 < loose.measured["max_output_deviation_data_float64"] < 0.05


def test_measure_off_skips_only_the_float64_deviation_pass() -> None:
    """``measure=False`` (a caller measuring on its own held-out data) skips the pass of both models over the data
    and nothing else: the same merges, the same weights; the flag does not leak into the next call."""
    model = _planted_plain(nn.ReLU())
    with torch.no_grad():
        model.conv1.weight[5] = model.conv1.weight[0] + 1e-4 * torch.randn(3, 3, 3)
        model.conv1.bias[5] = model.conv1.bias[0]
    _copy_bn(model.bn1, 0, 5)
    cfg = FDEConfig(merge_eps=0.05, remove_dead=False)
    measured_new, measured = compress(model, Dataset(_images()), "fde", cfg)
    quiet_new, quiet = compress(model, Dataset(_images()), "fde", cfg, measure=False)
    assert "max_output_deviation_data_float64" in measured.measured
    assert not any(k.startswith("max_output_deviation_data") for k in quiet.measured)
    assert any("the deviation is measured on the calibration data" in n for n in measured.notes)
    assert not any("measured on the calibration data" in n for n in quiet.notes)
    assert any("the deviation is not measured here" in n for n in quiet.notes)
    assert quiet.layers[0].details["merged_blocks"] == measured.layers[0].details["merged_blocks"]
    a, b = measured_new.state_dict(), quiet_new.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    _, again = compress(model, Dataset(_images()), "fde", cfg)
    assert "max_output_deviation_data_float64" in again.measured


def test_dead_channels_removed_exactly_on_the_data() -> None:
    model = _planted_residual()
    with torch.no_grad():
        model.blocks[1].bn1.bias[[0, 2]] = -100.0  # never active after the ReLU
    data = Dataset(_images())
    new, rep = compress(model, data, "fde", FDEConfig(merge_eps=0.0))
    hidden = rep.layers[2]
    assert hidden.name == "blocks.1.conv1" and hidden.details["dead_removed"] == 2 and hidden.action == "reduced"
    assert rep.predicted["dead_removed"] == 2 and rep.predicted["group_widths"]["blocks.1.conv1"] == [6, 4]
    assert rep.measured["max_output_deviation_data_float64"] < 1e-5


def _resnet20() -> nn.Module:
    spec = importlib.util.spec_from_file_location("resnet20_user", ROOT / "examples" / "resnet20_user.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.resnet20().eval()


def _planted_resnet20() -> nn.Module:
    """Stream channels 2 ≡ 9 of stage 1 (at offsets 8 and 24 in stages 2 and 3, past the option-A zero pads),
    the stage-2 zero-pad slots 1 ≡ 5 (zero at the pad, equal at every later conv2), and a hidden pair."""
    net = _resnet20()
    _randomise_bn(net)
    offset = {1: 0, 2: 8, 3: 24}
    _copy_rows(net.conv1, net.bn1, 2, 9)
    for stage, blocks in enumerate((net.layer1, net.layer2, net.layer3), 1):
        for block in blocks:
            _copy_rows(block.conv2, block.bn2, 2 + offset[stage], 9 + offset[stage])
            if stage > 1:
                _copy_rows(block.conv2, block.bn2, 1 + offset[stage] - 8, 5 + offset[stage] - 8)
    _copy_rows(net.layer1[0].conv1, net.layer1[0].bn1, 3, 11)
    return net


def test_resnet20_user_code_duplicates_merge_exactly_and_export(tmp_path: Path) -> None:
    from minreal.export.onnx_export import to_onnx
    from minreal.export.verify import verify_parity

    model = _planted_resnet20()
    data = Dataset(_images(8, 32))
    new, rep = compress(model, data, "fde", EXACT)
    widths = rep.predicted["group_widths"]
    assert widths["conv1"] == [64, 62] and widths["layer1.0.conv1"] == [16, 15]
    assert sum(w[0] - w[1] for w in widths.values()) == 3
    _assert_exact(model, new, size=32)
    path = tmp_path / "resnet20_fde.onnx"
    to_onnx(new, data.x[:2], path)
    assert verify_parity(new, path, [data.x[:1], data.x[:5]], rtol=1e-4, atol=1e-4).passed


@pytest.mark.parametrize("kind", ["param_ratio", "mac_ratio"])
def test_budget_met_by_bisecting_eps(kind: str) -> None:
    torch.manual_seed(11)
    model = _ResidualNet().eval()
    _randomise_bn(model)
    new, rep = compress(model, Dataset(_images()), "fde", FDEConfig(**{kind: 0.6}))
    achieved = rep.param_ratio if kind == "param_ratio" else rep.mac_ratio
    assert achieved <= 0.6 and rep.predicted["budget"]["achieved"] == achieved
    assert rep.predicted["budget_cost_ratio"] == pytest.approx(achieved)
    eps = rep.predicted["merge_eps_reached"]
    assert 0 < eps == rep.predicted["merge_eps"] <= 2
    # the bisection costs a cut once per set of leaders; the model it returns is the merge at the ε it reached
    at_eps, _ = compress(model, Dataset(_images()), "fde", FDEConfig(merge_eps=eps))
    a, b = new.state_dict(), at_eps.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bisection_costs_each_cut_once(monkeypatch) -> None:
    """The budget bisection counts the costs of the full model once and of each distinct cut (set of leaders) once,
    however many ε values land on it; it does revisit cuts here, so the memo is exercised."""
    from minreal.compress.methods.fde import graph, graph_path

    cuts, costed = [], []
    real_at, real_cost = graph.Lumper.at, graph_path._cost

    def at(self, eps: float):
        parts, stats = real_at(self, eps)
        cuts.append(b"".join(k.encode() + parts[k].leader.tobytes() for k in sorted(parts)))
        return parts, stats

    def cost(model: nn.Module, example: torch.Tensor, kind: str) -> float:
        costed.append(kind)
        return real_cost(model, example, kind)

    monkeypatch.setattr(graph.Lumper, "at", at)
    monkeypatch.setattr(graph_path, "_cost", cost)
    torch.manual_seed(11)
    model = _ResidualNet().eval()
    _randomise_bn(model)
    compress(model, Dataset(_images()), "fde", FDEConfig(mac_ratio=0.6))
    assert len(cuts) > len(set(cuts))
    assert len(costed) == 1 + len(set(cuts))


def test_unreachable_budget_names_the_smallest_ratio() -> None:
    torch.manual_seed(11)
    with pytest.raises(CompressionError, match=r"^--param-ratio 0.01 cannot be met: .* reaches 0\.\d+ at best; "
                                               r"give --param-ratio >= 0\.\d+$"):
        compress(_ResidualNet().eval(), Dataset(_images()), "fde", FDEConfig(param_ratio=0.01))


def test_exported_program_refused_in_one_line() -> None:
    model = _planted_plain(nn.ReLU())
    program = torch.export.export(model, (_images(2),)).module()
    assert is_exported_program(program) and not is_exported_program(torch.fx.symbolic_trace(model))
    with pytest.raises(CompressionError, match=r"^fde needs the Python model \(path/to/file.py:factory or a "
                                               r"torchvision name\): .*cannot be resized$"):
        compress(program, Dataset(_images()), "fde", EXACT)


def test_mlp_only_options_refused_on_other_models() -> None:
    """Asked for explicitly, the MLP-only options are refused; by default (compensation not given) the graph path
    merges into leaders uncompensated, exactly as saying so does."""
    model, data = _planted_plain(nn.ReLU()), Dataset(_images())
    for cfg in (FDEConfig(representative="mean"), FDEConfig(representative="lstsq"), FDEConfig(compensation=True)):
        with pytest.raises(CompressionError, match="--representative mean/lstsq and --compensation are for MLPs"):
            compress(model, data, "fde", cfg)
    auto, _ = compress(model, data, "fde", FDEConfig(merge_eps=0.05))
    classic, _ = compress(model, data, "fde", FDEConfig(merge_eps=0.05, representative="leader", compensation=False))
    x = data.x[:8]
    torch.testing.assert_close(auto(x), classic(x), rtol=0, atol=0)
