"""ONNX export of the reduced SSM layer and model: dynamic sequence length, graph size independent of it,
parity with the step-by-step recurrence in torch and ONNX Runtime."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.methods.ssm import (
    ModalSSM,
    SSMClassifier,
    SSMConfig,
    random_stable_system,
    real_modal_form,
    simulate,
)
from minreal.export.onnx_export import to_onnx

FORBIDDEN_OPS = {"Loop", "Scan", "If", "DFT", "STFT"}


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _check_graph(path: Path) -> onnx.ModelProto:
    model = onnx.load(str(path))
    ops = {n.op_type for n in model.graph.node}
    assert not ops & FORBIDDEN_OPS, ops & FORBIDDEN_OPS
    complex_types = {onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128}
    assert all(t.data_type not in complex_types for t in model.graph.initializer)
    assert all(v.type.tensor_type.elem_type not in complex_types for v in model.graph.value_info)
    return model


@pytest.fixture(scope="module")
def modal_layer() -> ModalSSM:
    """A reduced-order modal layer with rotation pairs and real modes (float32, h = 3, r = 9)."""
    sys = random_stable_system(9, 3, 3, radius=0.97, generator=torch.Generator().manual_seed(0))
    form = real_modal_form(sys)
    assert form.lam.numel() > 0 and form.rho.numel() > 0
    return ModalSSM(*(t.float() for t in (form.rho, form.alpha, form.lam, form.b, form.c, torch.diag(sys.d))))


@pytest.mark.parametrize("length", [1, 17, 64, 65, 784])
@pytest.mark.parametrize("chunk", [32, 64, 7])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_two_level_convolution_matches_recurrence(modal_layer: ModalSSM, length: int, chunk: int,
                                                  dtype: torch.dtype, tol: float) -> None:
    layer = copy.deepcopy(modal_layer).to(dtype)
    layer.chunk = chunk
    u = torch.randn(2, length, 3, generator=torch.Generator().manual_seed(length), dtype=torch.float64)
    ref = simulate(layer.state_space(), u)
    with torch.no_grad():
        got = layer(u.to(dtype)).double()
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=0, atol=tol * float(ref.abs().max()))


@pytest.mark.parametrize("chunk", [32, 7, None])
def test_modal_layer_exports_with_dynamic_length_and_matches_recurrence(modal_layer: ModalSSM, chunk: int | None,
                                                                      tmp_path: Path) -> None:
    modal_layer = copy.deepcopy(modal_layer)
    modal_layer.chunk = chunk
    short = to_onnx(modal_layer, torch.randn(2, 5, 3), tmp_path / "short.onnx", dynamic_dims={1: "seq"})
    long = to_onnx(modal_layer, torch.randn(2, 40, 3), tmp_path / "long.onnx", dynamic_dims={1: "seq"})
    assert short.num_nodes == long.num_nodes  # no per-step unrolling
    ops = {n.op_type for n in _check_graph(tmp_path / "short.onnx").graph.node}
    assert ("ConvTranspose" in ops) == (chunk is not None)  # the two-level form puts chunk states back in time
    sess = _session(tmp_path / "short.onnx")
    ref_sys = modal_layer.state_space()
    g = torch.Generator().manual_seed(1)
    for length in (1, 17, 784):
        u = torch.randn(2, length, 3, generator=g)
        ref = simulate(ref_sys, u.double()).numpy()
        scale = np.abs(ref).max()
        got_torch = modal_layer(u).detach().numpy()
        got_ort = sess.run(None, {sess.get_inputs()[0].name: u.numpy()})[0]
        assert got_ort.shape == ref.shape
        np.testing.assert_allclose(got_torch, ref, rtol=0, atol=1e-5 * scale)
        np.testing.assert_allclose(got_ort, ref, rtol=0, atol=1e-5 * scale)


def test_reduced_classifier_exports_and_matches_ort(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = SSMClassifier(1, 8, 16, 2, 4).eval()
    data = Dataset(torch.randn(16, 64, 1), torch.randint(0, 4, (16,)))
    reduced, report = compress(model, data, "ssm", SSMConfig(trunc=0.5))
    assert all(layer.rank == 8 for layer in report.layers)
    for name, net in (("original", model), ("reduced", reduced)):
        res = to_onnx(net, data.x[:2], tmp_path / f"{name}.onnx", dynamic_dims={1: "seq"})
        assert res.exporter == "dynamo"
        _check_graph(tmp_path / f"{name}.onnx")
        sess = _session(tmp_path / f"{name}.onnx")
        for batch, length in ((1, 17), (5, 64), (3, 784)):
            x = torch.randn(batch, length, 1)
            with torch.no_grad():
                ref = net(x).numpy()
            got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
