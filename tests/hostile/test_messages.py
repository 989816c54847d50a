"""Error messages that reach the CLI: one line, naming the flag, layer or file at fault, and what to do."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from minreal.compress import CompressionError
from minreal.compress.core.allocate import allocate, options_from_spectrum
from minreal.compress.core.data import Dataset
from minreal.compress.core.stats import collect_moments
from minreal.compress.methods.cbalanced import CBalancedConfig
from minreal.compress.methods.cbalanced.empirical_gramians import reachability_gramians
from minreal.compress.methods.ssm import SSMConfig


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("flag, value", [("--repeats", "0"), ("--min-runs", "0"), ("--warmup", "-1"),
                                         ("--min-seconds", "-1"), ("--threads", "0")])
def test_bench_option_errors_name_the_flag(flag: str, value: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch, run_cli: Callable) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["bench", "m.onnx", flag, value, "-q"])
    assert code == 2
    assert f"({flag})" in one_error_line(err)


@pytest.mark.parametrize("config_cls, options, flag", [
    (CBalancedConfig, {"energy_eps": 1.5}, "--energy-eps"),
    (CBalancedConfig, {"state_budget": 0}, "--state-budget"),
    (SSMConfig, {"trunc": 0.5, "energy": 0.9}, "--trunc"),
])
def test_method_option_errors_name_the_flag(config_cls: type, options: dict, flag: str) -> None:
    """Configs validate themselves on construction."""
    with pytest.raises(CompressionError, match=flag):
        config_cls(**options)


def test_infeasible_budget_names_the_real_smallest_rank() -> None:
    """With rank multiple 16 the cheapest plan is rank 16 in every layer, not rank 1."""
    sq = np.linspace(2.0, 1.0, 128) ** 2
    opts = [options_from_spectrum(f"l{i}", sq, lambda r: 256.0 * r, 128 * 128, rank_multiple=16) for i in range(2)]
    with pytest.raises(ValueError, match=r"\(rank 16 everywhere\); raise the budget") as info:
        allocate(opts, 1.0)
    assert "rank 1 " not in str(info.value)


def _overflowing_mlp() -> nn.Module:
    """Finite inputs near 3e38 overflow to inf in the first layer (its weights sum to 8 per neuron)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    with torch.no_grad():
        model[0].weight.fill_(1.0)
    return model


def test_overflowing_activations_name_the_layer_in_moments() -> None:
    data = Dataset(torch.full((6, 8), 3e38))
    model = _overflowing_mlp()
    with pytest.raises(CompressionError, match=r"layer '2': input activations contain NaN/inf .* data scale"):
        collect_moments(model, {"0": model[0], "2": model[2]}, data)


def test_overflowing_activations_name_the_layer_in_gramians() -> None:
    data = Dataset(torch.full((6, 8), 3e38))
    with pytest.raises(CompressionError, match=r"layer '1': output activations contain NaN/inf .* data scale"):
        reachability_gramians(_overflowing_mlp(), data, ["1"])


@pytest.mark.parametrize("method", ["factorize", "cbalanced"])
def test_cli_refuses_overflowing_data_in_one_line(method: str, workdir: Path, run_cli: Callable) -> None:
    np.savez(workdir / "huge.npz", x=np.full((40, 64), 3e38, np.float32), y=np.zeros(40, np.int64))
    code, _, err = run_cli(["compress", "net.py:make", "-m", method, "--data", "huge.npz", "--out", "o.pt2", "-q"])
    line = one_error_line(err)
    assert code == 2
    assert "layer '" in line and "NaN/inf" in line and "data scale" in line and "linalg" not in line
    assert not (workdir / "o.pt2").exists()


def test_data_that_overflows_the_model_is_refused_before_compressing(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """3e38 inputs overflow to inf in the first Linear: every command refuses them in one line instead of
    reporting None errors or blaming ONNX parity (review finding)."""
    import numpy as np

    from minreal.app.cli import main

    (tmp_path / "net.py").write_text("import torch\nfrom torch import nn\n\ndef make():\n"
                                     "    net = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))\n"
                                     "    torch.nn.init.ones_(net[0].weight)  # 8 x 3e38 > float32 max\n"
                                     "    return net\n")
    np.savez(tmp_path / "big.npz", x=np.full((40, 8), 3e38, dtype=np.float32))
    factory, data = f"{tmp_path / 'net.py'}:make", str(tmp_path / "big.npz")
    for args in (["compress", factory, "-m", "svd", "--data", data, "--out", str(tmp_path / "o.pt2")],
                 ["export", factory, "--data", data, "--out", str(tmp_path / "o.onnx")]):
        with pytest.raises(SystemExit) as info:
            main(args)
        err = capsys.readouterr().err.strip()
        assert info.value.code == 2 and "big.npz" in err and "NaN/inf" in err and "overflow" in err, err
        assert len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.npz", "net.py"]


def test_integer_data_for_a_float_model_names_the_data(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import numpy as np

    from minreal.app.cli import main

    (tmp_path / "net.py").write_text("from torch import nn\n\ndef make():\n    return nn.Linear(8, 3)\n")
    np.savez(tmp_path / "ints.npz", x=np.arange(80, dtype=np.int64).reshape(10, 8))
    with pytest.raises(SystemExit) as info:
        main(["compress", f"{tmp_path / 'net.py'}:make", "-m", "svd", "--data", str(tmp_path / "ints.npz"),
              "--out", str(tmp_path / "o.pt2")])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "ints.npz holds integers" in err and len(err.splitlines()) == 1


def test_comparison_refuses_non_finite_outputs_instead_of_reporting_null() -> None:
    """A compressed model that overflows where the original does not gets a message, not null errors."""
    from minreal.compress.core.evaluate import compare_outputs

    class Overflows(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.tensor([1.0, float("inf")])

    data = Dataset(torch.randn(6, 2))
    with pytest.raises(CompressionError, match=r"compressed model's outputs are NaN/inf on 6 of 6 samples"):
        compare_outputs(nn.Identity(), Overflows(), data)
    assert compare_outputs(nn.Identity(), nn.Identity(), data)["max_abs_diff"] == 0.0


class _ValueShaped(nn.Module):
    """A forward whose output shape depends on the data's values (as a detection model's post-processing does)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y[:, : 4 - int((y[0] > 0).sum()) % 2]


def test_a_forward_that_torch_export_cannot_trace_is_refused_in_one_line(tmp_path: Path,
                                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """issue 44's ssdlite: torch.export's data-dependent guard became one line naming the module, the cause and the
    way out, with torch's graph dumps held back and nothing written."""
    from minreal.export.errors import ExportError
    from minreal.export.serialize import save_program

    out = tmp_path / "m.pt2"
    with pytest.raises(ExportError) as info:
        save_program(_ValueShaped().eval(), torch.randn(4, 8), out)
    message = str(info.value)
    assert "\n" not in message and "_ValueShaped" in message and "m.pt2" in message
    assert "data-dependent" in message and "backbone" in message
    assert "def forward" not in capfd.readouterr().err and not list(tmp_path.iterdir())
