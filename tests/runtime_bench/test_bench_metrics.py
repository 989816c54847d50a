"""Accuracy / MSE / agreement, accumulated batch by batch, against whole-array numpy."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import minreal.runtime_bench.metrics as metrics_module
from minreal.runtime_bench.errors import BenchInputError
from minreal.runtime_bench.metrics import (
    agreement_count,
    correct_count,
    evaluate_models,
    max_abs_diff,
    reference_outputs_kept,
    squared_error_sum,
)


def _outputs(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_streamed_metrics_equal_whole_array(reference_model: Path, perturbed_model: Path, data,
                                            float32_spread) -> None:
    x, y = data
    ref, pert = _outputs(reference_model, x), _outputs(perturbed_model, x)
    # batch 7 does not divide 100 rows: the short last batch must count correctly
    metrics = evaluate_models(["ref", "pert"], [reference_model, perturbed_model], x, y, batch_size=7, threads=1)
    assert [m.samples for m in metrics] == [100, 100]
    assert metrics[0].accuracy == 1.0 and metrics[0].top1_agreement == 1.0 and metrics[0].max_abs_diff == 0.0
    # exact counts: the data fixture checks no argmax is within float32 rounding of a tie
    assert metrics[1].accuracy == pytest.approx(np.mean(pert.argmax(1) == y))
    assert metrics[1].top1_agreement == pytest.approx(np.mean(pert.argmax(1) == ref.argmax(1)))
    # batches of 7 here, of 100 above: each output may move by its float32 spread (~1e-5, the difference is ~1)
    spread = float((float32_spread["reference"] + float32_spread["perturbed"]).max())
    assert metrics[1].max_abs_diff == pytest.approx(np.abs(pert - ref).max(), rel=0, abs=spread)
    assert 0.0 < metrics[1].top1_agreement < 1.0
    assert metrics[1].mse is None


def test_float_targets_give_mse(reference_model: Path, perturbed_model: Path, data, float32_spread) -> None:
    x, _ = data
    targets = _outputs(reference_model, x) + 0.25  # float32: one more rounding, at most u·|target|, u = eps/2
    metrics = evaluate_models(["ref", "pert"], [reference_model, perturbed_model], x, targets, batch_size=32, threads=1)
    assert metrics[0].accuracy is None
    # each residual is −0.25 + ε with |ε| ≤ e (batch-shape spread plus the rounding of the target), so
    # |mse − 0.0625| ≤ mean(0.5·e + e²)
    e = float32_spread["reference"] + np.finfo(np.float32).eps / 2 * np.abs(targets)
    assert metrics[0].mse == pytest.approx(0.0625, rel=0, abs=np.mean(0.5 * e + e**2))
    pert = _outputs(perturbed_model, x).astype(np.float64)
    expected = np.mean((pert - targets) ** 2)
    e = float32_spread["perturbed"]  # batches of 32 there, of 100 here: residual r moves by ≤ e, r² by ≤ 2|r|e + e²
    assert metrics[1].mse == pytest.approx(expected, rel=0, abs=np.mean(2 * np.abs(pert - targets) * e + e**2))


def test_fixed_batch_model_is_padded(tmp_path: Path, weights, reference_model: Path, data, make_linear,
                                     float32_spread) -> None:
    x, y = data
    fixed = make_linear(tmp_path / "fixed.onnx", *weights, batch=8)
    metrics = evaluate_models(["ref", "fixed"], [reference_model, fixed], x, y, batch_size=64, threads=1)
    assert metrics[1].samples == 100
    # same weights; the padded last batch runs at another shape than the reference's: float32 spread only
    assert metrics[1].accuracy == 1.0
    assert metrics[1].max_abs_diff <= float(float32_spread["reference"].max())


def test_one_session_open_at_a_time_with_the_metrics_of_batches_run_side_by_side(
    reference_model: Path, perturbed_model: Path, data, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each model runs every batch in a session of its own, without onnxruntime's memory arena, before the next
    session is created (so at most one session's memory is held, and only while a batch runs), and its metrics are
    those of the same batches of 7 run model beside model: the same sessions on the same batches give the same
    outputs, to the bit."""
    x, y = data
    open_now, most = [0], [0]
    real = metrics_module.create_session

    def counted(*args: Any, **kwargs: Any) -> Any:
        session = real(*args, **kwargs)
        assert not session.get_session_options().enable_cpu_mem_arena
        open_now[0] += 1
        most[0] = max(most[0], open_now[0])
        weakref.finalize(session, lambda: open_now.__setitem__(0, open_now[0] - 1))
        return session

    monkeypatch.setattr(metrics_module, "create_session", counted)
    paths = [reference_model, perturbed_model, reference_model]
    metrics = evaluate_models(["ref", "pert", "again"], paths, x, y, batch_size=7, threads=1)
    assert most[0] == 1 and open_now[0] == 0
    sessions = [real(p, "CPUExecutionProvider", 1) for p in paths]
    batches = [[s.run(None, {"x": x[i : i + 7]})[0] for i in range(0, 100, 7)] for s in sessions]
    ref = np.concatenate(batches[0])
    for m, outs in zip(metrics, batches):
        out = np.concatenate(outs)
        assert m.samples == 100 and m.accuracy == np.mean(out.argmax(1) == y)
        assert m.top1_agreement == np.mean(out.argmax(1) == ref.argmax(1))
        assert m.max_abs_diff == float(np.abs(out.astype(np.float64) - ref).max())
    assert metrics[2].max_abs_diff == 0.0 and metrics[1].max_abs_diff > 0.0


def test_a_kept_reference_runs_once_per_file_and_data_with_the_metrics_of_running_it_again(
    tmp_path: Path, weights, perturbed_weights, reference_model: Path, perturbed_model: Path, data, make_linear,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """"Never compute twice": inside reference_outputs_kept(file), that file as the first model of later
    evaluate_models calls on the same data is read back from disk, with metrics equal (to the bit) to those of calls
    that run it; it runs again for other data, another step, or its file rewritten; a file the block does not name
    is not kept; the kept outputs go when the block ends."""
    x, y = data
    opened: list[str] = []
    real = metrics_module.create_session

    def counted(path: Path, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(metrics_module, "create_session", counted)
    ref = make_linear(tmp_path / "ref.onnx", *weights)
    plain = [evaluate_models(["ref", "pert"], [ref, perturbed_model], x, y, batch_size=7, threads=1),
             evaluate_models(["ref", "same"], [ref, reference_model], x, None, batch_size=7, threads=1)]
    opened.clear()
    with reference_outputs_kept(ref):
        kept = [evaluate_models(["ref", "pert"], [ref, perturbed_model], x, y, batch_size=7, threads=1),
                evaluate_models(["ref", "same"], [ref, reference_model], x, None, batch_size=7, threads=1)]
        assert opened == ["ref.onnx", "perturbed.onnx", "reference.onnx"]  # the reference ran once for both calls
        folders = list(metrics_module._KEPT.get().folders.values())
        with reference_outputs_kept(perturbed_model):  # an inner block shares the outer one's outputs
            assert evaluate_models(["ref"], [ref], x, y, batch_size=7, threads=1) == plain[0][:1]
            evaluate_models(["pert"], [perturbed_model], x, y, batch_size=7, threads=1)
        evaluate_models(["pert", "ref"], [perturbed_model, ref], x, y, batch_size=7, threads=1)
        evaluate_models(["same"], [reference_model], x, y, batch_size=7, threads=1)
        evaluate_models(["same"], [reference_model], x, y, batch_size=7, threads=1)  # not named: runs again
        assert opened == ["ref.onnx", "perturbed.onnx", "reference.onnx", "perturbed.onnx", "ref.onnx",
                          "reference.onnx", "reference.onnx"]
        assert len(metrics_module._KEPT.get().folders) == 2  # ref's and perturbed's outputs, not reference's
        opened.clear()
        evaluate_models(["ref"], [ref], x[:50], y[:50], batch_size=7, threads=1)  # other data
        evaluate_models(["ref"], [ref], x, y, batch_size=10, threads=1)  # another step
        make_linear(ref, 2 * weights[0], 2 * weights[1])  # rewritten (same size, maybe the same timestamp): run again
        again = evaluate_models(["ref", "pert"], [ref, perturbed_model], x, y, batch_size=7, threads=1)
        assert opened == ["ref.onnx", "ref.onnx", "ref.onnx", "perturbed.onnx"]
        make_linear(ref, *perturbed_weights)  # the bytes of a kept file: its outputs are read back
        assert evaluate_models(["ref"], [ref], x, y, batch_size=7, threads=1)[0].accuracy == plain[0][1].accuracy
        assert opened == ["ref.onnx", "ref.onnx", "ref.onnx", "perturbed.onnx"]
        make_linear(ref, 2 * weights[0], 2 * weights[1])
    assert kept == plain
    assert again == evaluate_models(["ref", "pert"], [ref, perturbed_model], x, y, batch_size=7, threads=1)
    assert folders and not any(f.exists() for f in folders)
    opened.clear()
    evaluate_models(["ref", "pert"], [ref, perturbed_model], x, y, batch_size=7, threads=1)
    evaluate_models(["ref", "pert"], [ref, perturbed_model], x, y, batch_size=7, threads=1)
    assert opened == ["ref.onnx", "perturbed.onnx"] * 2  # outside a block every call runs every model
    written = []
    keep = metrics_module._keep
    monkeypatch.setattr(metrics_module, "_keep", lambda *a: written.append(a[1]) or keep(*a))
    alone = evaluate_models(["ref"], [ref], x, y, batch_size=7, threads=1)
    assert written == [] and alone[0] == again[0]  # a model alone: its outputs are read by nobody, so not written
    evaluate_models(["ref", "pert"], [ref, perturbed_model], x, y, batch_size=7, threads=1)
    assert written == list(range(15))  # one file per batch of 7 of the 100 rows, for the model after it


def test_data_holding_python_objects_is_never_keyed(reference_model: Path) -> None:
    """An object array's bytes are pointers: two equal arrays would get different digests (and a freed array's
    address could give a stale hit), so such data is not kept."""
    x = np.empty((2,), dtype=object)
    assert metrics_module._reference_key(reference_model, x, 7, 1) is None
    assert metrics_module._reference_key(reference_model, {"ids": x}, 7, 1) is None
    assert metrics_module._reference_key(reference_model, np.zeros((2, 3), np.float32), 7, 1) is not None


def test_max_abs_diff_over_chunks_is_the_whole_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 7 elements over 4×5×3 outputs give numpy's figure over the whole array at once, exactly: the worst
    element in a later chunk, a NaN anywhere, and empty outputs (0.0)."""
    rng = np.random.default_rng(3)
    out, ref = rng.standard_normal((4, 5, 3)).astype(np.float32), rng.standard_normal((4, 5, 3)).astype(np.float32)
    out[3, 4, 2] = 50.0  # the last element, in the last (short) chunk

    def whole(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))

    monkeypatch.setattr(metrics_module, "DIFF_CHUNK", 7)
    assert max_abs_diff(out, ref) == whole(out, ref) == abs(50.0 - float(ref[3, 4, 2]))
    out[0, 0, 1] = np.nan
    assert np.isnan(max_abs_diff(out, ref)) and np.isnan(whole(out, ref))
    empty = np.zeros((0, 5), np.float32)
    assert max_abs_diff(empty, empty) == whole(empty, empty) == 0.0


def test_single_output_has_no_top1_agreement() -> None:
    out = np.ones((5, 1))
    assert agreement_count(out, out) is None
    assert agreement_count(np.eye(3), np.eye(3)[[0, 2, 1]]) == 1


def test_a_map_or_a_sequence_has_no_top1_agreement() -> None:
    """A (N, C, H, W) map or (N, T, D) sequence agrees per position, not per row: counting its last axis's argmax
    gave 3 rows of a 4-wide map 12 agreements (agreement 4.0); such outputs get None, as a single output does."""
    seg = np.random.default_rng(0).normal(size=(3, 5, 4, 4))
    assert agreement_count(seg, seg) is None
    assert agreement_count(seg[:, :, 0], seg[:, :, 0]) is None
    assert agreement_count(seg[:, :, 0, 0], seg[:, :, 0, 0]) == 3


def test_batch_functions() -> None:
    out = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert correct_count(out, np.array([1, 0, 0])) == 2
    assert squared_error_sum(np.array([[1.0], [2.0]]), np.array([0.0, 0.0])) == (5.0, 2)
    assert max_abs_diff(out, out + 0.5) == pytest.approx(0.5)
    with pytest.raises(BenchInputError, match="differs from the first model"):
        max_abs_diff(out, out[:2])
    with pytest.raises(BenchInputError, match=r"\(batch, classes\)"):
        correct_count(np.ones(3), np.ones(3, dtype=int))


def test_label_count_must_match(reference_model: Path, data) -> None:
    x, y = data
    with pytest.raises(BenchInputError, match="x has 100 rows but y has 99"):
        evaluate_models(["ref"], [reference_model], x, y[:99], batch_size=10, threads=1)


def test_the_evaluation_step_feeds_at_most_its_bytes_of_input_whatever_a_row_weighs() -> None:
    """zoo (issue 44): `minreal bench` of s3d (clips of 3×16×224×224 floats, 9.2 MiB a row) ran the agreement on 64
    rows at once in each of four sessions, whose arenas grew to 23 GiB together and the kernel killed it. A step
    feeds at most EVAL_STEP_BYTES (64 MiB) of input: 6 such clips; small rows keep the whole batch; one row always."""
    from minreal.runtime_bench.metrics import EVAL_STEP_BYTES, eval_step

    clip = 3 * 16 * 224 * 224 * 4
    clips = np.zeros((8, 3, 16, 224, 224), dtype=np.float32)
    assert eval_step(64, clips) == EVAL_STEP_BYTES // clip == 6
    assert eval_step(64, np.zeros((100, 3, 32, 32), dtype=np.float32)) == 64
    assert eval_step(64, {"ids": np.zeros((4, 128), dtype=np.int64), "mask": np.ones((4, 128), dtype=np.int64)}) == 64
    assert eval_step(64, np.zeros((2, 17 << 20), dtype=np.float32)) == 1
