"""Tiny seeded ONNX models (built with onnx.helper, no torch) and data for runtime_bench tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

FEATURES, CLASSES = 8, 4
UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2  # u = 2^-24


def exact_and_bound(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pre-activations of ``linear_model`` in float64 and a bound on |float32 output − exact| per element.

    Any float32 evaluation of ``Relu(x @ W + b)`` (any batch shape, summation order, FMA use, thread count or
    CPU) is within γ_{K+1}·(|x| @ |W| + |b|) of the exact value, γ_n = n·u/(1 − n·u) (Higham, Accuracy and
    Stability of Numerical Algorithms, 2nd ed., §3.1; ReLU is 1-Lipschitz). Two runs differ by at most twice it.
    """
    x64 = x.astype(np.float64)
    w, b = (a.astype(np.float32).astype(np.float64) for a in (weight, bias))  # the values the model stores
    k = x.shape[1] + 1
    gamma = k * UNIT_ROUNDOFF / (1 - k * UNIT_ROUNDOFF)
    return x64 @ w + b, gamma * (np.abs(x64) @ np.abs(w) + np.abs(b))


def clear_decisions(pre: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Rows whose argmax no float32 run can change: the top ReLU output leads the runner-up by more than twice
    the bound, or every pre-activation is below −bound (all outputs exactly 0, argmax 0)."""
    top2 = np.sort(np.maximum(pre, 0.0), axis=1)[:, -2:]
    reach = bound.max(axis=1)
    return (top2[:, 1] - top2[:, 0] > 2 * reach) | (pre.max(axis=1) < -reach)


def linear_model(
    path: Path, weight: np.ndarray, bias: np.ndarray, batch: int | str = "N", rest: int | str = FEATURES
) -> Path:
    """Save a one-Gemm model ``y = x @ weight + bias`` with input shape ``(batch, rest)``."""
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, rest])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, weight.shape[1]])],
        [
            numpy_helper.from_array(weight.astype(np.float32), "w"),
            numpy_helper.from_array(bias.astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def token_model(
    path: Path, vocab: int = 50, mask_type: int = TensorProto.FLOAT, cast_ids: bool = False, seed: int = 0
) -> Path:
    """Save a two-input text-style model: ``input_ids`` (int64 ``[batch, seq]``) index an embedding table
    ``[vocab, FEATURES]``, ``attention_mask`` (``[batch, seq]``, of ``mask_type``) weights the positions, the
    mean over ``seq`` goes through a ``[FEATURES, CLASSES]`` MatMul to ``logits`` ``[batch, CLASSES]``.

    ``cast_ids`` routes the ids through a Cast to int32 before the Gather (as exporters often do).
    """
    rng = np.random.default_rng(seed)
    ids = "ids32" if cast_ids else "input_ids"
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32)] if cast_ids else []
    nodes += [
        helper.make_node("Gather", ["embedding", ids], ["embedded"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "last"], ["mask3"]),
        helper.make_node("Mul", ["embedded", "mask3"], ["masked"]),
        helper.make_node("ReduceMean", ["masked"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "head"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "tokens",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", mask_type, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(rng.standard_normal((vocab, FEATURES)).astype(np.float32), "embedding"),
         numpy_helper.from_array(rng.standard_normal((FEATURES, CLASSES)).astype(np.float32), "head"),
         numpy_helper.from_array(np.array([-1], dtype=np.int64), "last")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="session")
def make_tokens():
    """The :func:`token_model` builder (two named inputs, symbolic ``seq``)."""
    return token_model


@pytest.fixture(scope="session")
def make_linear():
    """The :func:`linear_model` builder, for tests that need a variant (fixed batch, symbolic dims)."""
    return linear_model


@pytest.fixture(scope="session")
def features() -> int:
    return FEATURES


@pytest.fixture(scope="session")
def weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((FEATURES, CLASSES)), rng.standard_normal(CLASSES)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def reference_model(model_dir: Path, weights) -> Path:
    return linear_model(model_dir / "reference.onnx", *weights)


@pytest.fixture(scope="session")
def perturbed_weights(weights) -> tuple[np.ndarray, np.ndarray]:
    w, b = weights
    noise = np.random.default_rng(1).standard_normal(w.shape)
    return w + 0.5 * noise, b


@pytest.fixture(scope="session")
def perturbed_model(model_dir: Path, perturbed_weights) -> Path:
    return linear_model(model_dir / "perturbed.onnx", *perturbed_weights)


@pytest.fixture(scope="session")
def data(reference_model: Path, weights, perturbed_weights) -> tuple[np.ndarray, np.ndarray]:
    """100 inputs and the labels the reference model predicts (so its accuracy is exactly 1).

    Exact label and agreement counts across batch shapes and CPUs need every argmax to be clear of float32
    rounding (see :func:`clear_decisions`); checked here for both models, so a near-tie fails loudly.
    """
    x = np.random.default_rng(2).standard_normal((100, FEATURES)).astype(np.float32)
    for w, b in (weights, perturbed_weights):
        assert clear_decisions(*exact_and_bound(x, w, b)).all()
    session = ort.InferenceSession(str(reference_model), providers=["CPUExecutionProvider"])
    y = np.argmax(session.run(None, {"x": x})[0], axis=1).astype(np.int64)
    assert np.array_equal(y, np.argmax(np.maximum(exact_and_bound(x, *weights)[0], 0.0), axis=1))
    return x, y


@pytest.fixture(scope="session")
def float32_spread(data, weights, perturbed_weights) -> dict[str, np.ndarray]:
    """Per model, the most two float32 runs on ``data`` x may differ by, element by element (2× the bound)."""
    x, _ = data
    return {name: 2 * exact_and_bound(x, *wb)[1]
            for name, wb in (("reference", weights), ("perturbed", perturbed_weights))}


@pytest.fixture(scope="session")
def bench_config():
    from minreal.runtime_bench import BenchConfig

    return BenchConfig(
        providers=("cpu", "cuda", "tensorrt"), batch_sizes=(1, 4), warmup=2, min_runs=20, min_seconds=0.0,
        repeats=3, intra_op_threads=1,
    )


@pytest.fixture(scope="session")
def bench_report(reference_model: Path, perturbed_model: Path, data, bench_config):
    """One real benchmark run (6 worker processes), shared by the tests that inspect its report."""
    from minreal.runtime_bench import ModelEntry, run_benchmark

    messages: list[str] = []
    models = [ModelEntry("reference", reference_model), ModelEntry("perturbed", perturbed_model)]
    report = run_benchmark(models, bench_config, *data, progress=messages.append)
    return report, messages
