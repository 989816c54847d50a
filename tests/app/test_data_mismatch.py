"""The data-mismatch check: the original's accuracy on labelled data against chance; run/tune stop, compress warns."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.app.mismatch import DataMismatchError, chance_threshold, check_data, is_conclusive, require_match
from minreal.compress.core.data import Dataset

QUICK_RUN = ["--batch", "1", "--no-int8", "--min-seconds", "0.05", "--repeats", "1", "-q"]


def test_threshold_is_the_wider_of_the_relative_margin_and_three_standard_errors() -> None:
    assert chance_threshold(0.1, 10_000) == pytest.approx(0.15)  # 1.5x chance beats 3 SE (0.009)
    assert chance_threshold(0.1, 100) == pytest.approx(0.1 + 3 * 0.03)  # small sample: 3 SE (0.09) is wider
    assert chance_threshold(0.5, 10_000) == pytest.approx(0.55)  # binary: the margin is capped at 5 points
    assert chance_threshold(0.001, 2048) == pytest.approx(0.001 + 3 * math.sqrt(0.001 * 0.999 / 2048))
    assert not is_conclusive(0.5, 36) and is_conclusive(0.5, 37)  # 3 SE reach halfway to 100% at n <= 36


def _constant_classifier(k: int, answer: int) -> nn.Module:
    net = nn.Linear(4, k)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.copy_(torch.nn.functional.one_hot(torch.tensor(answer), k).float())
    return net


def test_constant_answers_are_near_chance_even_when_the_data_is_sorted_by_class() -> None:
    # 4 classes of 300 samples in class order (as an image folder lists them): the check samples at random, so
    # a model that always answers class 0 is not judged on class 0 alone
    data = Dataset(torch.randn(1200, 4), torch.arange(4).repeat_interleave(300))
    check = check_data(_constant_classifier(4, 0), {"calibration": data})
    assert check.verdict == "near_chance" and check.samples == 512 and check.num_classes == 4
    assert check.chance == 0.25 and check.threshold == pytest.approx(0.25 + 3 * math.sqrt(0.25 * 0.75 / 512))
    assert check.accuracy == pytest.approx(0.25, abs=0.06)
    with pytest.raises(DataMismatchError, match=r"at chance level .*--allow-data-mismatch") as info:
        require_match(check, allow=False)
    assert "\n" not in str(info.value)
    assert require_match(check, allow=True).allowed


def test_labels_the_model_cannot_output_are_named() -> None:
    data = Dataset(torch.randn(200, 4), torch.full((200,), 7))
    check = check_data(_constant_classifier(3, 0), {"evaluation": data})
    assert check.near_chance and check.labels_out_of_range == 200
    assert "200 of the labels lie outside the model's 3 outputs (0-2)" in check.message()


@pytest.mark.parametrize("data, model, verdict, reason", [
    (Dataset(torch.randn(50, 4)), nn.Linear(4, 3), "skipped", "no integer class labels"),
    (Dataset(torch.randn(50, 4), torch.randn(50)), nn.Linear(4, 3), "skipped", "no integer class labels"),
    (Dataset(torch.randn(50, 4), torch.zeros(50, dtype=torch.int64)), nn.Linear(4, 1), "skipped", "not class scores"),
    (Dataset(torch.randn(8, 4), torch.arange(8) % 2), nn.Linear(4, 2), "inconclusive", "too few"),
])
def test_checks_that_cannot_judge_say_why_and_never_stop(data: Dataset, model: nn.Module, verdict: str,
                                                         reason: str) -> None:
    check = check_data(model, {"calibration": data})
    assert check.verdict == verdict and reason in check.reason
    assert require_match(check, allow=False) is check


def test_an_accurate_classifier_matches(workdir: Path) -> None:
    from minreal.app.data import load_data
    from minreal.app.models import load_model

    data = load_data("digits-flat")
    check = check_data(load_model("net.py:centroid"), {"evaluation": data.evaluation, "calibration": data.calib})
    assert check.verdict == "match" and check.accuracy > 0.85 and check.data == ["evaluation", "calibration"]


def test_run_stops_on_chance_accuracy_before_any_work(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["run", "net.py:constant", "-m", "svd", "--mac-ratio", "0.5", "--data", "digits-flat",
                            "--out", "runs/a", *QUICK_RUN])
    assert code == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("minreal: error: the original model's accuracy on the labelled evaluation and")
    assert "at chance level" in line and "--image-size" in line and "--allow-data-mismatch" in line
    assert not Path("runs/a").exists() and not list(Path("runs").glob(".a*"))


def test_run_goes_on_with_allow_data_mismatch_and_records_it(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["run", "net.py:constant", "-m", "svd", "--mac-ratio", "0.5", "--data", "digits-flat",
                            "--out", "runs/b", "--allow-data-mismatch", *QUICK_RUN])
    assert code == 0, err
    assert "WARNING" in err and "at chance level" in err
    case = json.loads(Path("runs/b/report.json").read_text())["cases"][0]
    assert case["data_check"]["verdict"] == "near_chance" and case["data_check"]["allowed"] is True
    assert case["data_check"]["num_classes"] == 10 and case["data_check"]["accuracy"] <= 0.16
    assert case["warnings"][0].startswith("--allow-data-mismatch: the original model's accuracy")
    assert "at chance level" in Path("runs/b/report.md").read_text()


def test_compress_warns_and_records_but_goes_on(workdir: Path, run_cli: Callable) -> None:
    args = ["-m", "svd", "--mac-ratio", "0.5", "--data", "digits-flat", "-q"]
    code, _, err = run_cli(["compress", "net.py:constant", *args, "--out", "c.pt2", "--report", "c.json"])
    assert code == 0, err
    assert "WARNING: data mismatch: the original model's accuracy" in err
    assert json.loads(Path("c.json").read_text())["measured"]["data_check"]["verdict"] == "near_chance"
    code, _, err = run_cli(["compress", "net.py:centroid", *args, "--out", "m.pt2", "--report", "m.json"])
    assert code == 0, err
    assert "data mismatch" not in err
    assert json.loads(Path("m.json").read_text())["measured"]["data_check"]["verdict"] == "match"


def test_tune_stops_on_chance_accuracy(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["tune", "net.py:constant", "--data", "digits-flat", "--max-accuracy-drop", "1",
                            "--out", "t", "--cache-dir", "cache", "-q"])
    assert code == 2 and "at chance level" in err and "--allow-data-mismatch" in err
    assert not Path("t").exists()
