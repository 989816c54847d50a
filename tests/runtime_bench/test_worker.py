"""The worker: interleaved timing of all models in one process, provider read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from runtime_bench.providers import available_providers
from runtime_bench.worker import WorkerJob, run_job


def _job(paths: list[Path], provider: str = "CPUExecutionProvider", **overrides) -> WorkerJob:
    fields = dict(
        names=[p.stem for p in paths], paths=[str(p) for p in paths], provider=provider, batch_size=3,
        threads=1, warmup=2, min_runs=15, min_seconds=0.0, seed=0,
    )
    return WorkerJob(**{**fields, **overrides})


def test_run_job_times_every_model(reference_model: Path, perturbed_model: Path) -> None:
    result = run_job(_job([reference_model, perturbed_model]))
    assert result.status == "ok" and result.reason is None
    assert result.pid == os.getpid()
    assert result.actual_providers[0] == "CPUExecutionProvider"
    assert sorted(result.latencies_ms) == ["perturbed", "reference"]
    assert all(len(v) == 15 and min(v) > 0 for v in result.latencies_ms.values())


@pytest.mark.skipif("cuda" in available_providers(), reason="CUDA is built into this onnxruntime")
@pytest.mark.filterwarnings("ignore:Specified provider")
def test_fallback_is_reported_not_timed(reference_model: Path) -> None:
    result = run_job(_job([reference_model], provider="CUDAExecutionProvider"))
    assert result.status == "unavailable"
    assert result.latencies_ms == {}
    assert "CUDAExecutionProvider" in result.reason and result.actual_providers == ["CPUExecutionProvider"]


def test_module_entry_point_runs_in_its_own_process(tmp_path: Path, reference_model: Path) -> None:
    job_path, result_path = tmp_path / "job.json", tmp_path / "result.json"
    job_path.write_text(json.dumps(asdict(_job([reference_model], min_runs=5))))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    subprocess.run([sys.executable, "-m", "runtime_bench.worker", str(job_path), str(result_path)], check=True, env=env)
    result = json.loads(result_path.read_text())
    assert result["status"] == "ok" and result["pid"] != os.getpid()
    assert len(result["latencies_ms"]["reference"]) == 5


def test_benchmark_processes_never_import_torch() -> None:
    code = "import sys, runtime_bench, runtime_bench.worker; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
