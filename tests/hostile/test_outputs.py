"""Hostile use of outputs: colliding output paths, folders left by failed commands, unavailable providers,
two runs to one run directory."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minreal.runtime_bench import BenchConfig, ModelEntry, ProviderUnavailableError, run_benchmark
from minreal.runtime_bench.worker import WorkerResult

QUICK_BENCH = ["--min-seconds", "0", "--min-runs", "3", "--warmup", "1", "--repeats", "1", "--batch", "1"]
RUN = ["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--data", "digits-flat", "--batch", "1", "-q"]


@pytest.fixture
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """An onnxruntime build with only the CPU provider, whatever this machine has."""
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])


def linear_onnx(path: Path, seed: int) -> Path:
    """A one-Gemm ONNX model (8 features -> 4 classes, dynamic batch)."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


# --- two outputs of one command are the same file ------------------------------------------------------------

def test_compress_out_and_report_same_file_is_usage_error(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "digits-flat",
                            "--out", "same.json", "--report", "same.json"])
    assert code == 2 and "same file" in err and "Traceback" not in err
    assert not Path("same.json").exists()


def test_outputs_same_through_dotdot_and_symlink(workdir: Path, run_cli: Callable) -> None:
    Path("real").mkdir()
    Path("link").symlink_to("real")
    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "digits-flat",
                            "--out", "link/m.pt2", "--report", "real/sub/../m.pt2"])
    assert code == 2 and "link/m.pt2" in err and "same file" in err
    assert list(Path("real").iterdir()) == []


def test_bench_out_and_its_markdown_same_file(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["bench", "m.onnx", "--out", "b.md"])
    assert code == 2 and "b.md" in err and "same file" in err


# --- a failed command removes the folders it created ---------------------------------------------------------

def test_failed_compress_removes_created_output_folders(workdir: Path, run_cli: Callable) -> None:
    Path("keep").mkdir()
    code, _, err = run_cli(["compress", "net.py:make", "--method", "svd", "--data", "nofile.npz",
                            "--out", "new/deep/small.pt2", "--report", "keep/sub/r.json"])
    assert code == 2 and "nofile.npz" in err
    assert not Path("new").exists() and not Path("keep/sub").exists()
    assert Path("keep").is_dir()  # a folder the command did not create stays


def test_failed_run_removes_created_parent_and_lock(workdir: Path, run_cli: Callable) -> None:
    code, _, err = run_cli(["run", "--allow-data-mismatch", "net.py:make", "--method", "svd", "--data", "nofile.npz",
                            "--out", "runs/new/a"])
    assert code == 2 and "nofile.npz" in err
    assert not Path("runs").exists()
    assert sorted(p.name for p in workdir.iterdir()) == ["net.py"]


# --- a requested provider that cannot run --------------------------------------------------------------------

def test_bench_unavailable_provider_fails_fast(workdir: Path, run_cli: Callable, cpu_only: None) -> None:
    # the model does not exist: the provider error must come first, before anything is loaded
    code, _, err = run_cli(["bench", "absent.onnx", "--providers", "cpu,cuda", "--out", "out/b.json"])
    assert code == 1
    (line,) = error_lines(err)
    assert "provider cuda is unavailable" in line and "pip install 'minreal[gpu]'" in line
    assert "--skip-unavailable-providers" in line and "absent.onnx" not in line
    assert not Path("out").exists()


def test_run_unavailable_provider_fails_before_loading(workdir: Path, run_cli: Callable,
                                                       cpu_only: None) -> None:
    code, _, err = run_cli(["run", "--allow-data-mismatch", "missing.py:make", "--method", "svd", "--data",
                            "digits-flat", "--out", "runs/a", "--providers", "tensorrt"])
    assert code == 1
    (line,) = error_lines(err)
    assert "provider tensorrt is unavailable" in line and "pip install 'minreal[tensorrt]'" in line
    assert not Path("runs").exists()


def test_bench_skip_unavailable_providers_is_explicit(workdir: Path, run_cli: Callable,
                                                      cpu_only: None) -> None:
    linear_onnx(workdir / "a.onnx", 0)
    linear_onnx(workdir / "b.onnx", 1)
    code, _, err = run_cli(["bench", "a.onnx", "b.onnx", "--providers", "cpu,cuda", "--out", "b.json", "-q",
                            "--skip-unavailable-providers", *QUICK_BENCH])
    assert code == 0, err
    report = json.loads(Path("b.json").read_text())
    assert [u["provider"] for u in report["unavailable"]] == ["cuda"]
    assert {r["provider"] for r in report["latency"]} == {"cpu"}
    # the gate does not accept the missing cuda latencies
    code, _, err = run_cli(["check", "b.json", "--max-latency-ratio", "100"])
    assert code == 1 and "latency_ratio b cuda batch 1: missing" in err and "unavailable" in err


def test_bench_with_every_provider_skipped_is_a_failure(workdir: Path, run_cli: Callable,
                                                       cpu_only: None) -> None:
    """Skipping unavailable providers may not turn "nothing was timed" into success."""
    linear_onnx(workdir / "a.onnx", 0)
    code, _, err = run_cli(["bench", "a.onnx", "--providers", "cuda", "--out", "b.json", "-q",
                            "--skip-unavailable-providers", *QUICK_BENCH])
    assert code == 1 and "none of the requested providers can run" in err and "cuda" in err
    assert len(err.strip().splitlines()) == 1 and not Path("b.json").exists()

def test_provider_fallback_in_a_worker_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import minreal.runtime_bench.bench as bench

    fell_back = WorkerResult(1, "unavailable", ["CPUExecutionProvider"], reason="onnxruntime fell back")
    monkeypatch.setattr(bench, "_spawn", lambda *args: fell_back)
    model = linear_onnx(tmp_path / "a.onnx", 0)
    cfg = BenchConfig(providers=("cpu",), warmup=0, min_runs=1, min_seconds=0.0, repeats=1, intra_op_threads=1)
    with pytest.raises(ProviderUnavailableError, match="provider cpu did not run: onnxruntime fell back"):
        run_benchmark([ModelEntry("a", model)], cfg, fail_on_unavailable=True)
    report = run_benchmark([ModelEntry("a", model)], cfg)  # the library default records it
    assert [u.reason for u in report.unavailable] == ["onnxruntime fell back"]


# --- two runs to one --out -----------------------------------------------------------------------------------

def _hold_lock(lock: Path) -> int:
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


@pytest.mark.parametrize("overwrite", [False, True])
def test_second_run_to_a_locked_out_exits_1(workdir: Path, run_cli: Callable, overwrite: bool) -> None:
    if overwrite:  # an earlier run directory that a second --overwrite run must not touch
        Path("runs/a").mkdir(parents=True)
        Path("runs/a/report.json").write_text(json.dumps({"schema_version": 1, "cases": []}))
    fd = _hold_lock(workdir / "runs" / ".a.lock")
    try:
        # the model does not exist: the lock must be checked before anything is loaded
        args = ["run", "--allow-data-mismatch", "missing.py:make", "--method", "svd", "--data", "digits-flat", "--out",
                "runs/a"]
        code, _, err = run_cli(args + (["--overwrite"] if overwrite else []))
    finally:
        os.close(fd)
    assert code == 1
    (line,) = error_lines(err)
    assert "runs/a" in line and "another minreal run" in line and "missing.py" not in line
    assert Path("runs/.a.lock").exists()  # the loser never removes the winner's lock
    names = sorted(p.name for p in Path("runs").iterdir())
    assert names == ([".a.lock", "a"] if overwrite else [".a.lock"])  # no staging folder
    if overwrite:
        assert json.loads(Path("runs/a/report.json").read_text()) == {"schema_version": 1, "cases": []}


def test_staging_left_by_a_killed_run_is_removed_by_the_next(workdir: Path, run_cli: Callable) -> None:
    """SIGKILL cannot be handled; the next run to the same --out cleans up once it holds the lock."""
    stale = Path("runs/.a.staging-killed")
    (stale / "case").mkdir(parents=True)
    (stale / "case" / "half.onnx").write_bytes(b"partial")
    other = Path("runs/.b.staging-x")
    other.mkdir()
    code, _, err = run_cli(["run", "--allow-data-mismatch", "missing.py:make", "--method", "svd", "--data",
                            "digits-flat", "--out", "runs/a"])
    assert code == 2 and "missing.py" in err  # failed later, but after claiming the lock
    assert not stale.exists() and other.exists()  # another --out's staging folder is not ours to delete

def test_run_lock_is_held_until_commit_and_removed(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   run_cli: Callable) -> None:
    import minreal.app.pipeline as pipeline

    seen: list[bool] = []
    commit = pipeline.commit_run_dir

    def commit_checking_lock(claim: pipeline.RunDirClaim) -> None:
        fd = os.open(workdir / "runs" / ".a.lock", os.O_RDWR)
        try:  # another process trying to claim --out now would be refused
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(True)
        finally:
            os.close(fd)
        commit(claim)

    monkeypatch.setattr(pipeline, "commit_run_dir", commit_checking_lock)
    code, _, err = run_cli([*RUN, "--out", "runs/a", "--no-int8", "--min-seconds", "0", "--repeats", "1"])
    assert code == 0, err
    assert seen == [True]
    assert sorted(p.name for p in Path("runs").iterdir()) == ["a"]  # lock file and staging folder gone
