"""``depth`` and memory: an in-place operation after a removed sum writes into neither the model's input nor a value
read elsewhere (also through views and aliases), the scores see the model that is built, a branch that writes into
its input through an alias is no block, a skip of another layout is given the sum's; and its budget inputs: MACs
counted as the report counts them, frozen weights, a malformed latency table, several outputs compared as values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.cache import model_key
from minreal.compress.core.data import Dataset
from minreal.compress.core.errors import CompressionError
from minreal.compress.methods.depth import DepthConfig, find_blocks, remove_blocks
from minreal.compress.methods.depth.criteria import divergence, outputs, removal_scores
from minreal.compress.methods.depth.method import _traced, depth_prepare, depth_realise


class _OnInput(nn.Module):
    """``relu_(x + fc(x))`` on the model's input: removing ``fc`` leaves the in-place ReLU on ``x``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head, self.act = nn.Linear(8, 8), nn.Linear(8, 2), nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(x + self.fc(x)))


class _ThroughAlias(nn.Module):
    """``h`` read again after an in-place ReLU of ``identity(h + c(h))``: the write reaches the sum through an alias."""

    def __init__(self) -> None:
        super().__init__()
        self.c, self.h1, self.h2 = nn.Linear(8, 8), nn.Linear(8, 2), nn.Linear(8, 2)
        self.act, self.ident = nn.ReLU(inplace=True), nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1.0
        y = self.act(self.ident(h + self.c(h)))
        return self.h1(y) + self.h2(h)


class _BranchWritesSkip(nn.Module):
    """A branch ``c(relu_(contiguous(h)))``: the in-place ReLU writes into ``h`` itself (``contiguous`` aliases)."""

    def __init__(self) -> None:
        super().__init__()
        self.c, self.head = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1.0
        return self.head(h + self.c(h.contiguous().relu_()))


class _Transposed(nn.Module):
    """A skip that is a transpose (not contiguous) and a sum that is: a later ``view`` needs the sum's layout."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(4, 4), nn.Linear(20, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.transpose(1, 2)
        y = self.fc(t) + t
        return self.head(y.view(y.size(0), -1))


def _zeroed(model: nn.Module, layer: str) -> nn.Module:
    with torch.no_grad():
        for p in getattr(model, layer).parameters():
            p.zero_()
    return model


def test_compress_and_the_compressed_model_leave_the_callers_inputs_alone() -> None:
    torch.manual_seed(0)
    data = Dataset(torch.randn(16, 8))
    before = data.x.clone()
    new, report = compress(_OnInput().eval(), data, "depth", DepthConfig(mac_ratio=0.5, score_samples=8))
    assert report.predicted["removed"] == ["fc"] and torch.equal(data.x, before)
    x = torch.randn(4, 8)
    x0 = x.clone()
    with torch.no_grad():
        out = new(x)
        want = new.head(torch.relu(x0))  # the block removed: head(relu(x)), x untouched
    assert torch.equal(x, x0) and (x < 0).any()
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_a_write_through_an_alias_of_the_sum_gets_a_copy_and_the_scores_see_the_built_model() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 8)
    model = _zeroed(_ThroughAlias().eval(), "c")
    gm = _traced(model, x[:2])
    blocks, _ = find_blocks(gm)
    assert [b.name for b in blocks] == ["c"]
    with torch.no_grad():
        torch.testing.assert_close(remove_blocks(gm, blocks).eval()(x), model(x), rtol=0, atol=0)  # zero branch: exact
    model = _ThroughAlias().eval()  # a live branch: the interpreter's scores are the built model's
    gm = _traced(model, x[:2])
    blocks, _ = find_blocks(gm)
    with torch.no_grad():
        built = remove_blocks(gm, blocks).eval()(x)
        ref = outputs(gm, x)
    torch.testing.assert_close(outputs(gm, x, blocks), built, rtol=0, atol=0)
    assert removal_scores(gm, blocks, x, ref, False)["c"] == pytest.approx(divergence(ref, built, False), rel=1e-12)


def test_a_branch_that_writes_into_its_input_through_an_alias_is_no_block() -> None:
    x = torch.randn(3, 8)
    blocks, _ = find_blocks(_traced(_BranchWritesSkip().eval(), x[:2]))
    assert blocks == []


def test_a_skip_of_another_layout_is_given_the_sums() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5)
    model = _zeroed(_Transposed().eval(), "fc")
    gm = _traced(model, x[:2])
    blocks, _ = find_blocks(gm)
    assert [b.name for b in blocks] == ["fc"]
    with torch.no_grad():
        torch.testing.assert_close(remove_blocks(gm, blocks).eval()(x), model(x), rtol=0, atol=0)
        torch.testing.assert_close(outputs(gm, x, blocks), model(x), rtol=0, atol=0)


class _Ssm(nn.Module):
    """An SSM block (an FFT convolution torch does not count) and an MLP block."""

    def __init__(self) -> None:
        super().__init__()
        from minreal.compress.methods.ssm.layers import RotationSSM

        self.ssm = RotationSSM(8, 16)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ssm(x)
        x = x + self.mlp(x)
        return self.head(x.mean(1))


def test_depth_budgets_the_macs_the_report_measures() -> None:
    torch.manual_seed(0)
    data = Dataset(torch.randn(16, 32, 8))
    for ratio in (0.9, 0.52):
        _, report = compress(_Ssm().eval(), data, "depth", DepthConfig(criterion="energy", mac_ratio=ratio,
                                                                       score_samples=16))
        assert report.predicted["block_budget"]["reached"] == pytest.approx(report.mac_ratio, rel=1e-9)
        assert report.mac_ratio <= ratio


def test_observability_scores_a_model_with_frozen_weights() -> None:
    torch.manual_seed(0)
    model = _OnInput().eval().requires_grad_(False)
    prep = depth_prepare(model, Dataset(torch.randn(16, 8)), DepthConfig(criterion="observability"))
    assert prep.scores["observability"]["fc"] > 0
    assert not any(p.requires_grad for p in model.parameters())  # the user's model is left as it was


@pytest.mark.parametrize("entry", [{"ms": 1.0}, {"saving_ms": "fast"}, 3.0])
def test_a_malformed_latency_table_is_refused_naming_the_file_and_key(tmp_path: Path, entry: object) -> None:
    torch.manual_seed(0)
    model = _OnInput().eval()
    prep = depth_prepare(model, Dataset(torch.randn(16, 8)), DepthConfig(criterion="energy"))
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"kind": "depth", "model_hash": model_key(model), "model_ms": 2.0,
                                 "blocks": {"fc": entry}}))
    with pytest.raises(CompressionError, match=r"t\.json: blocks\.fc\.saving_ms is .* not a number") as info:
        depth_realise(prep, DepthConfig(criterion="energy", latency_ratio=0.8, latency_table=str(table)))
    assert "\n" not in str(info.value)


class _TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + self.fc(x)
        return self.a(h), self.b(h)


def test_several_outputs_are_compared_as_values_not_as_one_softmax() -> None:
    torch.manual_seed(0)
    model, x = _TwoOutputs().eval(), torch.randn(16, 8)
    data = Dataset(x, torch.randint(0, 3, (16,)))  # class labels: one output alone would be a classifier
    prep = depth_prepare(model, data, DepthConfig(criterion="removal", score_samples=16))
    with torch.no_grad():
        ref, new = torch.cat(model(x), 1).double(), torch.cat([model.a(x), model.b(x)], 1).double()
    assert prep.scores["removal"]["fc"] == pytest.approx(float(((new - ref) ** 2).sum() / (ref ** 2).sum()), rel=1e-6)


class _LayerScaled(nn.Module):
    """Blocks ``x + gamma * fc(x)``: ``gamma`` is read by a get_attr node, which takes no input from the block; the
    second also adds a bias gathered from a table (nodes outside the branch that die with it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)
        self.gamma1, self.gamma2 = nn.Parameter(torch.full((8,), 0.5)), nn.Parameter(torch.full((8,), 0.1))
        self.table = nn.Parameter(torch.randn(3, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.gamma1 * self.fc1(x)
        return self.head(x + self.gamma2 * (self.fc2(x) + self.table.sum(0)))


def test_a_parameter_read_by_get_attr_goes_with_its_block() -> None:
    torch.manual_seed(0)
    model, data = _LayerScaled().eval(), Dataset(torch.randn(16, 8))
    prep = depth_prepare(model, data, DepthConfig(criterion="energy", score_samples=16))
    assert prep.params == {"fc1": 72 + 8, "fc2": 72 + 8 + 24}  # weight, bias, the layer scale (and the table)
    for ratio in (0.8, 0.3):
        new, report = compress(model, data, "depth", DepthConfig(criterion="energy", param_ratio=ratio,
                                                                 score_samples=16))
        freed = sum(prep.params[b] for b in report.predicted["removed"])
        assert report.predicted["block_budget"]["reached"] == pytest.approx(report.param_ratio, rel=1e-12)
        assert sum(p.numel() for p in new.parameters()) == prep.total_params - freed
