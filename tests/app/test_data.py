"""Data specs: every accepted kind loads, every bad input fails with the culprit named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from minreal.app.callables import SpecError
from minreal.app.data import load_data, load_dataset
from minreal.compress.datasets import digits


@pytest.mark.parametrize("spec, sample_shape", [
    ("digits", (1, 8, 8)), ("digits-flat", (64,)), ("digits-seq", (64, 1)),
])
def test_builtin_digits_split_like_compress_datasets(spec: str, sample_shape: tuple[int, ...]) -> None:
    data = load_data(spec, seed=3)
    assert data.calib.x.shape[1:] == sample_shape and data.evaluation.x.shape[1:] == sample_shape
    assert len(data.calib) + len(data.evaluation) == 1797
    _, reference = digits(seed=3)
    assert torch.equal(data.evaluation.y, reference.y) and "digits" in data.source


def test_builtin_full_dataset_and_reshape() -> None:
    data = load_dataset("digits-flat", input_shape=(1, 8, 8))
    assert data.x.shape == (1797, 1, 8, 8) and data.y is not None


@pytest.mark.parametrize("x_key, y_key", [("x", "y"), ("X", "y"), ("inputs", "labels")])
def test_npz_key_conventions(tmp_path: Path, x_key: str, y_key: str) -> None:
    x = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float64)
    np.savez(tmp_path / "d.npz", **{x_key: x, y_key: np.arange(20) % 2})
    data = load_data(str(tmp_path / "d.npz"), eval_fraction=0.25, seed=1)
    assert len(data.calib) == 15 and len(data.evaluation) == 5
    assert data.calib.x.dtype == torch.float32 and data.calib.y.dtype == torch.int64


def test_npy_inputs_only(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((8, 2, 3), dtype=np.float32))
    data = load_dataset(str(tmp_path / "x.npy"))
    assert data.x.shape == (8, 2, 3) and data.y is None


def test_separate_eval_data(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.zeros((6, 4)), y=np.zeros(6))
    np.savez(tmp_path / "b.npz", x=np.ones((3, 4)), y=np.ones(3))
    data = load_data(str(tmp_path / "a.npz"), eval_spec=str(tmp_path / "b.npz"))
    assert len(data.calib) == 6 and len(data.evaluation) == 3
    assert torch.all(data.evaluation.x == 1) and "b.npz" in data.source


def test_image_folder(tmp_path: Path) -> None:
    from PIL import Image

    for label, colour in enumerate(["black", "white"]):
        (tmp_path / "imgs" / f"class_{label}").mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (12, 10), colour).save(tmp_path / "imgs" / f"class_{label}" / f"{i}.png")
    data = load_dataset(str(tmp_path / "imgs"), image_size=8)
    assert data.x.shape == (6, 3, 8, 8) and data.y.tolist() == [0, 0, 0, 1, 1, 1]
    white = (1.0 - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor([0.229, 0.224, 0.225])
    assert torch.allclose(data.x[-1, :, 0, 0], white, atol=1e-5)
    assert len(load_dataset(str(tmp_path / "imgs"), image_size=8, max_samples=4)) == 4


def test_callables_returning_arrays_batches_and_datasets(factory_file: Path) -> None:
    arrays = load_dataset(f"{factory_file}:data")
    assert arrays.x.shape == (10, 4) and arrays.y.tolist()[:4] == [0, 1, 2, 0]
    batched = load_dataset(f"{factory_file}:batches", max_samples=6)
    assert batched.x.shape == (6, 2) and batched.y.tolist() == [0, 0, 0, 0, 1, 1]
    pair_of_datasets = load_dataset("minreal.compress.datasets:digits")
    assert pair_of_datasets.x.shape == (1797, 1, 8, 8)


def test_image_folder_without_classes(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match=r"image folder .*empty cannot be read.*one sub-folder per class"):
        load_dataset(str(tmp_path / "empty"))


@pytest.mark.parametrize("arrays, pattern", [
    ({"y": np.zeros(3)}, r"d\.npz has no input array: found keys \['y'\]"),
    ({"a": np.zeros((3, 2)), "b": np.zeros(4)}, r"inputs in .*d\.npz have different sample counts \{'a': 3, 'b': 4\}"),
    ({"x": np.zeros((3, 2)), "b": np.zeros(3)}, r"d\.npz has an input array 'x' and other arrays \['b'\]"),
    ({"x": np.array([1, "a"], dtype=object)}, r"array 'x' in .*d\.npz holds pickled objects"),
    ({"x": np.array([[0.0], [np.nan], [np.inf]])}, r"'x' in .*d\.npz has 2 NaN/inf values \(first in sample 1\)"),
    ({"X": np.zeros((4, 2)), "labels": np.zeros(3)}, r"d\.npz: 4 inputs in 'X' but labels 'labels' have shape \(3,\)"),
    ({"x": np.zeros((0, 5))}, r"'x' in .*d\.npz holds no samples"),
    ({"x": np.array(["a", "b"])}, r"'x' in .*d\.npz has dtype <U1"),
    ({"x": np.zeros(2), "X": np.zeros(2)}, r"d\.npz has several input arrays \(x, X\)"),
])
def test_bad_npz_names_file_and_key(tmp_path: Path, arrays: dict, pattern: str) -> None:
    np.savez(tmp_path / "d.npz", **arrays)
    with pytest.raises(SpecError, match=pattern):
        load_data(str(tmp_path / "d.npz"))


def test_npy_object_array_is_not_unpickled(tmp_path: Path) -> None:
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(SpecError, match=r"o\.npy holds pickled objects"):
        load_dataset(str(tmp_path / "o.npy"))


@pytest.mark.parametrize("spec, pattern", [
    ("digitz", r"unknown data spec 'digitz'; did you mean digits"),
    ("{tmp}/nope.npz", r"data file .*nope\.npz not found"),
    ("{tmp}/factory.py:text", r"data callable .*factory\.py:text returned a str"),
    ("{tmp}/factory.py:ragged", r"batches from .*ragged have different sample shapes \(3,\), \(4,\)"),
    ("{tmp}/factory.py:nothing", r"data factory 'nothing' not found in .*factory\.py"),
])
def test_bad_data_specs_name_the_culprit(factory_file: Path, spec: str, pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern):
        load_dataset(spec.format(tmp=factory_file.parent))


def test_unsupported_data_file(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("1,2\n")
    with pytest.raises(SpecError, match=r"d\.csv has unsupported suffix '\.csv'"):
        load_dataset(str(tmp_path / "d.csv"))


def test_too_few_samples_to_split_and_bad_reshape(tmp_path: Path) -> None:
    np.save(tmp_path / "one.npy", np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(SpecError, match=r"one\.npy has 1 sample\(s\), too few"):
        load_data(str(tmp_path / "one.npy"))
    with pytest.raises(SpecError, match=r"cannot reshape inputs from .*one\.npy of shape \(1, 4\) to \(N, 3\)"):
        load_dataset(str(tmp_path / "one.npy"), input_shape=(3,))


def test_mismatched_calib_and_eval_shapes(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((4, 4), dtype=np.float32))
    np.save(tmp_path / "b.npy", np.zeros((4, 5), dtype=np.float32))
    with pytest.raises(SpecError, match=r"a\.npy has samples of shape \(4,\) but evaluation data .*b\.npy has \(5,\)"):
        load_data(str(tmp_path / "a.npy"), eval_spec=str(tmp_path / "b.npy"))
