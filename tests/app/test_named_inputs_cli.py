"""Several named inputs from the command line: npz keyed by input name, data callables yielding dicts, named
``--input-shape``, ``--dynamic-axes``, and ``run`` end to end with per-shape latency."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from minreal.app.callables import SpecError
from minreal.app.cli import run
from minreal.app.data import load_data, load_dataset
from minreal.app.models import align_inputs, load_model
from minreal.app.shapes import (
    infer_dynamic_axes,
    parse_axis_values,
    parse_dynamic_axes,
    parse_input_shapes,
    random_inputs,
)
from minreal.compress.core.inputs import NamedInputs

FACTORY = """
import torch
from torch import nn


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30, 16)
        self.mix = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, input_ids, attention_mask, scale=None):
        m = attention_mask.unsqueeze(-1).float()
        h = (self.embed(input_ids) * m).sum(1) / m.sum(1)
        return self.mix(h)


def make():
    torch.manual_seed(0)
    return Pair()


def dict_batches():
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        ids = torch.randint(0, 30, (8, 10), generator=g)
        yield {"attention_mask": torch.ones(8, 10, dtype=torch.int64), "input_ids": ids}, ids[:, 0] % 4
"""
QUICK = ["--min-seconds", "0.02", "--repeats", "1"]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pair.py").write_text(FACTORY)
    rng = np.random.default_rng(0)
    for name, n, seq in (("train", 96, 12), ("held", 32, 8)):
        ids = rng.integers(0, 30, (n, seq))
        mask = np.ones((n, seq), np.int64)
        mask[::4, -3:] = 0
        np.savez(tmp_path / f"{name}.npz", attention_mask=mask, input_ids=ids, y=ids[:, 0] % 4)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_npz_keyed_by_input_name_loads_named_inputs_in_forward_order(workdir: Path) -> None:
    data = load_dataset("train.npz")
    assert isinstance(data.x, NamedInputs) and data.x.names == ["attention_mask", "input_ids"]  # as saved
    aligned = align_inputs(load_model("pair.py:make"), data.x, "pair.py:make", "train.npz")
    assert aligned.names == ["input_ids", "attention_mask"] and data.x.tensors["input_ids"].dtype == torch.int64


def test_data_callable_may_yield_dicts(workdir: Path) -> None:
    data = load_dataset("pair.py:dict_batches")
    assert len(data) == 24 and set(data.x.names) == {"input_ids", "attention_mask"} and data.y is not None


def test_names_the_model_does_not_take_are_refused(workdir: Path) -> None:
    model = load_model("pair.py:make")
    with pytest.raises(SpecError, match=r"names input\(s\) \['token_ids'\]"):
        align_inputs(model, NamedInputs({"token_ids": torch.zeros(2, 3)}), "pair.py:make", "d.npz")
    with pytest.raises(SpecError, match="come before them"):
        align_inputs(model, NamedInputs({"attention_mask": torch.zeros(2, 3)}), "pair.py:make", "d.npz")


def test_eval_data_of_another_length_makes_that_axis_dynamic(workdir: Path) -> None:
    loaded = load_data("train.npz", eval_spec="held.npz")
    assert infer_dynamic_axes(loaded.calib.x, loaded.evaluation.x) == {"attention_mask": {1: "seq"},
                                                                      "input_ids": {1: "seq"}}


def test_shape_option_parsers() -> None:
    shapes = parse_input_shapes(["input_ids:1x32:int64", "input_ids:1x128:int64", "attention_mask:1x128:int64"])
    assert shapes.named["input_ids"] == ((1, 128), torch.int64) and shapes.dynamic == {"input_ids": {1: "seq"}}
    x = random_inputs(shapes, 3)
    assert x.tensors["input_ids"].shape == (3, 128) and bool((x.tensors["attention_mask"] == 1).all())
    assert parse_input_shapes(["3,8,8"]).per_sample == (3, 8, 8)
    assert parse_dynamic_axes(["input_ids:batch,seq", "pixels:batch,_,h,w"]) == {
        "input_ids": {0: "batch", 1: "seq"}, "pixels": {0: "batch", 2: "h", 3: "w"}}
    assert parse_axis_values(["seq=32,128"]) == {"seq": (32, 128)}
    for bad, call in ((["3,8", "x:1x2"], parse_input_shapes), (["ids:1x4:int8"], parse_input_shapes),
                      (["ids:seq,batch"], parse_dynamic_axes), (["seq=0"], parse_axis_values)):
        with pytest.raises(ValueError):
            call(bad)
    # batch on another axis failed only after the export; now before any work
    with pytest.raises(ValueError, match=r"'input:batch,batch': batch names axis 0 only; give axis 1 a name of its"):
        parse_dynamic_axes(["input:batch,batch"])


def test_export_with_named_shapes_and_dynamic_axes(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    code = run(["export", "pair.py:make", "--out", "pair.onnx", "--input-shape", "input_ids:1x16:int64",
                "--input-shape", "attention_mask:1x16:int64", "--dynamic-axes", "input_ids:batch,seq",
                "--dynamic-axes", "attention_mask:batch,seq", "--json", "-q"])
    assert code == 0, capsys.readouterr().err
    record = json.loads(capsys.readouterr().out)
    assert record["export"]["input_names"] == ["input_ids", "attention_mask"]
    assert record["parity"]["batch_sizes"] == [1, 16, 16]  # the last check at half the sequence length


def test_bad_named_shape_is_a_usage_error(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    code = run(["export", "pair.py:make", "--out", "p.onnx", "--input-shape", "input_ids:1xq:int64"])
    assert code == 2 and "--input-shape" in capsys.readouterr().err and not Path("p.onnx").exists()


def test_run_two_inputs_end_to_end_with_latency_per_shape(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    code = run(["run", "pair.py:make", "--data", "train.npz", "--eval-data", "held.npz", "-m", "factorize",
                "--mac-ratio", "0.6", "--batch", "1,4", "--axis-values", "seq=4,8", "--allow-data-mismatch",
                "--out", "r", "-q", *QUICK])
    assert code == 0, capsys.readouterr().err
    case = json.loads(Path("r/report.json").read_text())["cases"][0]
    cells = {(lat["model"], lat["batch_size"], lat["shape"]) for lat in case["bench"]["latency"]}
    models = {v["label"] for v in case["variants"]}
    assert models == {"original", "factorize", "original.int8", "factorize.int8"}
    assert cells == {(m, b, f"seq={s}") for m in models for b in (1, 4) for s in (4, 8)}
    fp32 = [v for v in case["variants"] if not v["label"].endswith(".int8")]
    assert all(v["export"]["dynamic_axes"]["input_ids"] == {"0": "batch", "1": "seq"} for v in fp32)
    assert all(len(v["parity"]["batch_sizes"]) == 3 for v in fp32)  # two batch sizes, then half the length
    assert "1 seq=4" in Path("r/report.md").read_text()


STRUCTURED = """
import torch
from torch import nn


class Boxes(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
        self.boxes = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, batch):
        return self.head(self.image(batch["image"]).mean((2, 3)) + self.boxes(batch["boxes"]))


class Pairs(Boxes):
    def forward(self, inputs):
        image, boxes = inputs
        return self.head(self.image(image).mean((2, 3)) + self.boxes(boxes))


def boxes():
    torch.manual_seed(0)
    return Boxes()


def pairs():
    torch.manual_seed(0)
    return Pairs()
"""


@pytest.mark.parametrize("factory, keys", [("boxes", ("image", "boxes")), ("pairs", ("inputs_0", "inputs_1"))])
def test_forward_taking_a_dict_or_tuple_gets_one_graph_input_per_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture, factory: str,
                                                                       keys: tuple[str, str]) -> None:
    (tmp_path / "structured.py").write_text(STRUCTURED)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", **{keys[0]: rng.standard_normal((40, 1, 6, 6)).astype(np.float32),
                                     keys[1]: rng.standard_normal((40, 4)).astype(np.float32)})
    monkeypatch.chdir(tmp_path)
    code = run(["run", f"structured.py:{factory}", "--data", "d.npz", "-m", "factorize", "--mac-ratio", "0.8",
                "--batch", "2", "--no-int8", "--out", "r", "-q", *QUICK])
    assert code == 0, capsys.readouterr().err
    case = json.loads(Path("r/report.json").read_text())["cases"][0]
    assert all(v["export"]["input_names"] == list(keys) for v in case["variants"])
    assert all(v["parity"]["passed"] for v in case["variants"])


def test_tune_takes_a_model_with_two_named_inputs(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    """The baselines (INT8 with accuracy control included) and a candidate are judged on named held-out inputs."""
    code = run(["tune", "pair.py:make", "--data", "train.npz", "--eval-data", "held.npz", "--allow-data-mismatch",
                "--min-agreement", "0.5", "-m", "factorize", "--grid", "0.5", "--batch", "1", "--out", "t",
                "--screen-seconds", "0.02", "--cache-dir", "cache", "--workers", "1", *QUICK, "-q"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(Path("t/report.json").read_text())
    labels = {c["label"] for c in report["candidates"]}
    assert {"original", "original.int8"} <= labels and any(label.startswith("factorize") for label in labels)
    assert "Traceback" not in captured.err


def test_run_with_fixed_shapes_on_a_dynamic_sequence_axis(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    """Fixing the batch and the sequence for a phone leaves nothing symbolic to time at other lengths."""
    code = run(["run", "pair.py:make", "--data", "train.npz", "--eval-data", "held.npz", "-m", "factorize",
                "--mac-ratio", "0.8", "--dynamic-axes", "input_ids:batch,seq", "--dynamic-axes",
                "attention_mask:batch,seq", "--fixed-shapes", "batch=1,seq=8", "--batch", "1", "--no-int8",
                "--allow-data-mismatch", "--out", "fixed", *QUICK, "-q"])
    assert code == 0, capsys.readouterr().err
    report = json.loads(Path("fixed/report.json").read_text())
    rows = report["cases"][0]["bench"]["latency"]
    assert rows and all(r["batch_size"] == 1 and r["shape"] == "" for r in rows)


def test_random_calibration_of_integer_inputs_is_refused_before_writing(workdir: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    code = run(["export", "pair.py:make", "--out", "m.onnx", "--input-shape", "input_ids:1x16:int64",
                "--input-shape", "attention_mask:1x16:int64", "--int8", "--allow-random-calibration"])
    err = capsys.readouterr().err
    assert code == 2 and "integer input(s) input_ids, attention_mask" in err and "Traceback" not in err
    assert not Path("m.onnx").exists() and not Path("m.int8.onnx").exists()


@pytest.mark.parametrize("extra, culprit", [
    (["--dynamic-axes", "input_idz:batch,seq"], "--dynamic-axes names input(s) ['input_idz']"),
    (["--fixed-shapes", "input_idz=1x8"], "--fixed-shapes names input(s) ['input_idz']"),
    (["--fixed-shapes", "sequence=8"], "--fixed-shapes names dimension(s) ['sequence']"),
])
def test_misspelt_input_or_dimension_names_are_usage_errors_before_export(workdir: Path, capsys: pytest.CaptureFixture,
                                                                         extra: list[str], culprit: str) -> None:
    code = run(["export", "pair.py:make", "--out", "m.onnx", "--data", "train.npz", *extra])
    err = capsys.readouterr().err
    assert code == 2 and culprit in err and "Traceback" not in err, err
    assert not Path("m.onnx").exists()
    code = run(["run", "pair.py:make", "--data", "train.npz", "-m", "factorize", "--allow-data-mismatch",
                "--out", "r", *extra])
    err = capsys.readouterr().err
    assert code == 2 and culprit in err and not Path("r").exists(), err


def test_data_without_an_array_the_forward_needs_names_the_file(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    held = np.load("held.npz")
    np.savez("ids_only.npz", input_ids=held["input_ids"], y=held["y"])
    code = run(["run", "pair.py:make", "--data", "ids_only.npz", "-m", "factorize", "--out", "r"])
    err = capsys.readouterr().err
    assert code == 2 and "ids_only.npz has no array for ['attention_mask']" in err and not Path("r").exists(), err
