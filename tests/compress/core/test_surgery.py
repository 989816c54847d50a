"""Module surgery: nested replacement names are refused, a model that is one layer is replaced as a whole, and a
layer whose weight is tied to another module's is found and left (factorising it would untie the two)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.lowrank import matrix_view
from minreal.compress.core.lowrank_plan import apply_factors, find_targets
from minreal.compress.core.report import CompressionReport
from minreal.compress.core.surgery import replace_modules, tied_weights, untied_note
from minreal.compress.methods.factorize import FactorizeConfig, layer_bases
from minreal.compress.methods.factorize.method import _factors
from minreal.compress.methods.svd import SVDConfig


@pytest.mark.parametrize("order", [("0", "0.1"), ("0.1", "0")])
@pytest.mark.parametrize("inplace", [False, True])
def test_nested_names_are_refused_and_leave_the_replacements_alone(order: tuple[str, str], inplace: bool) -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear(2, 2))
    outer = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    new = {"0": outer, "0.1": nn.Tanh()}
    with pytest.raises(ValueError, match="'0' and '0.1' nest"):
        replace_modules(model, {name: new[name] for name in order}, inplace=inplace)
    assert [type(m) for m in outer] == [nn.Linear, nn.Linear] and isinstance(model[0][1], nn.ReLU)


def test_the_root_name_replaces_the_model_itself() -> None:
    layer, new = nn.Linear(3, 3), nn.Sequential(nn.Linear(3, 1), nn.Linear(1, 3))
    out = replace_modules(layer, {"": new})
    assert out is new and list(new._modules) == ["0", "1"]  # no child named "" (a cycle when it is itself)
    with pytest.raises(ValueError, match="'' and '1' nest"):
        replace_modules(new, {"": nn.Identity(), "1": nn.Identity()})


def test_a_model_that_is_one_linear_factorises_at_full_rank_to_itself() -> None:
    torch.manual_seed(7)
    model = nn.Linear(10, 8).double().eval()
    data = Dataset(torch.randn(50, 10, dtype=torch.float64))
    targets, _, _ = find_targets(model, data.x[:4])
    assert [t.name for t in targets] == [""]
    bases = layer_bases(model, data, targets, FactorizeConfig(stats_dtype="float64"),
                        CompressionReport("factorize", {}))
    full = {"": matrix_view(model).max_rank}
    new = apply_factors(model, targets, _factors(targets, bases, full))
    assert isinstance(new, nn.Sequential) and new is not model
    assert torch.allclose(new(data.x), model(data.x), rtol=0, atol=1e-10)  # W = (W U) Uᵀ with U orthogonal


class _TiedLM(nn.Module):
    """A token embedding, a body and an output head whose weight is the embedding's (a tied language model)."""

    def __init__(self, vocab: int = 40, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.Sequential(nn.Linear(width, 32), nn.ReLU(), nn.Linear(32, width))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


def test_tied_weights_name_both_holders_and_a_shared_module_is_not_tied() -> None:
    model = _TiedLM()
    shared = nn.Linear(4, 4)
    twice = nn.Sequential(shared, nn.ReLU(), shared)  # one module at two places: a copy replaces it at each
    found = tied_weights(model)
    assert set(found) == {"embed", "head"}
    assert "tied to embed.weight" in found["head"] and "tied to head.weight" in found["embed"]
    assert tied_weights(twice) == {} and tied_weights(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) == {}


@pytest.mark.parametrize("method", ["factorize", "svd"])
def test_a_tied_head_is_left_tied_and_the_model_only_shrinks(method: str) -> None:
    """Factorising a head tied to its embedding would untie it: the embedding keeps the full matrix and the pair is
    added. The head is skipped naming the tie and the way out, the copy stays tied and holds fewer parameters; once
    the user gives the head its own weight, it is a target."""
    torch.manual_seed(0)
    model = _TiedLM().eval()
    data = Dataset(torch.randint(0, 40, (64, 6), generator=torch.Generator().manual_seed(1)))
    new, report = compress(model, data, method, {"factorize": FactorizeConfig, "svd": SVDConfig}[method](
        layer_mac_ratio=0.6))
    head = next(lr for lr in report.layers if lr.name == "head")
    assert head.action == "skipped" and "tied to embed.weight" in head.reason
    assert new.head.weight is new.embed.weight and new.head.weight is not model.head.weight
    assert sum(p.numel() for p in new.parameters()) < sum(p.numel() for p in model.parameters())
    assert model.head.weight is model.embed.weight  # the original is untouched
    model.head.weight = nn.Parameter(model.head.weight.detach().clone())
    targets, skipped, _ = find_targets(model, data.x[:2])
    assert "head" in {t.name for t in targets} and not skipped


@pytest.mark.parametrize("method", ["wanda", "magnitude"])
def test_a_width_cut_leaves_a_tied_heads_group_whole(method: str) -> None:
    """Narrowing the head's input (the body's output) cannot narrow the embedding it is tied to: the cut would untie
    the two and add the narrowed copy (with a 200 x 64 embedding, 29,376 -> 31,648 parameters at --mac-ratio 0.8,
    found in review). The group is left whole, naming the tie; the body's hidden group is cut; the result stays
    tied and shrinks."""
    from minreal.compress import get_method

    torch.manual_seed(0)
    model = _TiedLM().eval()
    data = Dataset(torch.randint(0, 40, (64, 6), generator=torch.Generator().manual_seed(1)))
    new, report = compress(model, data, method, get_method(method).config_cls(mac_ratio=0.8, width_multiple=8))
    assert new.head.weight is new.embed.weight and new.head.weight.shape == (40, 16)
    assert any("head.weight is tied to embed.weight" in n and "left whole" in n for n in report.notes)
    assert sum(p.numel() for p in new.parameters()) < sum(p.numel() for p in model.parameters())
    assert not any(n.startswith("tied weights untied") for n in report.notes)


def test_the_untied_note_names_separate_holders_and_not_a_name_the_result_dropped() -> None:
    """The note names weights one parameter held in the original that the result holds separately under the same
    names; a name the result no longer has (torch.fx keeps one name for a module registered under two; a replaced
    module) says nothing either way, and a copy keeps its ties."""
    model = _TiedLM()
    assert untied_note(model, copy.deepcopy(model)) == ""
    untied = copy.deepcopy(model)
    untied.head.weight = nn.Parameter(untied.head.weight.detach()[:, :8].clone())
    note = untied_note(model, untied)
    assert note.startswith("tied weights untied: embed.weight (40x16) and head.weight (40x8) were one parameter")
    pair = nn.Sequential(nn.Linear(16, 4, bias=False), nn.Linear(4, 40, bias=False))  # head.weight is gone
    assert untied_note(model, replace_modules(model, {"head": pair})) == ""

    class Aliased(nn.Module):  # one module under two names: fx keeps one
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.classifier = self.fc

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(torch.relu(self.fc(x)))

    aliased = Aliased()
    assert untied_note(aliased, torch.fx.symbolic_trace(aliased)) == ""
