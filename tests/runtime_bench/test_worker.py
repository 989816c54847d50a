"""The worker: interleaved timing of all models in one process, provider read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from minreal.runtime_bench.inputs import input_specs
from minreal.runtime_bench.providers import available_providers
from minreal.runtime_bench.worker import WorkerJob, job_from_dict, run_job


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
    subprocess.run([sys.executable, "-m", "minreal.runtime_bench.worker", str(job_path), str(result_path)], check=True,
                   env=env)
    result = json.loads(result_path.read_text())
    assert result["status"] == "ok" and result["pid"] != os.getpid()
    assert len(result["latencies_ms"]["reference"]) == 5


def test_benchmark_processes_never_import_torch() -> None:
    code = "import sys, runtime_bench, minreal.runtime_bench.worker; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_worker_module_does_not_import_onnx() -> None:
    code = "import sys, minreal.runtime_bench.worker; print('onnx' in sys.modules, 'ml_dtypes' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False False"


def test_job_with_input_specs_round_trips_through_json(reference_model: Path) -> None:
    job = _job([reference_model] * 2, names=["a", "b"], specs=[input_specs(reference_model)] * 2)
    again = job_from_dict(json.loads(json.dumps(asdict(job))))
    assert again == job
    assert isinstance(again.specs[1][0].shape, tuple)


def test_worker_given_input_specs_times_without_importing_onnx(tmp_path: Path, reference_model: Path) -> None:
    job_path, result_path = tmp_path / "job.json", tmp_path / "result.json"
    job_path.write_text(json.dumps(asdict(_job([reference_model], min_runs=4, specs=[input_specs(reference_model)]))))
    code = "import sys; from minreal.runtime_bench.worker import main; print(main(sys.argv[1:]), 'onnx' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code, str(job_path), str(result_path)], capture_output=True,
                          text=True, check=True, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert done.stdout.strip() == "0 False"
    assert len(json.loads(result_path.read_text())["latencies_ms"]["reference"]) == 4


def test_a_shared_pool_job_times_every_model_in_a_fresh_process(tmp_path: Path, reference_model: Path,
                                                                perturbed_model: Path) -> None:
    job = _job([reference_model, perturbed_model], threads=2, min_runs=6, shared_pool=True)
    assert job_from_dict(json.loads(json.dumps(asdict(job)))) == job
    job_path, result_path = tmp_path / "job.json", tmp_path / "result.json"
    job_path.write_text(json.dumps(asdict(job)))
    subprocess.run([sys.executable, "-m", "minreal.runtime_bench.worker", str(job_path), str(result_path)], check=True,
                   env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    result = json.loads(result_path.read_text())
    assert result["status"] == "ok"
    assert {name: len(v) for name, v in result["latencies_ms"].items()} == {"reference": 6, "perturbed": 6}


class _SlowFirstRun:
    """A session whose creation and first call are slow, like a TensorRT session building its engine."""

    def __init__(self, inner, build_s: float) -> None:
        self.inner, self.build_s, self.calls = inner, build_s, 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def run(self, outputs, feeds):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.build_s)
        return self.inner.run(outputs, feeds)


def test_engine_build_is_timed_apart_from_the_latency(reference_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import minreal.runtime_bench.worker as worker

    real, seen = worker.create_session, []

    def fake(path, provider, threads, provider_options=None, shared_pool=False):
        seen.append(provider_options)
        time.sleep(0.3)
        return _SlowFirstRun(real(path, provider, threads), build_s=0.25)

    monkeypatch.setattr(worker, "create_session", fake)
    job = _job([reference_model], provider_options=[{"trt_fp16_enable": "1"}], min_runs=20)
    result = run_job(job)
    assert seen == [{"trt_fp16_enable": "1"}]  # the job's options reach the session factory
    assert result.session_s["reference"] >= 0.3 and result.first_run_ms["reference"] >= 250
    assert len(result.latencies_ms["reference"]) == 20 and max(result.latencies_ms["reference"]) < 250


def test_io_binding_times_device_resident_calls_beside_host_copies(reference_model: Path) -> None:
    result = run_job(_job([reference_model], io_binding=True, min_runs=12))
    assert result.status == "ok"
    assert len(result.latencies_ms["reference"]) == 12 and len(result.device_latencies_ms["reference"]) == 12
    assert min(result.device_latencies_ms["reference"]) > 0


def test_device_runner_computes_what_run_computes(reference_model: Path) -> None:
    import numpy as np

    from minreal.runtime_bench.sessions import create_session
    from minreal.runtime_bench.worker import device_runner

    session = create_session(reference_model)
    name = session.get_inputs()[0].name
    feeds = {name: np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    binding = device_runner(session, feeds, ("cpu", 0))()
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], session.run(None, feeds)[0])


def test_a_shared_pool_job_with_placement_is_refused(reference_model: Path) -> None:
    from minreal.runtime_bench.errors import BenchInputError

    with pytest.raises(BenchInputError, match="measure placement in a job without shared_pool") as err:
        _job([reference_model], shared_pool=True, placement=True)
    assert err.value.fields == ()  # a programming error of the caller, not an option the user gave
    assert _job([reference_model], shared_pool=True).shared_pool and _job([reference_model], placement=True).placement
