"""Hostile inputs through the CLI: exit code, one line naming the culprit, no traceback, no leftover files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from minreal.app.callables import SpecError
from minreal.app.models import load_model


def refused(run_cli: Callable, args: list[str], *culprits: str) -> str:
    """Run ``args`` with ``run_cli``; assert exit 2 and one error line naming every culprit; return that line."""
    code, _, err = run_cli(args)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(c in lines[0] for c in culprits), lines[0]
    return lines[0]


def _matmul_graph(w: onnx.TensorProto) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_malformed_onnx_is_refused_by_bench(workdir: Path, run_cli: Callable) -> None:
    (workdir / "bad.onnx").write_bytes(b"\x08\x07 not a protobuf model " * 8)
    refused(run_cli, ["bench", "bad.onnx", "--out", "b.json", "-q"], "bad.onnx", "cannot read ONNX model")
    assert sorted(os.listdir(workdir)) == ["bad.onnx", "net.py"]


def test_an_empty_onnx_file_is_refused_by_bench_naming_it(workdir: Path, run_cli: Callable) -> None:
    """Protobuf reads 0 bytes as an empty model: bench said "data x is an empty mapping", naming neither the file
    nor what was wrong with it."""
    (workdir / "empty.onnx").write_bytes(b"")
    refused(run_cli, ["bench", "empty.onnx", "--out", "b.json", "-q"], "empty.onnx", "holds no graph (an empty file")
    assert sorted(os.listdir(workdir)) == ["empty.onnx", "net.py"]


def test_truncated_onnx_is_refused_by_bench(workdir: Path, run_cli: Callable) -> None:
    data = _matmul_graph(numpy_helper.from_array(np.ones((4, 3), np.float32), "w")).SerializeToString()
    (workdir / "cut.onnx").write_bytes(data[: len(data) // 2])
    refused(run_cli, ["bench", "cut.onnx", "--out", "b.json", "-q"], "cut.onnx")
    assert not (workdir / "b.json").exists()


def test_external_data_outside_the_model_folder_is_never_read(workdir: Path, run_cli: Callable) -> None:
    secret = workdir / "etc" / "x"
    secret.parent.mkdir()
    secret.write_bytes(np.ones((4, 3), np.float32).tobytes())  # valid data: reading it would make bench succeed
    w = onnx.TensorProto(name="w", dims=[4, 3], data_type=TensorProto.FLOAT, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "../../etc/x"), ("offset", "0"), ("length", "48")):
        w.external_data.add(key=key, value=value)
    model_dir = workdir / "a" / "b"
    model_dir.mkdir(parents=True)
    onnx.save(_matmul_graph(w), model_dir / "evil.onnx")
    line = refused(run_cli, ["bench", str(model_dir / "evil.onnx"), "--out", "b.json", "-q"],
                   "evil.onnx", "'../../etc/x'", "outside the model's folder")
    assert "'w'" in line
    assert not (workdir / "b.json").exists() and not (workdir / "b.md").exists()


def test_truncated_npz_is_refused(workdir: Path, run_cli: Callable) -> None:
    np.savez(workdir / "d.npz", x=np.zeros((50, 64), np.float32))
    data = (workdir / "d.npz").read_bytes()
    (workdir / "d.npz").write_bytes(data[: len(data) // 2])
    refused(run_cli, ["compress", "net.py:make", "-m", "svd", "--data", "d.npz", "--out", "o.pt2", "-q"], "d.npz")
    assert not (workdir / "o.pt2").exists()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_data_are_refused_naming_key_and_sample(bad: float, workdir: Path,
                                                            run_cli: Callable) -> None:
    x = np.zeros((20, 64), np.float32)
    x[7, 3] = bad
    np.savez(workdir / "d.npz", x=x)
    refused(run_cli, ["bench", "m.onnx", "--data", "d.npz", "-q"], "'x'", "d.npz", "sample 7")


def test_empty_data_is_refused(workdir: Path, run_cli: Callable) -> None:
    np.savez(workdir / "d.npz", x=np.zeros((0, 64), np.float32))
    refused(run_cli, ["compress", "net.py:make", "-m", "svd", "--data", "d.npz", "--out", "o.pt2", "-q"],
            "d.npz", "holds no samples")
    assert not (workdir / "o.pt2").exists()


def test_one_sample_eval_data_is_refused_before_any_work(workdir: Path, run_cli: Callable) -> None:
    np.savez(workdir / "one.npz", x=np.zeros((1, 64), np.float32), y=np.zeros(1, np.int64))
    refused(run_cli, ["run", "net.py:make", "-m", "svd", "--data", "digits-flat", "--eval-data", "one.npz", "--out",
                      "runs/a", "-q"], "one.npz", "--eval-data", "at least 2")
    assert not (workdir / "runs" / "a").exists() and not list((workdir / "runs").glob(".*"))


def test_one_sample_calib_needs_holdout_zero_and_then_works(workdir: Path, run_cli: Callable) -> None:
    np.savez(workdir / "one.npz", x=np.zeros((1, 64), np.float32))
    base = ["compress", "net.py:make", "-m", "svd", "--data", "one.npz", "--out", "o.pt2"]
    refused(run_cli, [*base, "-q"], "one.npz", "1 sample")
    code, _, err = run_cli([*base, "--data-holdout", "0", "--report", "r.json"])
    assert code == 0, err
    assert "all 1 samples of --data" in err and "no held-out measurement" in err
    report = json.loads((workdir / "r.json").read_text())
    assert report["measured"]["held_out"] is None and any("no held-out" in n for n in report["notes"])


def test_default_holdout_is_announced_and_measured(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["compress", "net.py:make", "-m", "svd", "--data", "digits-flat", "--out", "o.pt2",
                            "--report", "r.json"])
    assert code == 0, err
    assert "(25%, --data-holdout) held out" in err
    held = json.loads((workdir / "r.json").read_text())["measured"]["held_out"]
    assert held["samples"] == 449 and 0.0 <= held["top1_agreement"] <= 1.0


def test_calib_holdout_out_of_range_is_usage_error(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["compress", "net.py:make", "-m", "svd", "--data", "digits-flat", "--data-holdout", "1"])
    assert code == 2 and "--data-holdout" in err and "Traceback" not in err


def _old_checkpoint(model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict as torch < 0.4.1 wrote it: no BatchNorm ``num_batches_tracked``, no module versions."""
    return {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}


def test_old_batchnorm_checkpoint_is_accepted_like_torch_does(workdir: Path) -> None:
    from torchvision.models import resnet18

    torch.save(_old_checkpoint(resnet18(num_classes=10)), workdir / "old.pt")
    assert resnet18(num_classes=10).load_state_dict(torch.load(workdir / "old.pt"), strict=True)  # torch accepts
    model = load_model("resnet18", weights=workdir / "old.pt", num_classes=10)
    assert int(model.bn1.num_batches_tracked) == 0


def test_checkpoint_torch_refuses_is_still_refused_by_name(workdir: Path) -> None:
    from torchvision.models import resnet18

    state = _old_checkpoint(resnet18(num_classes=10))
    del state["bn1.weight"]
    torch.save(state, workdir / "bad.pt")
    with pytest.raises(SpecError, match=r"missing key 'bn1\.weight'; check that the weights belong") as info:
        load_model("resnet18", weights=workdir / "bad.pt", num_classes=10)
    assert "num_batches_tracked" not in str(info.value)
    modern = resnet18(num_classes=10).state_dict()  # versioned: torch itself wants num_batches_tracked here
    del modern["bn1.num_batches_tracked"]
    torch.save(modern, workdir / "modern.pt")
    with pytest.raises(SpecError, match=r"missing key 'bn1\.num_batches_tracked'"):
        load_model("resnet18", weights=workdir / "modern.pt", num_classes=10)


def test_old_checkpoint_through_the_cli(workdir: Path, run_cli: Callable) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("hostile_net", workdir / "net.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.save(_old_checkpoint(module.bn_net()), workdir / "old.pt")
    np.savez(workdir / "img.npz", x=np.random.default_rng(0).standard_normal((12, 3, 8, 8)).astype(np.float32))
    code, _, err = run_cli(["compress", "net.py:bn_net", "--weights", "old.pt", "-m", "svd", "--data", "img.npz",
                            "--out", "o.pt2", "-q"])
    assert code == 0, err


def test_truncated_pt2_is_called_truncated_not_a_pickle(workdir: Path, run_cli: Callable) -> None:
    """Expected from the .pt2 loader rewrite: the file is named as incomplete, pickles are not blamed."""
    program = torch.export.export(nn.Sequential(nn.Linear(4, 2)).eval(), (torch.randn(2, 4),))
    torch.export.save(program, workdir / "full.pt2")
    data = (workdir / "full.pt2").read_bytes()
    (workdir / "short.pt2").write_bytes(data[: len(data) * 2 // 3])
    line = refused(run_cli, ["compress", "short.pt2", "-m", "svd", "--data", "digits-flat", "--out", "o.pt2", "-q"],
                   "short.pt2")
    lowered = line.lower()
    assert any(w in lowered for w in ("truncated", "corrupt", "incomplete", "not a complete", "not a zip"))
    assert "pickl" not in lowered
    assert not (workdir / "o.pt2").exists()
