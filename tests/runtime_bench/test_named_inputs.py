"""Named inputs: embedding-index bounds read from the graph, random and data inputs per shape, worker data files,
metrics on several inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from minreal.runtime_bench.errors import BenchInputError
from minreal.runtime_bench.inputs import data_rows, index_bounds, input_specs, timing_inputs
from minreal.runtime_bench.metrics import evaluate_models
from minreal.runtime_bench.worker import load_data, save_data

VOCAB = 50


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory, make_tokens) -> Path:
    return make_tokens(tmp_path_factory.mktemp("tokens") / "tokens.onnx", vocab=VOCAB)


def _data(rows: int = 5, seq: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    mask = np.ones((rows, seq), dtype=np.float32)
    mask[:, seq // 2 :] = rng.integers(0, 2, (rows, seq - seq // 2))
    return {"input_ids": rng.integers(0, VOCAB, (rows, seq)), "attention_mask": mask}


@pytest.mark.parametrize("cast_ids", [False, True])
def test_index_bound_read_from_gather_table(tmp_path: Path, make_tokens, cast_ids: bool) -> None:
    path = make_tokens(tmp_path / "t.onnx", vocab=37, cast_ids=cast_ids)
    assert index_bounds(onnx.load(str(path)).graph) == {"input_ids": 37}  # the mask feeds no Gather
    ids, mask = input_specs(path)
    assert (ids.name, ids.dtype, ids.shape, ids.high) == ("input_ids", "int64", ("batch", "seq"), 37)
    assert (mask.name, mask.dtype, mask.high) == ("attention_mask", "float32", None)


def test_gather_axis_and_non_initializer_tables() -> None:
    table = onnx.numpy_helper.from_array(np.zeros((3, 7), dtype=np.float32), "table")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gather", ["table", "i"], ["a"], axis=-1),
         onnx.helper.make_node("Gather", ["x", "j"], ["b"])],  # data is an input: no bound for j
        "g",
        [onnx.helper.make_tensor_value_info(n, t, None) for n, t in
         (("i", TensorProto.INT64), ("j", TensorProto.INT64), ("x", TensorProto.FLOAT))],
        [onnx.helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b")],
        [table],
    )
    assert index_bounds(graph) == {"i": 7}


def test_random_inputs_are_valid_for_the_model(tokens: Path) -> None:
    feeds = timing_inputs(input_specs(tokens), 64, None, seed=0, model="t", axis_values={"seq": 6})
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.shape == mask.shape == (64, 6) and ids.dtype == np.int64 and mask.dtype == np.float32
    assert ids.min() >= 0 and ids.max() < VOCAB and len(np.unique(ids)) > VOCAB // 2  # spread over the table
    assert np.isfinite(mask).all() and mask.std() > 0.5  # floats stay standard normal, even a float mask
    session = ort.InferenceSession(str(tokens), providers=["CPUExecutionProvider"])
    assert session.run(None, feeds)[0].shape == (64, 4)


def test_random_integer_mask_is_ones_and_bool_is_true(tmp_path: Path, make_tokens) -> None:
    for mask_type, dtype, value in ((TensorProto.INT64, np.int64, 1), (TensorProto.BOOL, np.bool_, True)):
        path = make_tokens(tmp_path / f"m{mask_type}.onnx", mask_type=mask_type)
        mask = timing_inputs(input_specs(path), 2, None, seed=0, model="t", axis_values={"seq": 3})["attention_mask"]
        assert mask.dtype == dtype and mask.shape == (2, 3) and np.all(mask == value)


def test_symbolic_axis_without_value_names_input_axis_and_option(tokens: Path) -> None:
    """The library names its field, the command line its flag (it said `set BenchConfig.axis_values=...` there)."""
    from minreal.app.field_flags import flag_spelled

    with pytest.raises(BenchInputError, match=r"model 't' input 'input_ids' has symbolic dims .* axis 1 \('seq'\) "
                                              r"has no value; give `BenchConfig.axis_values` lengths for seq or "
                                              r"pass data x") as info:
        timing_inputs(input_specs(tokens), 2, None, seed=0, model="t")
    said = flag_spelled(info.value)
    assert "give --axis-values lengths for seq or pass data x" in said and "BenchConfig" not in said, said


def test_data_is_tiled_cut_and_cast(tokens: Path) -> None:
    x = _data(rows=3, seq=8)
    feeds = timing_inputs(input_specs(tokens), 5, x, seed=0, model="t", axis_values={"seq": 4})
    expected = np.concatenate([x["input_ids"], x["input_ids"]])[:5, :4]
    np.testing.assert_array_equal(feeds["input_ids"], expected)
    assert feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].flags.c_contiguous
    np.testing.assert_array_equal(feeds["attention_mask"], np.concatenate([x["attention_mask"]] * 2)[:5, :4])
    whole = timing_inputs(input_specs(tokens), 2, x, seed=0, model="t")  # no value for seq: the data's length
    assert whole["input_ids"].shape == (2, 8)


def test_data_shorter_than_requested_axis_is_an_error(tokens: Path) -> None:
    with pytest.raises(BenchInputError, match=r"model 't' input 'input_ids' axis 1 \('seq'\) has length 8 in the "
                                              r"data, shorter than the requested seq=9.*never padded"):
        timing_inputs(input_specs(tokens), 1, _data(seq=8), seed=0, model="t", axis_values={"seq": 9})


def test_missing_extra_and_mistyped_inputs(tokens: Path) -> None:
    specs, x = input_specs(tokens), _data()
    with pytest.raises(BenchInputError, match=r"model 't' input 'attention_mask' has no array in data x"):
        timing_inputs(specs, 1, {"input_ids": x["input_ids"]}, seed=0, model="t")
    with pytest.raises(BenchInputError, match=r"data x holds 'token_type_ids' but model 't' has no such input"):
        timing_inputs(specs, 1, {**x, "token_type_ids": x["input_ids"]}, seed=0, model="t")
    with pytest.raises(BenchInputError, match=r"float64 cannot feed model 't' input 'input_ids' \(int64\)"):
        timing_inputs(specs, 1, {**x, "input_ids": x["input_ids"].astype(np.float64)}, seed=0, model="t")
    with pytest.raises(BenchInputError, match=r"model 't' has 2 inputs .*pass x as a dict"):
        timing_inputs(specs, 1, x["input_ids"], seed=0, model="t")


def test_data_rows_checks_every_array() -> None:
    assert data_rows(_data(rows=5)) == 5 and data_rows(np.ones((3, 2))) == 3
    with pytest.raises(BenchInputError, match=r"different row counts"):
        data_rows({"a": np.ones((3, 2)), "b": np.ones((4, 2))})
    with pytest.raises(BenchInputError, match=r"x\['b'\] must have at least one row"):
        data_rows({"a": np.ones((3, 2)), "b": np.ones((0, 2))})
    with pytest.raises(BenchInputError, match=r"empty mapping"):
        data_rows({})


def test_worker_data_files_round_trip(tmp_path: Path) -> None:
    named = {"file": np.arange(6).reshape(2, 3), "a/b:0": np.ones((2, 1), dtype=np.float16)}
    path = save_data(named, tmp_path)
    assert path.endswith(".npz")
    loaded = load_data(path)
    assert list(loaded) == list(named)
    for name, array in named.items():
        assert loaded[name].dtype == array.dtype
        np.testing.assert_array_equal(loaded[name], array)
    array = np.arange(4.0)
    np.testing.assert_array_equal(load_data(save_data(array, tmp_path)), array)
    assert save_data(None, tmp_path) is None and load_data(None) is None


def test_metrics_on_named_inputs_use_full_length(tmp_path: Path, tokens: Path, make_tokens) -> None:
    other = make_tokens(tmp_path / "other.onnx", vocab=VOCAB, cast_ids=True)  # same weights, a Cast added
    x = _data(rows=5, seq=8)
    metrics = evaluate_models(["a", "b"], [tokens, other], x, None, batch_size=2, threads=1)
    assert [m.samples for m in metrics] == [5, 5]
    assert metrics[1].top1_agreement == 1.0 and metrics[1].max_abs_diff == 0.0
    session = ort.InferenceSession(str(tokens), providers=["CPUExecutionProvider"])
    labels = np.argmax(session.run(None, x)[0], axis=1)
    assert evaluate_models(["a"], [tokens], x, labels, batch_size=2, threads=1)[0].accuracy == 1.0


def test_data_outside_an_embedding_table_or_of_mismatched_lengths_is_refused() -> None:
    from minreal.runtime_bench.inputs import InputSpec, named_data

    specs = [InputSpec("input_ids", "int64", ("batch", "seq"), high=30),
             InputSpec("attention_mask", "int64", ("batch", "seq"))]
    ok = {"input_ids": np.full((2, 5), 29), "attention_mask": np.ones((2, 5), np.int64)}
    assert set(named_data(specs, ok, "m")) == {"input_ids", "attention_mask"}
    with pytest.raises(BenchInputError, match=r"'input_ids' holds values 0\.\.30, .* table of 30 rows"):
        named_data(specs, {**ok, "input_ids": np.array([[0, 1, 2, 3, 30]] * 2)}, "m")
    with pytest.raises(BenchInputError,
                       match=r"sharing axis 'seq' differ in its length \(input_ids 5, attention_mask 4"):
        named_data(specs, {**ok, "attention_mask": np.ones((2, 4), np.int64)}, "m")
