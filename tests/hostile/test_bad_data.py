"""Bad data is refused the same way by every command that reads it: labels outside the model's outputs, NaN/inf
inputs, no samples. One line naming the file, exit 2, nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from minreal.app.callables import SpecError
from minreal.app.models import refuse_labels_outside
from tests.hostile.test_inputs import refused

COMMANDS = {
    "compress": ["compress", "net.py:make", "-m", "svd", "--data", "{data}", "--out", "o.pt2", "-q"],
    "run": ["run", "net.py:make", "-m", "svd", "--data", "{data}", "--out", "runs/a", "-q"],
    "tune": ["tune", "net.py:make", "-m", "svd", "--data", "{data}", "--out", "runs/t", "--max-accuracy-drop", "5",
             "-q"],
    "export": ["export", "net.py:make", "--data", "{data}", "--out", "e.onnx", "-q"],
}


def _labels_outside(path: Path) -> tuple[str, ...]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, size=80)
    y[[5, 40]] = (10, -1)  # two labels the 10 outputs of net.py:make cannot predict: 10 and -1
    np.savez(path, x=rng.normal(size=(80, 64)).astype(np.float32), y=y)
    return "d.npz", "lie outside the model's 10 outputs (0-9)"


def _nan_input(path: Path) -> tuple[str, ...]:
    x = np.zeros((40, 64), np.float32)
    x[7, 3] = np.inf
    np.savez(path, x=x, y=np.zeros(40, np.int64))
    return "d.npz", "'x'", "NaN/inf", "sample 7"


def _no_samples(path: Path) -> tuple[str, ...]:
    np.savez(path, x=np.zeros((0, 64), np.float32), y=np.zeros(0, np.int64))
    return "d.npz", "holds no samples"


BAD = {"labels_outside": _labels_outside, "nan_input": _nan_input, "no_samples": _no_samples}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_bad_data_alike(command: str, bad: str, workdir: Path, run_cli: Callable) -> None:
    culprits = BAD[bad](workdir / "d.npz")
    refused(run_cli, [a.format(data="d.npz") for a in COMMANDS[command]], *culprits)
    assert sorted(p.name for p in workdir.iterdir()) == ["d.npz", "net.py"]


def test_allow_data_mismatch_turns_the_labels_refusal_into_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """``run --allow-data-mismatch`` and ``tune --allow-data-mismatch`` go on (tests/export/test_mobile.py runs a
    5-output net on 10-class digits with it): the same line, as one WARNING, and no exception."""
    with caplog.at_level("WARNING", logger="minreal.app.models"):
        refuse_labels_outside(torch.zeros(2, 3), torch.tensor([0, 3, 2, -1, 7, 1]), "e.npz", allow=True)
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 1 and lines[0].startswith("e.npz: 3 of 6 labels (-1, 3, 7) lie outside the model's 3 outputs")
    assert "--allow-data-mismatch" in lines[0] and "\n" not in lines[0]


def test_rule_counts_and_names_the_labels_outside() -> None:
    scores = torch.zeros(2, 3)
    with pytest.raises(SpecError, match=r"^e\.npz: 3 of 6 labels \(-1, 3, 7\) lie outside the model's 3 outputs "
                                        r"\(0-2\); give class labels") as info:
        refuse_labels_outside(scores, torch.tensor([0, 3, 2, -1, 7, 1]), "e.npz")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("out, y", [
    (torch.zeros(2, 3), torch.tensor([0, 1, 2])),  # inside
    (torch.zeros(2, 3), None),  # no labels
    (torch.zeros(2, 3), torch.tensor([0.5, 9.0])),  # regression targets, not classes
    (torch.zeros(2, 1), torch.tensor([0, 5])),  # one output: not class scores
    (torch.zeros(2, 3, 4), torch.tensor([0, 5])),  # not (N, K)
    ((torch.zeros(2, 3),), torch.tensor([0, 5])),  # not a tensor
])
def test_rule_passes_what_is_not_a_class_label_outside(out: object, y: torch.Tensor | None) -> None:
    refuse_labels_outside(out, y, "d.npz")
