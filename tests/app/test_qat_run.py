"""``--recover-int8``: a run writes the quantisation-aware INT8 copy next to a post-training one of the same weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

QUICK_BENCH = ["--min-seconds", "0.05", "--repeats", "1"]
SVD = ["net.py:make", "--method", "svd", "--mac-ratio", "0.5"]


def test_run_reports_post_training_and_quantisation_aware_int8_side_by_side(workdir: Path,
                                                                            run_cli: Callable) -> None:
    args = ["run", "--allow-data-mismatch", *SVD, "--data", "digits-flat", "--out", "runs/r", "--batch", "1",
            "--recover-epochs", "1", "--recover-int8", *QUICK_BENCH]
    code, out, err = run_cli(args)
    assert code == 0, err
    case = json.loads(Path("runs/r/report.json").read_text())["cases"][0]
    variants = {v["label"]: v for v in case["variants"]}
    assert list(variants) == ["original", "svd", "original.int8", "svd.int8", "svd.ptq.int8"]
    ranges = variants["svd"]["compression"]["recovery"]["activation_ranges"]
    qat, ptq = variants["svd.int8"]["quantization"], variants["svd.ptq.int8"]["quantization"]
    assert (qat["range_source"], qat["trained_ranges"], qat["untrained_modules"]) == ("trained", len(ranges), [])
    assert (ptq["range_source"], ptq["trained_ranges"], ptq["fp32_path"]) == ("calibrated", 0, qat["fp32_path"])
    assert variants["original.int8"]["quantization"]["range_source"] == "calibrated"
    assert {m["model"] for m in case["bench"]["metrics"]} >= {"svd.int8", "svd.ptq.int8"}
    md = Path("runs/r/report.md").read_text()
    assert "## INT8 of the quantisation-aware weights: calibrated afresh vs trained" in md
    assert "| svd.ptq.int8 | svd.int8 |" in md
    assert "**svd.int8**: INT8 (quantisation-aware, trained ranges" in md
    assert "**svd.ptq.int8**: INT8 (post-training, calibrated)" in md
    assert "INT8 of the same quantisation-aware weights: ranges calibrated afresh vs trained" in out


@pytest.mark.parametrize(("extra", "message"), [
    ([], "--recover-int8 needs a recovery budget"),
    (["--recover-epochs", "1", "--no-int8"], "--recover-int8 trains ranges for static INT8"),
    (["--recover-epochs", "1", "--quant-mode", "dynamic"], "--recover-int8 trains ranges for static INT8"),
])
def test_run_refuses_recover_int8_without_what_it_needs(workdir: Path, run_cli: Callable,
                                                        extra: list[str], message: str) -> None:
    code, _, err = run_cli(["run", "--allow-data-mismatch", *SVD, "--data", "digits-flat", "--out", "runs/r",
                            "--recover-int8", *extra])
    assert code == 2 and message in err and not Path("runs/r").exists()


@pytest.mark.parametrize("providers", ["cuda", "cpu,tensorrt"])
def test_compress_refuses_recover_int8_first(workdir: Path, run_cli: Callable, monkeypatch: pytest.MonkeyPatch,
                                            providers: str) -> None:
    """compress writes a torch program, so INT8 ranges trained by --recover-int8 could never be used: refused
    before any other check of the recovery options (even without a recovery budget) and before any work."""
    import minreal.export.int8.target as int8_target

    seen, resolve = [], int8_target.resolve_target
    monkeypatch.setattr(int8_target, "resolve_target", lambda name: seen.append(name) or resolve(name))
    for budget in (["--recover-epochs", "1"], []):
        code, _, err = run_cli(["compress", *SVD, "--data", "digits-flat", *budget, "--recover-int8",
                                "--providers", providers])
        assert code == 2 and "use `minreal run ... --recover-int8`" in err and "needs a recovery budget" not in err
    assert seen == [] and not Path("compressed.pt2").exists()
