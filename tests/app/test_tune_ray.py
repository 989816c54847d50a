"""`minreal tune --executor ray`: refused in one line without Ray; with Ray (a two-node cluster started here, one
node carrying the benchmark resource) the same tune chooses what the local executor chooses, and its benchmarks
run in a Ray task on that node, not in the driver nor beside the candidates."""

from __future__ import annotations

import _thread
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from minreal.app.cli import cli, run
from minreal.app.tune import Constraint, TuneConfig, TuneError
from minreal.app.tune import executor as executors

FACTORY = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))
    with torch.no_grad():  # rank-3 weights: truncated SVD keeps the outputs, so candidates meet the constraint
        for layer in (net[1], net[3]):
            u, s, v = torch.linalg.svd(layer.weight, full_matrices=False)
            layer.weight.copy_(u[:, :3] @ torch.diag(s[:3]) @ v[:3])
    return net
"""
TUNE = ["tune", "--allow-data-mismatch", "net.py:make", "--data", "digits-flat", "--min-agreement", "0.9",
        "-m", "svd", "--grid", "0.8,0.1", "--objective", "size", "--no-int8", "--screen-seconds", "0.02",
        "--min-seconds", "0.02", "--repeats", "1", "-q"]


def test_executor_ray_without_ray_is_one_line_naming_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "net.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as when it is not installed
    assert run([*TUNE, "--out", "t", "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["minreal: error: --executor ray needs Ray, which is not installed: "
                                        "pip install 'minreal[ray]'"]
    assert not Path("t").exists()  # refused before any work
    assert run([*TUNE, "--out", "t", "--executor", "ray", "--workers", "2"]) == 2
    assert "--workers is for --executor local" in capsys.readouterr().err
    assert run([*TUNE, "--out", "t", "--address", "auto"]) == 2
    assert "options of --executor ray" in capsys.readouterr().err


def test_a_candidate_file_the_driver_cannot_see_names_shared_storage(tmp_path: Path) -> None:
    """A worker on another machine wrote the cache entry where the driver cannot read it: say what to share."""
    from minreal.app.tune.candidate import CandidateResult, CandidateSpec
    from minreal.app.tune.orchestrate import _structural

    res = CandidateResult(CandidateSpec("svd", 0.5), "key", feasible=True,
                          files={"fp32": str(tmp_path / "elsewhere" / "model.onnx")})
    with pytest.raises(TuneError, match="--cache-dir must be on storage that every node mounts at the same path"):
        _structural([res], tmp_path, TuneConfig(Constraint(min_agreement=0.9), int8=False))
    assert not any(tmp_path.iterdir())  # nothing copied


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[tuple[Any, str]]:
    """A two-node Ray cluster started by this process: a head with 2 CPUs for the candidates, and a node without
    CPUs that is the target hardware (it alone has ``minreal_bench``); yields ``ray`` and that node's id."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'minreal[ray]')")
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 100 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False, **small})
    bench = cluster.add_node(num_cpus=0, resources={executors.BENCH_RESOURCE: 1}, **small)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield ray, bench.node_id
    ray.shutdown()
    cluster.shutdown()


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the choice depends on: every file with its feasibility and size, the probes, the chosen file."""
    return {"candidates": [(c["label"], c["feasible"], c["onnx_bytes"]) for c in report["candidates"]],
            "probes": [[(p["budget"], p["ok"]) for p in s["probes"]] for s in report["searches"]],
            "chosen": report["chosen"], "counts": report["counts"]}


def test_ray_tune_matches_local_and_benchmarks_on_the_resource_node(ray_cluster: tuple[Any, str], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ray, bench_node = ray_cluster
    (tmp_path / "net.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    made: list[executors.RayExecutor] = []

    class Recorded(executors.RayExecutor):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(executors, "RayExecutor", Recorded)
    local = CliRunner().invoke(cli, [*TUNE, "--out", "local", "--cache-dir", "cache-local", "--workers", "0"])
    assert local.exit_code == 0, local.output
    remote = CliRunner().invoke(cli, [*TUNE, "--out", "ray", "--cache-dir", "cache-ray", "--executor", "ray"])
    assert remote.exit_code == 0, remote.output
    a, b = (json.loads(Path(d, "report.json").read_text()) for d in ("local", "ray"))
    assert _summary(b) == _summary(a)
    assert [c["label"] for c in b["candidates"]] == ["original", "svd@0.8"] and b["chosen"] == "svd@0.8"
    assert b["counts"]["evaluated"] == 2 and b["counts"]["cached"] == 0  # computed on Ray workers, not reused
    assert any(Path("cache-ray").iterdir())  # the workers filled the candidate cache the driver named
    [executor] = made
    assert executor.bench_node == bench_node and executor.ran_on == [bench_node] * 2  # screening and confirmation
    assert {p["pid"] for p in b["measured_on"].values()}.isdisjoint({os.getpid()})  # in a Ray task, not the driver
    assert {p["pid"] for p in a["measured_on"].values()} == {os.getpid()}  # the local executor times here
    assert b["confirm"]["models"][0]["path"] == "models/original.onnx"  # the report names the tune's own files
    assert ray.is_initialized()  # the executor left the caller's connection open


def test_ray_executor_refuses_a_cluster_without_the_bench_resource(ray_cluster: tuple[Any, str]) -> None:
    ray, _ = ray_cluster
    with pytest.raises(TuneError, match=r"no live node of the Ray cluster has the resource 'gpu_box'.*--resources"):
        executors.RayExecutor(bench_resource="gpu_box")
    assert ray.is_initialized()  # the caller's connection is not closed by a refusal


def test_ctrl_c_cancels_outstanding_ray_tasks(ray_cluster: tuple[Any, str], tmp_path: Path) -> None:
    """Interrupted while waiting: a running job in Python code gets KeyboardInterrupt and unwinds (as a candidate
    removes its temporary folders), one stuck in C is killed after the grace, the queued one is dropped."""
    ray, _ = ray_cluster

    def hold(job: tuple[str, str]) -> None:
        how, marker = job
        if how == "sleep":
            time.sleep(60)  # in C: deaf to KeyboardInterrupt until it returns
        end = time.monotonic() + 60
        try:
            while time.monotonic() < end:
                pass
        except KeyboardInterrupt:
            Path(marker).write_text("unwound")
            raise

    executor = executors.RayExecutor()
    jobs = [(how, str(tmp_path / f"{i}.txt")) for i, how in enumerate(("spin", "sleep", "spin"))]
    timer = threading.Timer(4.0, _thread.interrupt_main)  # Ctrl-C while the driver waits for the jobs
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        executor.map(hold, jobs)  # two run (2 CPUs), the third waits
    refs = list(executor.pending)
    t0 = time.perf_counter()
    executor.close(abort=True)
    assert time.perf_counter() - t0 < executors.CANCEL_GRACE_S + 5  # the sleeper was killed, not waited for
    assert len(refs) == 3 and executor.pending == []
    for ref in refs:
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=30)
    assert (tmp_path / "0.txt").read_text() == "unwound" and not (tmp_path / "2.txt").exists()  # 2 never started
