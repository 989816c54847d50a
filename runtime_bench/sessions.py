"""onnxruntime sessions configured for fair, interleaved timing."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minreal.facts import ARM64_TARGET, INT8_TARGET_KEY, PROVIDERS, error_line

from .cpu import ARM_GRAPH_CONFIG
from .errors import ModelFileError, SessionError
from .runtime import onnxruntime_module, tensorrt_library_problem

__all__ = ["SPINNING_ENTRIES", "session_options", "create_session", "share_thread_pool", "target_graph_config"]

#: Session config entries that stop idle thread pools from spinning. With one pool per session,
#: spinning threads of idle sessions steal cores from the timed one when models are interleaved.
SPINNING_ENTRIES: tuple[tuple[str, str], ...] = (
    ("session.intra_op.allow_spinning", "0"),
    ("session.inter_op.allow_spinning", "0"),
)


def session_options(threads: int | None, optimized_model_path: Path | None = None,
                    config: Mapping[str, str] | None = None, profile_prefix: Path | None = None,
                    shared_pool: bool = False, arena: bool = True) -> Any:
    """Session options: explicit intra-op threads, one inter-op thread, sequential, no spinning.

    Parameters
    ----------
    threads : int | None
        Intra-op thread count; None leaves onnxruntime's default (the physical cores). Unused with ``shared_pool``.
    optimized_model_path : Path | None
        If given, onnxruntime writes the optimised graph there.
    config : Mapping[str, str] | None
        More session config entries (e.g. ``session.qdqisint8allowed``), added after the defaults.
    profile_prefix : Path | None
        If given, profiling is on and its file starts with this path (``session.end_profiling()``).
    shared_pool : bool
        Run on the process's one shared thread pool (:func:`share_thread_pool`, whose size holds) instead of the
        session's own; once the process has the shared pool, every session must set it.
    arena : bool
        Keep onnxruntime's CPU memory arena (timing: each run reuses the memory of the last). False returns a run's
        memory when the run ends, for a pass that runs each batch once: an arena grows in powers of two and keeps
        its memory until the session closes, and the C library may keep it in the process after that.
    """
    ort = onnxruntime_module()
    options = ort.SessionOptions()
    # on the shared pool its own sizes hold: sizes here would be ignored, with a warning on stderr
    options.intra_op_num_threads = 0 if shared_pool else threads or 0
    options.inter_op_num_threads = 0 if shared_pool else 1
    options.use_per_session_threads = not shared_pool
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = arena
    for key, value in SPINNING_ENTRIES:
        options.add_session_config_entry(key, value)
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if optimized_model_path is not None:
        options.optimized_model_filepath = str(optimized_model_path)
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    return options


def create_session(
    model: Path | bytes,
    provider: str = PROVIDERS["cpu"],
    threads: int | None = None,
    optimized_model_path: Path | None = None,
    provider_options: Mapping[str, str] | None = None,
    config: Mapping[str, str] | None = None,
    profile_prefix: Path | None = None,
    shared_pool: bool = False,
    arena: bool = True,
) -> Any:
    """Create an inference session on ``provider`` (full onnxruntime name): the project's one session factory.

    The benchmark, its placement and kernel profiles, the parity check and the simplifier's before/after comparison
    all open sessions here.
    The caller must compare ``session.get_providers()`` with the request
    (:func:`minreal.runtime_bench.providers.provider_mismatch`): onnxruntime may fall back to CPU.

    Parameters
    ----------
    model : Path | bytes
        An ONNX file, or a serialized model.
    provider : str
        Full execution-provider name (``"CPUExecutionProvider"``, ...).
    threads : int | None
        Intra-op threads; None leaves onnxruntime's default.
    optimized_model_path : Path | None
        If given, onnxruntime writes the optimised graph there.
    provider_options : Mapping[str, str] | None
        ONNX Runtime options of ``provider`` (strings; see
        :func:`minreal.runtime_bench.provider_options.ort_options`).
    config : Mapping[str, str] | None
        More session config entries (:func:`session_options`). ``None`` on the CPU provider: those its
        INT8 target's graph needs (:func:`target_graph_config` of the file's ``minreal.int8_target`` metadata:
        an ``arm64`` file runs ARM's graph); ``{}``: none, this machine's own graph whatever the file says.
    profile_prefix : Path | None
        If given, a profiled session (:func:`session_options`).
    shared_pool : bool
        Run on the process's shared thread pool (:func:`share_thread_pool` first), not the session's own; once the
        process has the shared pool, every session must set it.
    arena : bool
        Keep onnxruntime's CPU memory arena (:func:`session_options`); False for a pass that runs each batch once.

    Raises
    ------
    ModelFileError
        the file does not exist.
    SessionError
        onnxruntime rejects the model, or ``shared_pool`` does not match the process (it has the shared pool and
        ``shared_pool`` is False, or the reverse): the message then says what to do and names no file.
    """
    if isinstance(model, bytes):
        source, where = model, "an in-memory model"
    else:
        path = Path(model)
        if not path.is_file():
            raise ModelFileError(f"model file not found: {path}")
        source, where = str(path), str(path)
    providers: list[Any] = [(provider, dict(provider_options))] if provider_options else [provider]
    if provider == PROVIDERS["tensorrt"]:
        tensorrt_library_problem()  # loads TensorRT's libraries where its wheels keep them; a fallback is reported

    def make(entries: Mapping[str, str] | None) -> Any:
        options = session_options(threads, optimized_model_path, entries, profile_prefix, shared_pool, arena)
        try:
            made = onnxruntime_module().InferenceSession(source, sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own pybind exception types
            raise SessionError(_pool_problem(str(exc), shared_pool) or f"onnxruntime cannot create a session for "
                               f"{where} on {provider}: {error_line(exc)}") from None
        try:  # names are decoded on first use, by every run: a damaged file would fail there, naming nothing
            [arg.name for arg in (*made.get_inputs(), *made.get_outputs())]
        except UnicodeDecodeError as exc:
            raise SessionError(f"onnxruntime cannot use {where}: an input or output name is not UTF-8 text "
                               f"({exc.reason}); is the file damaged?") from None
        return made

    # With config None on the CPU provider, the session is re-made with the entries of the graph its file's INT8
    # target runs: the optimiser runs at load, so only a new session runs that graph. Only such files (arm64) pay for
    # two sessions, the first released before the second is built.
    session = make(config)
    if config is None and provider == PROVIDERS["cpu"]:
        entries = target_graph_config(session.get_modelmeta().custom_metadata_map.get(INT8_TARGET_KEY))
        if entries:
            del session
            session = make(entries)
    return session


#: What onnxruntime says when a session's ``shared_pool`` does not match the process (its shared pool made or not).
_OWN_POOL_REFUSED = "use_per_session_threads must be false when using a global thread pool"
_NO_SHARED_POOL = "EnvCreatedWithGlobalThreadPools() was false"


def _pool_problem(message: str, shared_pool: bool) -> str | None:
    """One line saying what to do when onnxruntime refused a session for its thread pool, not for its model; None
    for any other refusal."""
    if _OWN_POOL_REFUSED in message and not shared_pool:
        return ("this process has a shared thread pool (share_thread_pool), so every session in it must be opened "
                "with shared_pool=True; open sessions on pools of their own in another process")
    if _NO_SHARED_POOL in message and shared_pool:
        return ("a session with shared_pool=True needs the process's shared thread pool: call share_thread_pool "
                "first (once, in a fresh process)")
    return None


def share_thread_pool(threads: int | None) -> None:
    """Give this process one intra-op thread pool of ``threads`` threads (None: onnxruntime's default, the physical
    cores) for its sessions opened with ``shared_pool``, before the first of them. Every session the process opens
    after it must use ``shared_pool=True`` (onnxruntime refuses one on a pool of its own). onnxruntime makes the
    shared pool at most once per process: a second call is refused; a call after sessions on pools of their own were
    opened succeeds (those keep their pools).

    Sessions on pools of their own run on threads of their own, which the scheduler places apart: beside a process
    that keeps one core busy, two identical models timed interleaved in one process came out 1.4-1.8x apart, one way
    or the other by chance per process (``benchmarks/gate_power.json`` before issue 45's fix: the paired gate then
    could decide almost nothing on a loaded machine); pinning the two sessions' pool threads to different cores
    beside a busy one gave the same 0.65 and 1.6-1.9, pinning both to one core ratios within 0.87-1.14. On one
    shared pool both models run on the same threads, wherever they are. onnxruntime's shared pool may spin while
    idle (its Python API sets sizes only); with one pool for every session, no idle pool spins beside a timed one.
    Its latencies are not a bench's: on a busy 2-core machine an MLP at batch 32 on 2 threads had a lower p50 there
    (0.37-0.59 ms against 0.63-0.70 ms on pools of its own) and a heavier tail (mean 1.5-2.2 ms against 0.6-1.0 ms);
    the paired gate uses only the ratio of the two models' p50s in one process.

    Raises
    ------
    SessionError
        This process already has its shared pool (onnxruntime makes it at most once per process): run each job that
        needs one in a fresh process.
    """
    try:
        onnxruntime_module().set_global_thread_pool_sizes(threads or 0, 1)
    except Exception as exc:  # onnxruntime raises its own pybind exception types
        raise SessionError(f"this process cannot make a shared thread pool ({error_line(exc)}): run the job in a "
                           "fresh worker process") from None


def target_graph_config(target: str | None) -> Mapping[str, str] | None:
    """The session config entries with which ONNX Runtime's CPU provider builds, on this machine, the graph a file of
    INT8 ``target`` (its :data:`~minreal.facts.INT8_TARGET_KEY` metadata) runs on its device: for ``arm64``
    :data:`~minreal.runtime_bench.cpu.ARM_GRAPH_CONFIG` (int8 Q/DQ kept and fused into int8 kernels, as in ONNX
    Runtime's ARM builds, instead of this machine's uint8 rewrite); ``None`` for any other target."""
    return ARM_GRAPH_CONFIG if target == ARM64_TARGET else None
