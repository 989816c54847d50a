"""Tests for minreal.export.accuracy_control: INT8 whose most sensitive layers fall back to float until the drop is met.

The model is the digits MLP (64 → 48 → 32 → 10), trained briefly, with one quantisation-hostile layer: hidden unit
0 of the second layer is dead (zero weights, bias −1, so ReLU gives exactly 0 on every input) and the last layer's
weight column reading it is set to 1000. The fp32 function ignores that column, but per-channel weight
quantisation of the last layer spends each output channel's whole int8 range on it and rounds every other weight
to zero, so the fully quantised model is at chance level; with that layer alone in float it is an ordinary INT8
model.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import minreal.export.accuracy_control as accuracy_control
import minreal.export.int8.calibration as int8_calibration
import minreal.runtime_bench.metrics as metrics_module
from minreal.compress.core.smoke import digits_mlp
from minreal.compress.core.train import TrainConfig, train
from minreal.compress.datasets import digits
from minreal.export.accuracy_control import (
    AccuracyControlResult,
    metric_drop,
    outside_in,
    quantize_with_accuracy_control,
)
from minreal.export.errors import CalibrationError
from minreal.export.int8 import QuantConfig, quantizable_nodes, quantize_int8
from minreal.export.onnx_export import to_onnx

OUTLIER = 1000.0


@dataclass(frozen=True)
class Case:
    """The hostile model's file, the name of its hostile node, calibration and held-out data."""

    path: Path
    hostile: str
    calib: np.ndarray
    x: np.ndarray
    y: np.ndarray


def _hostile_node(path: Path) -> str:
    """The quantisable node whose weight holds the outlier column."""
    model = onnx.load(str(path))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    (name,) = [n for n in quantizable_nodes(path) if np.abs(weights[nodes[n].input[1]]).max() == OUTLIER]
    return name


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    train_set, test_set = digits(seed=0, as_images=False)
    model = digits_mlp()
    hidden, last = model[3], model[5]
    with torch.no_grad():
        hidden.weight[0], hidden.bias[0] = 0.0, -1.0  # unit 0 dead: zero gradient, stays dead while training
    train(model, train_set, test_set, TrainConfig(epochs=8))
    with torch.no_grad():
        last.weight[:, 0] = OUTLIER  # read only from the dead unit: the fp32 function is unchanged
    path = tmp_path_factory.mktemp("ac") / "hostile.onnx"
    to_onnx(model, test_set.x[:2], path)
    return Case(path, _hostile_node(path), train_set.x[:200].numpy(), test_set.x.numpy(), test_set.y.numpy())


def _outputs(path: str | Path, x: np.ndarray) -> np.ndarray:
    """Independent evaluation: one plain ONNX Runtime CPU session on the whole array."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _nodes(path: str | Path) -> list[tuple[str, str]]:
    return [(n.op_type, n.name) for n in onnx.load(str(path)).graph.node]


def _float_weight_nodes(path: str | Path) -> set[str]:
    """Gemm/MatMul/Conv nodes of a QDQ model that read their weight straight from a float initializer."""
    model = onnx.load(str(path))
    floats = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    return {n.name for n in model.graph.node if n.op_type in ("Gemm", "MatMul", "Conv") and n.input[1] in floats}


def _check_consistent(result: AccuracyControlResult) -> None:
    """Drops follow from the metrics; the last step is the written model; the excluded nodes are float in it."""
    assert result.drop == metric_drop(result.fp32_metric, result.final_metric, result.metric)
    assert result.int8_drop == metric_drop(result.fp32_metric, result.int8_metric, result.metric)
    assert result.met == (result.drop <= result.max_drop)
    for step in result.excluded:
        assert step.drop == metric_drop(result.fp32_metric, step.metric, result.metric)
    if result.excluded:
        assert result.final_metric == result.excluded[-1].metric
    assert _float_weight_nodes(result.path) == set(result.excluded_nodes)
    assert result.quant.out_path == result.path and result.quant.excluded_nodes == result.excluded_nodes


def test_target_met_by_full_int8_excludes_nothing(case: Case, tmp_path: Path) -> None:
    result = quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", case.calib, case.x, case.y, 100.0)
    plain = quantize_int8(case.path, tmp_path / "plain.onnx", case.calib)
    assert result.met and result.excluded == [] and result.sensitivities == {}
    assert result.quantizations == 1 and result.final_metric == result.int8_metric
    assert _nodes(result.path) == _nodes(plain.out_path)
    assert result.int8_drop > 50.0  # the hostile layer really destroys the fully quantised model
    _check_consistent(result)


def test_hostile_layer_ranked_first_and_its_fallback_meets_the_target(case: Case, tmp_path: Path) -> None:
    lines: list[str] = []
    result = quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", case.calib, case.x, case.y, 2.0,
                                            progress=lines.append)
    ranked = quantizable_nodes(case.path)
    assert list(result.sensitivities)[0] == case.hostile and set(result.sensitivities) == set(ranked)
    assert result.met and result.excluded_nodes == [case.hostile]
    # Full INT8, one model per ranked node; the first fallback step is the hostile node's ranking model.
    assert result.quantizations == 1 + len(ranked)
    assert result.final_metric == result.sensitivities[case.hostile]
    assert len(lines) == 1 + len(ranked) + 1  # summary, one per ranked node, one per fallback step
    fp32 = np.mean(_outputs(case.path, case.x).argmax(1) == case.y)
    written = np.mean(_outputs(result.path, case.x).argmax(1) == case.y)
    one_sample = 1.0 / len(case.y)  # batch shapes may flip a near-tie
    assert result.fp32_metric == pytest.approx(fp32, abs=one_sample)
    assert result.final_metric == pytest.approx(written, abs=one_sample)
    assert json.loads(json.dumps(asdict(result)))["excluded"][0]["node"] == case.hostile  # reports are asdict JSON
    _check_consistent(result)


def test_an_unreachable_target_still_writes_keeping_only_nodes_that_helped(case: Case, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranking capped to the first layer (outside-in order), which is not the culprit: the drop cannot reach 0; the
    first layer goes to float only where, alone, it recovered some of the drop. The fp32 model, the reference of
    every candidate's agreement, runs once in the whole call (it ran beside each candidate)."""
    opened: list[str] = []
    real = metrics_module.create_session
    monkeypatch.setattr(metrics_module, "create_session",
                        lambda path, *a, **k: opened.append(Path(path).name) or real(path, *a, **k))
    result = quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", case.calib, case.x, None, 0.0,
                                            metric="agreement", max_fallback=1)
    assert opened.count(case.path.name) == 1 and len(opened) == 1 + result.quantizations >= 3
    first = quantizable_nodes(case.path)[0]
    assert first != case.hostile
    assert not result.met and list(result.sensitivities) == [first] and result.fp32_metric == 1.0
    alone = metric_drop(result.fp32_metric, result.sensitivities[first], metric="agreement")
    assert result.excluded_nodes == ([first] if alone < result.int8_drop else [])
    assert result.drop == min(alone, result.int8_drop)
    fp32, written = _outputs(case.path, case.x), _outputs(result.path, case.x)
    agreement = np.mean(fp32.argmax(1) == written.argmax(1))
    assert result.final_metric == pytest.approx(agreement, abs=1.0 / len(case.x))
    _check_consistent(result)


@pytest.mark.parametrize(("drops", "kept"), [((3.0, 2.0, 5.0, 6.0), 1), ((3.0, 4.0, 5.0), 0), ((3.0, 2.0, 0.5), 2),
                                             ((3.0, 2.0, 2.0), 1)])
def test_a_missed_target_keeps_the_fewest_float_nodes_with_the_smallest_drop(drops: tuple, kept: int) -> None:
    """Plain INT8's drop first, then each cumulative step's (allowed 1): the result is the shortest best prefix, or
    every step where the last one meets the target."""
    from minreal.export.accuracy_control import FallbackStep, _best_prefix

    steps = [FallbackStep(f"n{i}", 0.0, d) for i, d in enumerate(drops[1:])]
    assert _best_prefix(steps, drops[0], 1.0) == steps[:kept]


def test_mse_ranks_the_hostile_layer_first(case: Case, tmp_path: Path) -> None:
    """Regression targets: the fp32 model's own outputs (mean square about 15), so fp32 mse is float noise."""
    targets = _outputs(case.path, case.x)
    result = quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", case.calib, case.x, targets, 0.01,
                                            metric="mse")
    assert result.fp32_metric < 1e-9 and result.int8_drop > 1.0
    assert not result.quant.saturates_here  # the drop is the hostile layer's, not the CPU's int16 saturation
    assert list(result.sensitivities)[0] == case.hostile
    assert result.met and result.excluded_nodes == [case.hostile]
    written = np.mean((_outputs(result.path, case.x).astype(np.float64) - targets) ** 2)
    assert result.final_metric == pytest.approx(written, rel=1e-3)
    _check_consistent(result)


def test_one_run_calibrates_once(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every quantisation of a run (full INT8, one per ranked node) reuses one calibration; ONNX Runtime calibrates
    none itself, and ONNX Runtime pre-processes the model once for all of them. No outputs are written to disk: the
    accuracy metric compares each model with the labels."""
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
    calls = {"ours": 0, "onnxruntime": 0}

    def counting(key: str, real: Callable) -> Callable:
        def wrapped(*args: object, **kwargs: object) -> object:
            calls[key] += 1
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(int8_calibration, "_calibrated", counting("ours", int8_calibration._calibrated))
    monkeypatch.setattr(ort_quantize, "create_calibrator", counting("onnxruntime", ort_quantize.create_calibrator))
    written = []
    monkeypatch.setattr(metrics_module, "_keep", lambda *a: written.append(a[1]))
    shape_inference = importlib.import_module("onnxruntime.quantization.shape_inference")
    pre_processed = []
    real_pre = shape_inference.quant_pre_process
    monkeypatch.setattr(shape_inference, "quant_pre_process",
                        lambda *a, **k: pre_processed.append(1) or real_pre(*a, **k))
    result = quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", case.calib, case.x, case.y, 2.0)
    assert written == []  # accuracy runs each model alone against the labels: no model's outputs kept on disk
    assert len(pre_processed) == 2  # once for the quantisations (channels aligned), once to list the nodes (not)
    assert result.quantizations == 1 + len(quantizable_nodes(case.path)) >= 3
    assert calls == {"ours": 1, "onnxruntime": 0}
    assert result.quant.calibration_samples == len(case.calib) and not result.quant.random_calibration


def test_the_plain_int8_s_calibration_is_not_measured_again_inside_a_kept_block(case: Case, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A tune makes the original's INT8, then accuracy control calibrates the same graph on the same rows: inside
    calibrations_kept ONNX Runtime calibrates once for both (outside, twice), with the same written files."""
    from minreal.export.int8 import calibrate
    from minreal.export.int8.calibration import calibrations_kept

    calibrators = []  # ONNX Runtime's calibration passes
    real = int8_calibration._measured
    monkeypatch.setattr(int8_calibration, "_measured", lambda *a, **k: calibrators.append(1) or real(*a, **k))
    results = {}
    for kept in (True, False):
        calibrators.clear()
        folder = tmp_path / str(kept)
        folder.mkdir()
        with calibrations_kept() if kept else contextlib.nullcontext():
            plain = quantize_int8(case.path, folder / "plain.onnx", case.calib)
            results[kept] = quantize_with_accuracy_control(case.path, folder / "ac.onnx", case.calib, case.x, case.y,
                                                           2.0, int8=plain)
        assert results[kept].excluded_nodes == [case.hostile]  # ranked: accuracy control calibrated
        assert len(calibrators) == (1 if kept else 2)
    assert (tmp_path / "True" / "ac.onnx").read_bytes() == (tmp_path / "False" / "ac.onnx").read_bytes()
    calibrators.clear()
    with calibrations_kept():  # what changes the ranges is measured again: the rows, their order, the method
        for rows, config in ((case.calib, QuantConfig()), (case.calib, QuantConfig()), (case.calib[::-1].copy(),
                             QuantConfig()), (case.calib, QuantConfig(calibration_method="entropy"))):
            calibrate(case.path, rows, config)
    assert len(calibrators) == 3


def test_a_given_plain_int8_is_measured_not_quantised_again(case: Case, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's plain INT8 file is the starting point: nothing is quantised when it meets the target, and
    otherwise only the ranked models are; the results are those of a run that quantised it itself."""
    plain = quantize_int8(case.path, tmp_path / "plain.onnx", case.calib)
    quantised = []
    real = accuracy_control.quantize_int8
    monkeypatch.setattr(accuracy_control, "quantize_int8",
                        lambda *a, **k: quantised.append(k["exclude"]) or real(*a, **k))
    met = quantize_with_accuracy_control(case.path, tmp_path / "met.onnx", case.calib, case.x, case.y, 100.0,
                                         int8=plain)
    assert quantised == [] and met.quantizations == 0 and met.excluded == []
    assert met.quant == replace(plain, out_path=met.path)
    assert (tmp_path / "met.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()
    given = quantize_with_accuracy_control(case.path, tmp_path / "given.onnx", case.calib, case.x, case.y, 2.0,
                                           int8=plain)
    ranked = quantizable_nodes(case.path)
    assert [] not in quantised and given.quantizations == len(quantised) == len(ranked)
    own = quantize_with_accuracy_control(case.path, tmp_path / "own.onnx", case.calib, case.x, case.y, 2.0)
    assert own.quantizations == given.quantizations + 1
    assert replace(given, path=own.path, quant=own.quant, quantizations=own.quantizations, seconds=own.seconds) == own
    assert given.quant == replace(own.quant, out_path=given.path)
    assert (tmp_path / "given.onnx").read_bytes() == (tmp_path / "own.onnx").read_bytes()
    _check_consistent(given)


def test_a_plain_int8_of_another_format_is_refused(case: Case, tmp_path: Path) -> None:
    other = quantize_int8(case.path, tmp_path / "trt.onnx", case.calib, QuantConfig(target="tensorrt"))
    with pytest.raises(ValueError, match="not this config's"):
        quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", case.calib, case.x, case.y, 1.0, int8=other)
    assert not (tmp_path / "ac.onnx").exists()


def test_a_plain_int8_calibrated_on_other_rows_of_the_same_count_is_refused(case: Case, tmp_path: Path) -> None:
    """The plain INT8 records a digest of its calibration rows: one calibrated on other rows, as many, is not the
    starting point of this data's accuracy control (the count alone let it through), nor one calibrated on random
    rows of another seed for a random-calibration run; the same rows given as a mapping by input name, in float64,
    as a torch tensor or non-contiguous, or ranges from calibrate() on them, are."""
    from minreal.export.int8 import calibrate, calibration_digest

    config = QuantConfig().resolved()
    other_rows = case.x[: len(case.calib)]  # held-out rows: other images, as many
    assert not np.array_equal(np.sort(other_rows, axis=0), np.sort(case.calib, axis=0))
    other = quantize_int8(case.path, tmp_path / "other.onnx", other_rows, config)
    assert other.calibration_samples == len(case.calib)
    assert other.calibration_digest == calibration_digest(case.path, other_rows, config)
    with pytest.raises(ValueError, match=f"calibrated on {len(case.calib)} other rows, not on this calibration data's"):
        quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", case.calib, case.x, case.y, 100.0,
                                       config, int8=other)
    assert not (tmp_path / "ac.onnx").exists()
    name = onnx.load(str(case.path)).graph.input[0].name
    wide = np.asfortranarray(np.concatenate([case.calib, case.calib], axis=1))[:, : case.calib.shape[1]]
    assert not wide.flags.c_contiguous
    digest = calibration_digest(case.path, case.calib, config)
    assert {calibration_digest(case.path, rows, config) for rows in (
        {name: case.calib}, case.calib.astype(np.float64), torch.from_numpy(case.calib), wide)} == {digest}
    same = quantize_int8(case.path, tmp_path / "same.onnx", {name: case.calib}, config)
    reused = quantize_int8(case.path, tmp_path / "reused.onnx", None, config,
                           calibration=calibrate(case.path, case.calib, config))
    assert same.calibration_digest == reused.calibration_digest == digest != other.calibration_digest
    for plain in (same, reused):
        met = quantize_with_accuracy_control(case.path, tmp_path / "met.onnx", case.calib, case.x, case.y, 100.0,
                                             config, int8=plain)
        assert met.quantizations == 0
    random = replace(config, allow_random_calibration=True)
    seed7 = quantize_int8(case.path, tmp_path / "seed7.onnx", None, replace(random, seed=7))
    with pytest.raises(ValueError, match="calibrated on random rows, not on this config's random rows"):
        quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", None, case.x, case.y, 100.0, random,
                                       int8=seed7)
    seed0 = quantize_int8(case.path, tmp_path / "seed0.onnx", None, random)
    assert quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", None, case.x, case.y, 100.0, random,
                                          int8=seed0).quantizations == 0


def test_the_digest_covers_every_fixed_size_dtype_and_none_for_python_objects() -> None:
    """bfloat16 has no buffer format (memoryview refused it); strings held as objects have pointers for bytes."""
    from minreal.runtime_bench.inputs import data_digest

    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b16 = a.astype(ml_dtypes.bfloat16)
    assert data_digest(b16) == data_digest(b16.copy()) != data_digest(a)
    assert data_digest(np.array(["ab", "c"])) == data_digest(np.array(["ab", "c"]))
    assert data_digest(np.array(["ab", "c"], dtype=object)) is None
    assert data_digest({"ids": np.zeros(3, np.int64), "text": np.array(["x"], dtype=object)}) is None
    assert data_digest(a[::-1]) != data_digest(a)  # rows in another order: another digest


def test_unknown_excluded_node_is_refused(case: Case, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"exclude names nodes \['no_such_node'\]"):
        quantize_int8(case.path, tmp_path / "q.onnx", case.calib, exclude=["no_such_node"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_drop": -1.0}, ValueError, "max_drop=-1.0 must be finite and ≥ 0"),
        ({"metric": "f1"}, ValueError, "metric='f1' is not one of"),
        ({"max_fallback": -1}, ValueError, "max_fallback=-1"),
        ({"eval_x": np.zeros((4, 63), np.float32), "eval_y": np.zeros(4, np.int64)}, CalibrationError,
         r"evaluation data: data rows of shape \(63,\) do not fit"),
        ({"eval_y": None}, CalibrationError, "metric='accuracy' needs integer class labels"),
        ({"metric": "mse"}, CalibrationError, "metric='mse' needs float regression targets"),
    ],
)
def test_bad_arguments(case: Case, tmp_path: Path, kwargs: dict, error: type, message: str) -> None:
    arguments = {"eval_x": case.x, "eval_y": case.y, "max_drop": 1.0, **kwargs}
    with pytest.raises(error, match=message):
        quantize_with_accuracy_control(case.path, tmp_path / "ac.onnx", case.calib, **arguments)
    assert list(tmp_path.iterdir()) == []


def test_metric_drop_units() -> None:
    assert metric_drop(0.90, 0.875, "accuracy") == pytest.approx(2.5)  # percentage points
    assert metric_drop(1.0, 1.0, "agreement") == 0.0
    assert metric_drop(0.25, 0.5, "mse") == 0.25  # increase of an error
    assert metric_drop(0.5, 0.25, "mse") == -0.25


def test_outside_in_visits_every_node_once() -> None:
    assert outside_in(["a", "b", "c", "d", "e"]) == ["a", "e", "b", "d", "c"]
    assert outside_in(["a", "b", "c", "d"]) == ["a", "d", "b", "c"]
    assert outside_in([]) == []
