"""Session options guard: explicit threads, no spinning (idle sessions must not steal cores), and the shared pool
the paired gate's models run on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from minreal.runtime_bench.errors import ModelFileError, SessionError
from minreal.runtime_bench.sessions import SPINNING_ENTRIES, create_session, session_options

#: Run in a fresh process (the shared pool is made once per process): how many threads two sessions of
#: ``sys.argv[1]`` at 2 intra-op threads start, on their own pools (``own``) or on the shared one (``shared``);
#: then, with ``shared``, what a second shared pool raises.
_THREADS = """
import os, sys
from pathlib import Path
import onnxruntime  # the threads its import starts are not the sessions'
from minreal.runtime_bench.errors import SessionError
from minreal.runtime_bench.sessions import create_session, share_thread_pool
shared = sys.argv[2] == "shared"
if shared:
    share_thread_pool(2)
before = len(os.listdir("/proc/self/task"))
sessions = [create_session(Path(sys.argv[1]), threads=2, shared_pool=shared) for _ in range(2)]
print(len(os.listdir("/proc/self/task")) - before)
if shared:
    try:
        share_thread_pool(2)
    except SessionError as exc:
        print("refused", "fresh worker process" in str(exc))
"""


def test_spinning_disabled_in_options() -> None:
    options = session_options(threads=3)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    assert options.intra_op_num_threads == 3
    assert options.inter_op_num_threads == 1


def test_created_session_keeps_settings(reference_model: Path) -> None:
    session = create_session(reference_model, "CPUExecutionProvider", threads=2)
    options = session.get_session_options()
    for key, value in SPINNING_ENTRIES:
        assert options.get_session_config_entry(key) == value
    assert options.intra_op_num_threads == 2
    assert session.get_providers()[0] == "CPUExecutionProvider"


def test_missing_model_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelFileError) as info:
        create_session(missing, "CPUExecutionProvider", threads=1)
    assert str(missing) in str(info.value)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_shared_pool_options_leave_the_size_to_the_pool() -> None:
    options = session_options(threads=3, shared_pool=True)
    assert options.use_per_session_threads is False
    # the shared pool's sizes hold; sizes here would be ignored, with a warning
    assert options.intra_op_num_threads == 0 and options.inter_op_num_threads == 0


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts the process's threads in /proc")
@pytest.mark.parametrize(("mode", "lines"), [("own", ["2"]), ("shared", ["0", "refused True"])])
def test_sessions_on_the_shared_pool_start_no_threads_of_their_own(reference_model: Path, mode: str,
                                                                   lines: list[str]) -> None:
    # a pool of 2 intra-op threads is its caller and one thread more: one per session on their own pools, none on
    # the shared pool (made before), which a process makes once
    done = subprocess.run([sys.executable, "-c", _THREADS, str(reference_model), mode], capture_output=True,
                          text=True, check=True)
    assert done.stdout.split("\n")[:-1] == lines


def test_a_name_that_is_not_utf8_is_refused_naming_the_file(tmp_path: Path) -> None:
    """A damaged file whose output name is not UTF-8 opens in onnxruntime but fails on every run, in Python's
    decoder, naming nothing (found by benchmarks/fuzz.py on an .ort file): it is refused when the session is made."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["yq"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("yq", TensorProto.FLOAT, [1, 2])])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    assert data.count(b"yq") == 2
    path = tmp_path / "damaged.onnx"
    path.write_bytes(data.replace(b"yq", b"\xf9q"))  # the same length: the protobuf stays well formed
    with pytest.raises(SessionError, match=r"damaged\.onnx.*not UTF-8"):
        create_session(path)


#: Run in a fresh process per case: what a session of ``sys.argv[1]`` whose ``shared_pool`` does not match the process
#: raises (``own``: an own-pool session after the shared pool; ``shared``: a shared-pool one without it), or, with
#: ``late``, whether the shared pool is made after an own-pool session and a shared-pool session then runs.
_MISMATCH = """
import sys
from pathlib import Path
from minreal.runtime_bench.errors import SessionError
from minreal.runtime_bench.sessions import create_session, share_thread_pool
case, path = sys.argv[2], Path(sys.argv[1])
if case == "late":
    create_session(path, threads=1)
    share_thread_pool(1)
    print("made", type(create_session(path, shared_pool=True)).__name__)
    raise SystemExit
if case == "own":
    share_thread_pool(1)
try:
    create_session(path, threads=1, shared_pool=case == "shared")
except SessionError as exc:
    print(exc)
"""


@pytest.mark.parametrize(("case", "says"), [
    ("own", "this process has a shared thread pool (share_thread_pool), so every session in it must be opened with "
            "shared_pool=True; open sessions on pools of their own in another process"),
    ("shared", "a session with shared_pool=True needs the process's shared thread pool: call share_thread_pool first "
               "(once, in a fresh process)"),
    ("late", "made InferenceSession"),
])
def test_a_session_whose_pool_does_not_match_the_process_says_what_to_do(reference_model: Path, case: str,
                                                                          says: str) -> None:
    done = subprocess.run([sys.executable, "-c", _MISMATCH, str(reference_model), case], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == says  # onnxruntime prints its own retry banner before it
