"""fde's budgets, representatives, compensation and honest bound end to end (minreal.compress.methods.fde.method)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from minreal.compress import RecoveryConfig, compress
from minreal.compress.core.chain import mlp_params
from minreal.compress.core.data import Dataset
from minreal.compress.core.prune import mlp_macs
from minreal.compress.methods.fde import SPEC, FDEConfig, box_samples, chain_forward, extract_chain
from minreal.compress.models import mlp


@pytest.fixture
def case() -> tuple[torch.nn.Module, Dataset]:
    torch.manual_seed(1)
    x = torch.randn(120, 6, generator=torch.Generator().manual_seed(2))
    return mlp(6, [40, 30], 3).eval(), Dataset(x)


def test_budgets_declared() -> None:
    assert set(SPEC.budgets) == {"param_ratio", "mac_ratio"}


@pytest.mark.parametrize("kind, cost", [("param_ratio", mlp_params), ("mac_ratio", mlp_macs)])
@pytest.mark.parametrize("ratio", [0.9, 0.3, 0.12])
def test_budget_met_within_one_neuron_per_layer(case, kind: str, cost, ratio: float) -> None:
    model, data = case
    _, rep = compress(model, data, "fde", FDEConfig(**{kind: ratio}, remove_dead=False))
    widths = rep.predicted["hidden_widths"]
    full = cost(6, [40, 30], 3)
    assert cost(6, widths, 3) <= ratio * full < cost(6, [w + 1 for w in widths], 3)
    assert len(rep.predicted["merge_eps_per_layer"]) == 2


def test_cli_param_ratio_hits_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from minreal.app.cli import cli

    (tmp_path / "net.py").write_text("import torch\nfrom minreal.compress.models import mlp\n\ndef make():\n"
                                     "    torch.manual_seed(0)\n    return mlp(8, [32, 24], 2).eval()\n")
    np.savez(tmp_path / "data.npz", x=np.random.default_rng(0).standard_normal((80, 8)).astype(np.float32))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["compress", "net.py:make", "-m", "fde", "--param-ratio", "0.3", "--data",
                                      "data.npz", "--out", "small.pt2", "--report", "r.json", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(Path("r.json").read_text())
    widths = report["predicted"]["hidden_widths"]
    full = mlp_params(8, [32, 24], 2)
    assert mlp_params(8, widths, 2) <= 0.3 * full < mlp_params(8, [w + 1 for w in widths], 2)


@pytest.mark.parametrize("representative", ["mean", "lstsq"])
def test_bound_holds_for_each_representative(case, representative: str) -> None:
    model, data = case
    _, rep = compress(model, data, "fde", FDEConfig(param_ratio=0.4, representative=representative))
    assert rep.bounds["output"] is not None
    assert rep.measured["max_output_deviation_box_float64"] <= rep.bounds["output"] * (1 + 1e-9)


def test_bound_with_compensation_is_for_the_network_built(case) -> None:
    model, data = case
    new, rep = compress(model, data, "fde", FDEConfig(param_ratio=0.4, representative="lstsq", compensation=True))
    assert rep.predicted["compensation"]["accepted"]
    lo, hi = (torch.tensor(rep.predicted["input_box"][k], dtype=torch.float64) for k in ("low", "high"))
    probe = box_samples(lo, hi, 2000, 7)
    with torch.no_grad():
        dev = (chain_forward(extract_chain(model), probe) - new(probe.float()).double()).abs().max()
    assert float(dev) <= rep.bounds["output"] * (1 + 1e-6) + 1e-5


def test_bound_is_none_when_recovery_voids_it() -> None:
    """The shared recovery changes the merged model, so the merging bound no longer describes it."""
    torch.manual_seed(4)
    x = torch.rand(120, 3, generator=torch.Generator().manual_seed(4))
    data = Dataset(x, torch.sin(3 * x).sum(1, keepdim=True))
    _, rep = compress(mlp(3, [24], 1).eval(), data, "fde", FDEConfig(merge_eps=0.3),
                      RecoveryConfig(epochs=2, alpha=1.0))
    assert rep.bounds["output"] is None  # the exported (recovered) model has no bound
    assert rep.predicted["bounds_zero_shot"]["output"] is not None
    assert rep.recovery is not None and rep.recovery["epochs"] >= 1
    assert any(n.startswith("no bound") for n in rep.notes)


def test_eps0_exact_with_every_representative(case) -> None:
    model, data = case
    with torch.no_grad():
        w = model[1].weight
        w[5], model[1].bias[5] = w[2], model[1].bias[2]
    for representative in ("leader", "mean", "lstsq"):
        new, rep = compress(model, data, "fde", FDEConfig(representative=representative, remove_dead=False))
        assert rep.predicted["hidden_widths"][0] == 39
        with torch.no_grad():
            assert torch.allclose(new(data.x), model(data.x), atol=1e-5)


def test_budget_and_eps_together_refused() -> None:
    from minreal.compress.core.errors import CompressionError

    with pytest.raises(CompressionError, match="not both"):
        FDEConfig(merge_eps=0.1, param_ratio=0.5)


def test_eps0_lstsq_exact_on_the_box_with_fewer_samples_than_inputs() -> None:
    # neurons 10–19 copy 0–9; 16 calibration samples of 32 inputs: the data does not span the input space,
    # so exactness must hold on the whole box (not only on the data) and the bound must be 0
    torch.manual_seed(8)
    model = mlp(32, [20], 2).eval()
    with torch.no_grad():
        model[1].weight[10:], model[1].bias[10:] = model[1].weight[:10], model[1].bias[:10]
    data = Dataset(torch.randn(16, 32, generator=torch.Generator().manual_seed(9)))
    new, rep = compress(model, data, "fde", FDEConfig(representative="lstsq", remove_dead=False))
    assert rep.predicted["hidden_widths"] == [10]
    assert rep.bounds["output"] == 0.0
    lo, hi = (torch.tensor(rep.predicted["input_box"][k], dtype=torch.float64) for k in ("low", "high"))
    probe = box_samples(lo, hi, 500, 3)
    dev = (chain_forward(extract_chain(model), probe) - chain_forward(extract_chain(new), probe)).abs().max()
    assert float(dev) < 1e-5


def test_budget_met_with_zero_rows() -> None:
    # 40 all-zero rows in the first layer: in scaled mode they form one block, so the budget is still met
    torch.manual_seed(1)
    model = mlp(6, [60, 30], 3).eval()
    with torch.no_grad():
        model[1].weight[:40], model[1].bias[:40] = 0.0, 0.0
    data = Dataset(torch.randn(120, 6, generator=torch.Generator().manual_seed(2)))
    _, rep = compress(model, data, "fde", FDEConfig(param_ratio=0.1, remove_dead=False))
    widths = rep.predicted["hidden_widths"]
    assert widths == rep.predicted["budget_widths"]
    assert rep.predicted["budget_cost_ratio"] <= 0.1


def test_missed_budget_is_an_error(case, monkeypatch: pytest.MonkeyPatch) -> None:
    from minreal.compress.core.errors import CompressionError
    from minreal.compress.methods.fde import partition

    model, data = case
    monkeypatch.setattr(partition, "blocks_to_count",
                        lambda v, k, scaled, any_sign: (np.arange(len(v)), torch.ones(len(v), dtype=torch.float64),
                                                        0.0))
    with pytest.raises(CompressionError, match=r"--param-ratio 0.3 not met: the merge reached a cost ratio of 1"):
        compress(model, data, "fde", FDEConfig(param_ratio=0.3, remove_dead=False))
