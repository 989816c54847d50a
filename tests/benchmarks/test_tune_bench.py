"""benchmarks/tune.py's stage clock: a stage starts at the last progress line that announces it (the race's structure
screen measures the baselines' quality inside the search, with the words the final measurement uses), live and
when a record's stages are read again from its progress.log."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import tune as tb

LOG = """\
     1.0 [tune] baselines: original fp32 and INT8 (cpu-avx2)
    20.0 [tune] measuring 2 files with ONNX Runtime on 2000 held-out samples
   100.0 [tune] measuring 9 files with ONNX Runtime on 2000 held-out samples
   110.0 [tune] screening 9 files (0.25 s per model, 1 process)
   130.0 [tune] confirming 3 files (front and baselines) with the release protocol
"""


def test_stages_start_at_the_last_line_that_announces_them(tmp_path: Path) -> None:
    clock = tb.StageClock("[t]", tmp_path / "live.log")
    try:
        for line in LOG.splitlines():
            t, _, text = line.strip().partition(" ")
            clock.now = lambda t=float(t): t  # the line's own time
            clock(text)
        clock.marks.update(accuracy_control=5.0, search=8.0)
    finally:
        clock.close()
    assert clock.stages(150.0) == {"baselines": 5.0, "accuracy_control": 3.0, "search": 92.0, "ort_quality": 10.0,
                                   "screen": 20.0, "confirm": 20.0}
    (tmp_path / "progress.log").write_text(LOG)
    first_line_marks = {"baselines": 5.0, "accuracy_control": 3.0, "search": 12.0, "ort_quality": 90.0,
                        "screen": 20.0, "confirm": 20.0}  # what a clock that kept the first line recorded
    run = {"folder": str(tmp_path), "wall_s": 150.0, "stage_s": first_line_marks}
    assert tb.restaged(run) == clock.stages(150.0)
    assert tb.restaged({**run, "folder": str(tmp_path / "absent")}) == first_line_marks
