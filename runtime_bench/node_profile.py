"""Where a session's time goes: every kernel's time from onnxruntime's own profile, with its shapes and MACs.

A profiled session records one ``"cat": "Node"`` event named ``<node>_kernel_time`` per kernel per run, with its
duration (µs) and, for most kernels, its input and output shapes. :func:`parse_kernel_times` (pure: it takes the
loaded JSON list) keeps each kernel's median over the runs after the first ``skip`` (the warm-up);
:func:`profile_kernels` opens a separate profiled session, runs it and parses the profile, so profiling never
slows a timed session. Unlike :mod:`minreal.runtime_bench.placement`, MACs are counted for the integer kernels too
(QLinearConv, QGemm, QLinearMatMul, ConvInteger, MatMulInteger and onnxruntime's fused forms), from the weight
input each of them names.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minreal.facts import INTEGER_KERNEL_OPERANDS

from .inputs import load_model_proto
from .placement import _event_shapes, _prod, node_macs
from .sessions import create_session

__all__ = ["KernelTime", "kernel_macs", "parse_kernel_times", "profile_kernels", "op_totals"]

Shape = Sequence[int]
_KERNEL_SUFFIX = "_kernel_time"



@dataclass(frozen=True)
class KernelTime:
    """One kernel of the optimised graph: node name, op type, provider, how many timed runs it has, its median
    time per run (µs), the shapes the profile recorded (empty when none) and its MACs (None: unknown)."""

    name: str
    op_type: str
    provider: str
    runs: int
    median_us: float
    inputs: tuple[tuple[int, ...] | None, ...]
    outputs: tuple[tuple[int, ...] | None, ...]
    macs: int | None


def kernel_macs(op_type: str, inputs: Sequence[Shape | None], outputs: Sequence[Shape | None]) -> int | None:
    """MACs of one kernel from its shapes: the float kernels by :func:`minreal.runtime_bench.placement.node_macs`, the
    integer ones from their own operand order (QLinearConv's weight is its 4th input: ``prod(Y) * prod(W[1:])``;
    the matrix products ``prod(Y) * K`` with K from the activation's last dimension, or ``prod(A) / M`` for a
    2-D Gemm). None when a shape is missing."""
    if op_type not in INTEGER_KERNEL_OPERANDS:
        return node_macs(op_type, inputs, outputs)
    a_at, w_at, kind = INTEGER_KERNEL_OPERANDS[op_type]
    a = inputs[a_at] if a_at < len(inputs) else None
    w = inputs[w_at] if w_at < len(inputs) else None
    y = outputs[0] if outputs else None
    if y is None or (kind == "conv" and (w is None or len(w) < 3)) or (kind != "conv" and not a):
        return None
    if kind == "conv":
        return _prod(y) * _prod(w[1:])
    if kind == "gemm" and len(y) == 2 and y[0]:
        return _prod(y) * (_prod(a) // int(y[0]))
    return _prod(y) * int(a[-1])


def _shapes(args: Mapping[str, Any], key: str) -> tuple[tuple[int, ...] | None, ...]:
    """:func:`minreal.runtime_bench.placement._event_shapes` as tuples (``()`` when the event records none)."""
    return tuple(None if v is None else tuple(int(d) for d in v) for v in _event_shapes(args, key) or ())


def _merged(recorded: tuple[tuple[int, ...] | None, ...], graph: Sequence[tuple[int, ...] | None]
            ) -> tuple[tuple[int, ...] | None, ...]:
    """The profile's input shapes with each constant's replaced by the graph's: a weight that onnxruntime
    pre-packed is recorded with another shape (``()``, or a per-channel QLinearConv's ``(C_out,)``)."""
    if not graph:
        return recorded
    out = list(recorded) + [None] * max(0, len(graph) - len(recorded))
    for i, shape in enumerate(graph):
        if shape is not None:
            out[i] = shape
    return tuple(out)


def parse_kernel_times(events: Sequence[Mapping[str, Any]], skip: int = 0,
                       constants: Mapping[str, Sequence[tuple[int, ...] | None]] | None = None) -> list[KernelTime]:
    """Each kernel's median time over its runs after the first ``skip`` (all of them when it ran no more than
    ``skip`` times), in the order the kernels first ran. ``constants``: per node name of the optimised graph, the
    shape of each input that is an initializer (None for the others), to fill in what the profile leaves out.

    Limits: a kernel inside a ``Loop`` or ``Scan`` body records one event per iteration, so ``skip`` and its median
    count iterations, not model runs; nodes the graph leaves unnamed share one profile name and are merged into one
    kernel (the exporters minreal uses name every node)."""
    durations: dict[str, list[float]] = {}
    first: dict[str, Mapping[str, Any]] = {}
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") == "Node" and name.endswith(_KERNEL_SUFFIX) and "dur" in event:
            node = name[: -len(_KERNEL_SUFFIX)]
            first.setdefault(node, event)
            durations.setdefault(node, []).append(float(event["dur"]))
    kernels = []
    for node, ds in durations.items():
        timed = ds[skip:] or ds
        args = first[node].get("args", {})
        op = str(args.get("op_name", ""))
        inputs, outputs = _shapes(args, "input_type_shape"), _shapes(args, "output_type_shape")
        inputs = _merged(inputs, (constants or {}).get(node, ()))
        kernels.append(KernelTime(node, op, str(args.get("provider", "")), len(timed), statistics.median(timed),
                                  inputs, outputs, kernel_macs(op, inputs, outputs) if outputs else None))
    return kernels


def profile_kernels(path: Path, provider: str, threads: int | None, feeds: Mapping[str, np.ndarray], runs: int,
                    warmup: int = 5, provider_options: Mapping[str, str] | None = None) -> list[KernelTime]:
    """Run the model at ``path`` ``warmup + runs`` times in a separate, profiled session and return each kernel's median
    time over the last ``runs`` (:func:`parse_kernel_times`; the shapes of pre-packed weights from the optimised graph
    the session writes). The session has the timed sessions' options and graph
    (:func:`minreal.runtime_bench.sessions.create_session`) plus profiling, which adds a little time per kernel: compare
    kernels within one profile, not a profile's sum with a timed latency."""
    if runs < 1 or warmup < 0:
        raise ValueError(f"profile_kernels needs runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    with tempfile.TemporaryDirectory(prefix="minreal-profile-") as tmp:
        session = create_session(Path(path), provider, threads, Path(tmp) / "optimized.onnx", provider_options,
                                 profile_prefix=Path(tmp) / "profile")  # the timed sessions' options and graph
        for _ in range(warmup + runs):
            session.run(None, dict(feeds))
        events = json.loads(Path(session.end_profiling()).read_text())
        graph = load_model_proto(Path(tmp) / "optimized.onnx").graph
    init = {t.name: tuple(int(d) for d in t.dims) for t in graph.initializer}
    constants = {n.name: [init.get(i) for i in n.input] for n in graph.node}
    return parse_kernel_times(events, skip=warmup, constants=constants)


def op_totals(kernels: Sequence[KernelTime]) -> dict[str, dict[str, Any]]:
    """Per op type: kernel count, summed median time (µs), share of the profile's time and summed MACs (None when
    any kernel's is unknown), costliest first."""
    total = sum(k.median_us for k in kernels) or 1.0
    out: dict[str, dict[str, Any]] = {}
    for k in kernels:
        row = out.setdefault(k.op_type, {"kernels": 0, "us": 0.0, "macs": 0})
        row["kernels"] += 1
        row["us"] += k.median_us
        row["macs"] = None if row["macs"] is None or k.macs is None else row["macs"] + k.macs
    for row in out.values():
        row["share"] = round(row["us"] / total, 4)
        row["us"] = round(row["us"], 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us"]))
