"""Tests for minreal.export.onnx_export: dynamic axes, exporter choice and fallback, errors, embedding."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import minreal.export.onnx_export as onnx_export
from minreal.export.errors import ExportError
from minreal.export.onnx_export import ExportResult, to_onnx
from minreal.export.quiet import captured_output
from minreal.facts import first_line


def _run(path: str | Path, x: torch.Tensor) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})


class DataDependent(nn.Module):
    """Branches on a data value: torch.export cannot trace it, TorchScript traces one branch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.sum() > -1e9:
            return y * 2
        return y


class Bessel(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.i0e(x)


class Unexportable(nn.Module):
    """Calls an op neither exporter translates (special.i0e) inside submodule ``block.1``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.ReLU(), Bessel())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.lin(x))


class Eigh(nn.Module):
    """Calls torch.linalg.eigh: both exporters fail, and the TorchScript one dumps its graph to fd 1."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return torch.linalg.eigh(y.transpose(-1, -2) @ y)[0]


def test_dynamo_export_runs_at_batch_1_and_7(
    convnet: nn.Module, convnet_onnx: ExportResult, make_images: Callable[[int, int], torch.Tensor]
) -> None:
    assert convnet_onnx.exporter == "dynamo"
    assert convnet_onnx.fallback_reason is None
    assert convnet_onnx.opset == convnet_onnx.requested_opset == 18
    assert convnet_onnx.dynamic_dims == {0: "batch"}
    graph_input = onnx.load(convnet_onnx.path).graph.input[0]
    assert graph_input.type.tensor_type.shape.dim[0].dim_param == "batch"
    for batch in (1, 7):
        x = make_images(batch, batch)
        (got,) = _run(convnet_onnx.path, x)
        with torch.no_grad():
            np.testing.assert_allclose(got, convnet(x).numpy(), rtol=1e-4, atol=1e-5)


def test_weights_are_embedded_in_one_file(convnet: nn.Module, convnet_onnx: ExportResult) -> None:
    model = onnx.load(convnet_onnx.path, load_external_data=False)
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    param_bytes = sum(p.numel() * 4 for p in convnet.parameters())
    assert convnet_onnx.file_size_bytes == Path(convnet_onnx.path).stat().st_size > param_bytes
    assert not list(Path(convnet_onnx.path).parent.glob("convnet.onnx.data"))
    assert convnet_onnx.num_nodes == len(model.graph.node)


def test_exports_in_eval_mode_and_restores_training_flags(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
    model(torch.randn(16, 6))  # move the BatchNorm running statistics away from their defaults
    model.train()
    result = to_onnx(model, torch.randn(4, 6), tmp_path / "bn.onnx")
    assert model.training and all(m.training for m in model.modules())
    x = torch.randn(5, 6)
    with torch.no_grad():
        expected = model.eval()(x).numpy()
    np.testing.assert_allclose(_run(result.path, x)[0], expected, rtol=1e-4, atol=1e-5)


def test_fallback_to_torchscript_records_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_dynamo(*args: object, **kwargs: object) -> None:
        raise RuntimeError("dynamo unavailable in this test\nsecond line")

    monkeypatch.setattr(onnx_export, "_export_dynamo", broken_dynamo)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    result = to_onnx(model, torch.randn(2, 4), tmp_path / "ts.onnx")
    assert result.exporter == "torchscript"
    assert result.fallback_reason == "RuntimeError: dynamo unavailable in this test"
    for batch in (1, 7):
        x = torch.randn(batch, 4)
        with torch.no_grad():
            np.testing.assert_allclose(_run(result.path, x)[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_full_disk_is_said_as_such_and_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     wrapped: bool) -> None:
    """A file system error (here a full disk, raised by the exporter or behind its own error) is one line naming the
    folder, the cause and the weights' size, not "the module is not supported" (the zoo's vit_l_16 read so when its
    disk filled); the second exporter is not tried, and nothing is left in the folder."""
    import errno

    tried = []

    def full_disk(*args: object, **kwargs: object) -> None:
        tried.append(1)
        if not wrapped:
            raise OSError(errno.ENOSPC, "No space left on device")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("serialising the model failed") from exc

    monkeypatch.setattr(onnx_export, "_export_dynamo", full_disk)
    monkeypatch.setattr(onnx_export, "_export_torchscript", full_disk)
    model = nn.Linear(256, 256)  # 257 KiB of weights: 0 MiB
    with pytest.raises(ExportError) as info:
        to_onnx(model, torch.randn(2, 256), tmp_path / "m.onnx")
    assert str(info.value) == (f"cannot write {tmp_path / 'm.onnx'}: No space left on device; free disk space or "
                               "choose another output path (the weights alone take 0 MiB, and the exporter stages a "
                               "copy beside the file)")
    assert tried == [1] and list(tmp_path.iterdir()) == []


def test_a_permission_error_elsewhere_is_the_exporters_and_the_other_one_is_tried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A permission error on a path outside the output folder (the exporter's own cache) may be the exporter's: the
    other exporter is tried; one on the output folder is the folder's, said in one line naming it."""
    import errno

    def forbidden(where: Path) -> Callable:
        def export(*args: object, **kwargs: object) -> None:
            raise PermissionError(errno.EACCES, "Permission denied", str(where))
        return export

    monkeypatch.setattr(onnx_export, "_export_dynamo", forbidden(Path("/nonexistent-cache/x")))
    result = to_onnx(nn.Linear(4, 3), torch.randn(2, 4), tmp_path / "ts.onnx")
    assert result.exporter == "torchscript"
    monkeypatch.setattr(onnx_export, "_export_dynamo", forbidden(tmp_path / "m.onnx"))
    with pytest.raises(ExportError, match=r"^cannot write .*m\.onnx: Permission denied; check the folder's"):
        to_onnx(nn.Linear(4, 3), torch.randn(2, 4), tmp_path / "m.onnx")


def test_data_dependent_branch_falls_back_for_real(tmp_path: Path) -> None:
    model = DataDependent().eval()
    result = to_onnx(model, torch.randn(3, 4), tmp_path / "branch.onnx")
    assert result.exporter == "torchscript"
    assert result.fallback_reason is not None and result.fallback_reason.startswith("TorchExportError")
    assert "\n" not in result.fallback_reason
    x = torch.randn(7, 4)
    with torch.no_grad():
        np.testing.assert_allclose(_run(result.path, x)[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_unsupported_op_names_op_and_submodule_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "bad.onnx"
    target.write_bytes(b"previous contents")
    with pytest.raises(ExportError, match=r"op aten::special_i0e in submodule 'block\.1'") as info:
        to_onnx(Unexportable(), torch.randn(2, 4), target)
    assert "\n" not in str(info.value)
    assert "Unexportable" in str(info.value)
    assert target.read_bytes() == b"previous contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_extra_dynamic_sequence_axis(tmp_path: Path, seq_mixer: nn.Module) -> None:
    model = seq_mixer
    result = to_onnx(model, torch.randn(2, 5, 4), tmp_path / "seq.onnx", dynamic_dims={1: "seq"})
    assert result.dynamic_dims == {0: "batch", 1: "seq"}
    session = ort.InferenceSession(result.path, providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", "seq", 4]
    for shape in ((1, 5, 4), (3, 17, 4)):
        x = torch.randn(*shape)
        with torch.no_grad():
            np.testing.assert_allclose(_run(result.path, x)[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_multiple_outputs_get_names_in_order(two_heads_onnx: ExportResult) -> None:
    assert two_heads_onnx.output_names == ["output_0", "output_1"]
    session = ort.InferenceSession(two_heads_onnx.path, providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["output_0", "output_1"]
    x = torch.randn(7, 10)
    logits, embed = _run(two_heads_onnx.path, x)
    assert logits.shape == (7, 4) and embed.shape == (7, 6)


def test_static_batch_when_dynamic_batch_off(tmp_path: Path) -> None:
    model = nn.Linear(4, 2).eval()
    result = to_onnx(model, torch.randn(3, 4), tmp_path / "static.onnx", dynamic_batch=False)
    assert result.dynamic_dims == {}
    assert onnx.load(result.path).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 3


def test_missing_output_folder_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        to_onnx(nn.Linear(4, 2), torch.randn(2, 4), tmp_path / "nowhere" / "x.onnx")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"opset": 16}, "below the supported minimum 17"),
        ({"dynamic_dims": {3: "seq"}}, "outside the 2-d example input"),
        ({"dynamic_dims": {1: "batch"}}, "must be distinct"),
        ({"dynamic_dims": {1: "not valid"}}, "not a Python identifier"),
        ({"output_names": ["a", "b"]}, "2 output names given"),
    ],
)
def test_bad_arguments_are_value_errors(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_onnx(nn.Linear(4, 2), torch.randn(2, 4), tmp_path / "x.onnx", **kwargs)
    assert not (tmp_path / "x.onnx").exists()


def test_captured_output_catches_python_and_fd_level_output(capfd: pytest.CaptureFixture[str]) -> None:
    libc = ctypes.CDLL(None)
    with pytest.raises(RuntimeError, match="boom"), captured_output() as out:
        print("python stdout")
        print("python stderr", file=sys.stderr)
        os.write(1, b"fd one\n")
        os.write(2, b"fd two\n")
        libc.printf(b"C stdio %d\n", 7)  # buffered by libc, flushed into the capture on exit
        raise RuntimeError("boom")
    for line in ("python stdout", "python stderr", "fd one", "fd two", "C stdio 7"):
        assert line in out.text
    assert first_line(out.text) == "python stdout"
    print("after")  # the streams are restored
    assert capfd.readouterr() == ("after\n", "")


def test_export_failing_in_both_exporters_prints_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG, logger="minreal.export.onnx_export"), pytest.raises(
        ExportError, match=r"op aten::linalg_eigh"
    ) as info:
        to_onnx(Eigh(), torch.randn(2, 4), tmp_path / "eigh.onnx")
    assert "\n" not in str(info.value)
    out, err = capfd.readouterr()
    assert out == ""
    assert "Torch IR graph" not in err and "GraphModule" not in err
    assert "Torch IR graph at exception" in caplog.text  # kept for debugging, at DEBUG level
    assert list(tmp_path.iterdir()) == []


def test_successful_dynamo_export_prints_nothing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    result = to_onnx(model, torch.randn(2, 4), tmp_path / "mlp.onnx")
    assert result.exporter == "dynamo"
    assert capfd.readouterr() == ("", "")
