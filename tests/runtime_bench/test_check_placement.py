"""Release gate on where nodes ran (--min-on-provider) and on the hardware of the baseline
(--allow-hardware-mismatch), through check_report and the `minreal check` command."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from minreal.facts import PROVIDERS
from minreal.runtime_bench import SCHEMA_VERSION, check_report, format_check
from minreal.runtime_bench.errors import CheckError
from minreal.runtime_bench.placement import parse_profile

FIXTURE = Path(__file__).parent / "data" / "cuda_fallback_profile.json"  # hand-made, ORT's event format
CPU, CUDA = PROVIDERS["cpu"], PROVIDERS["cuda"]
GPU = {"name": "NVIDIA H200", "memory_mib": 143771, "driver_version": "570.86.15"}


def _placement(provider: str) -> dict[str, Any]:
    """The fixture's CUDA session (2 of 5 nodes on CUDA) for ``cuda``; for ``cpu``, the same with every node on CPU."""
    events = json.loads(FIXTURE.read_text())
    if provider == "cuda":
        return asdict(parse_profile(events, CUDA))
    return asdict(parse_profile([{**e, "args": {**e["args"], "provider": CPU}} for e in events], CPU))


def report(providers: tuple[str, ...] = ("cpu", "cuda"), cpu: str = "test cpu", gpus: list | None = None,
           unavailable: dict[str, str] | None = None, placement: bool = True,
           flags: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A bench report dict for models 'orig' and 'small' on ``providers`` at batch 1; ``flags``: the int8
    instruction sets recorded (None: none recorded, as in reports from before they were)."""
    ran = [p for p in providers if p not in (unavailable or {})]
    cells = [(m, p) for m in ("orig", "small") for p in ran]
    latency = [{"model": m, "provider": p, "batch_size": 1, "stats": {"p50_ms": 1.0}, "process_p50_ms": [1.0]}
               for m, p in cells]
    isa = {} if flags is None else {"cpu_flags": list(flags), "cpu_flags_source": "/proc/cpuinfo"}
    return {"schema_version": SCHEMA_VERSION, "environment": {"cpu_model": cpu, "gpus": gpus, **isa},
            "config": {"providers": list(providers), "batch_sizes": [1]},
            "models": [{"name": "orig"}, {"name": "small"}], "latency": latency, "ratios": [], "metrics": [],
            "unavailable": [{"provider": p, "requested": p, "reason": r} for p, r in (unavailable or {}).items()],
            "placement": [{"model": m, "provider": p, "placement": _placement(p)} for m, p in cells] if placement
            else []}


# --- --min-on-provider ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("allowed", "passed"), [(0.99, False), (0.41, False), (0.4, True), (0.1, True)])
def test_share_on_provider_gates_both_sides_of_the_threshold(allowed: float, passed: bool) -> None:
    result = check_report(report(), min_on_provider=allowed)
    on_cuda = [c for c in result.criteria if c.provider == "cuda"]
    assert [c.name for c in result.criteria] == ["on_provider_share"] * 4
    assert [c.model for c in on_cuda] == ["orig", "small"] and all(c.measured == pytest.approx(0.4) for c in on_cuda)
    assert all(c.passed == passed for c in on_cuda) and result.passed == passed
    assert all(c.passed and c.measured == 1.0 for c in result.criteria if c.provider == "cpu")


def test_failing_share_names_measured_allowed_and_the_fallen_back_nodes() -> None:
    text = format_check(check_report(report(("cuda",)), min_on_provider=0.99))
    line = text.splitlines()[0]
    assert line.startswith("FAIL  on_provider_share  orig cuda: 0.4 (allowed 0.99)")
    assert f"3 of 5 nodes not on {CUDA}: shape1 (Shape on {CPU}), topk1 (TopK on {CPU}), fc (Gemm on {CPU})" in line
    assert text.endswith("release gate FAILED")


def test_missing_placement_fails_or_is_an_error() -> None:
    unavailable = check_report(report(unavailable={"cuda": "not built in"}), min_on_provider=0.99)
    (missing,) = [c for c in unavailable.criteria if not c.passed and c.model == "orig"]
    assert missing.provider == "cuda" and "provider cuda was unavailable (not built in)" in missing.note
    with pytest.raises(CheckError, match=r"min_on_provider \(--min-on-provider\) given but the report records no "
                                         "placement"):
        check_report(report(placement=False), min_on_provider=0.99)
    with pytest.raises(CheckError, match=r"min_on_provider \(--min-on-provider\) is a share within 0..1, got 99"):
        check_report(report(), min_on_provider=99)


def test_cli_min_on_provider(tmp_path: Path, run_cli: Callable) -> None:
    (tmp_path / "r.json").write_text(json.dumps(report(("cuda",))))
    code, out, err = run_cli(["check", str(tmp_path / "r.json"), "--min-on-provider", "0.99"])
    assert code == 1 and "FAIL  on_provider_share  orig cuda: 0.4 (allowed 0.99)" in out
    assert "FAILED" in err and "shape1 (Shape on" in err
    code, out, _ = run_cli(["check", str(tmp_path / "r.json"), "--min-on-provider", "0.4"])
    assert code == 0 and "release gate passed" in out


# --- hardware of the baseline -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("ours", "base", "differs"), [
    (dict(), dict(cpu="other cpu"), "CPU 'other cpu' in the baseline, 'test cpu' in the report"),
    (dict(), dict(gpus=[GPU]), "GPUs 'NVIDIA H200' in the baseline, none in the report"),
    (dict(gpus=[GPU]), dict(gpus=[GPU, {**GPU, "name": "NVIDIA A100"}]),
     "GPUs 'NVIDIA H200, NVIDIA A100' in the baseline, 'NVIDIA H200' in the report"),
    # the same CPU model name with other int8 instruction sets (a VM that hides AVX-512 VNNI): INT8 kernels differ
    (dict(flags=("avx2",)), dict(flags=("avx2", "avx512f", "avx512_vnni")),
     "int8 instruction sets differ: avx512f, avx512_vnni only in the baseline"),
    (dict(cpu="other cpu", flags=("avx2", "amx_int8")), dict(flags=("avx2",)),
     "CPU 'test cpu' in the baseline, 'other cpu' in the report; int8 instruction sets differ: amx_int8 only in "
     "the report"),
])
def test_baseline_from_other_hardware_fails_unless_allowed(ours: dict, base: dict, differs: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    now = report(**ours)
    refused = check_report(now, baseline=report(**base), max_regression=10.0)
    (hardware,) = [c for c in refused.criteria if c.name == "same_hardware"]
    assert not refused.passed and not hardware.passed and differs in hardware.note
    assert "--allow-hardware-mismatch" in format_check(refused).splitlines()[0]
    assert all(c.passed for c in refused.criteria if c.name != "same_hardware")  # latencies alone would pass
    with caplog.at_level(logging.WARNING, logger="minreal.runtime_bench.check"):
        allowed = check_report(now, baseline=report(**base), max_regression=10.0, allow_hardware_mismatch=True)
    assert allowed.passed and differs in caplog.text
    assert [c.passed for c in allowed.criteria if c.name == "same_hardware"] == [True]


def test_same_hardware_adds_no_criterion() -> None:
    result = check_report(report(gpus=[GPU]), baseline=report(gpus=[GPU]), max_regression=10.0)
    assert result.passed and "same_hardware" not in {c.name for c in result.criteria}
    # instruction sets are compared only where both reports recorded them
    older = check_report(report(flags=("avx2",)), baseline=report(), max_regression=10.0)
    assert older.passed and "same_hardware" not in {c.name for c in older.criteria}


def test_cli_refuses_a_baseline_from_another_cpu(tmp_path: Path, run_cli: Callable,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "r.json").write_text(json.dumps(report()))
    (tmp_path / "base.json").write_text(json.dumps(report(cpu="other cpu")))
    args = ["check", str(tmp_path / "r.json"), "--baseline", str(tmp_path / "base.json"), "--max-regression", "10"]
    code, out, err = run_cli(args)
    assert code == 1 and "FAIL  same_hardware  baseline ran on different hardware" in out
    assert "same_hardware baseline ran on different hardware (CPU 'other cpu'" in err
    with caplog.at_level(logging.WARNING, logger="minreal.runtime_bench.check"):
        code, out, _ = run_cli([*args, "--allow-hardware-mismatch"])
    assert code == 0 and "PASS  same_hardware  different hardware" in out and "release gate passed" in out
    assert "ran on different hardware" in caplog.text  # the warning stays


def test_tune_report_gates_the_chosen_models_placement(tmp_path: Path) -> None:
    from minreal.app.gate import check_reports

    bench = json.loads(json.dumps(report(("cuda",))).replace('"orig"', '"original"'))
    (tmp_path / "t.json").write_text(json.dumps({"kind": "tune", "chosen": "small", "confirm": bench}))
    [(_, result)] = check_reports(tmp_path / "t.json", None, None, None, None, None, min_on_provider=0.3)
    assert result.passed and [(c.model, c.measured) for c in result.criteria] == [("original", 0.4), ("chosen", 0.4)]
