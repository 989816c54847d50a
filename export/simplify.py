"""Graph simplification with onnxsim, kept only if ONNX Runtime outputs are unchanged.

The simplified graph is run next to the original on the caller's inputs; if onnxsim fails, or any
output moves beyond ``atol + rtol * |original|``, the unsimplified graph is written instead and the
result says why.

The simplified graph brings in no op outside the standard domain that the exported one does not have. onnxsim 0.8
fuses a mask-free self-attention block into ONNX Runtime's own ``com.microsoft`` ``Attention`` kernel (a grouped-query
one into ``GroupQueryAttention``): such a graph is no longer TensorRT-ready, and ONNX Runtime's INT8 quantiser leaves
the fused op in float. A DistilBERT cut by wanda (whose traced graph has no mask) ran 1.32x the original's INT8
latency in the zoo (``benchmarks/zoo.json``, under load) and 0.76x once left unfused
(``benchmarks/hf_encoders.json``). Those passes (:data:`CONTRIB_FUSIONS`) are skipped by name; a simplified graph
that still brings in such an op (a pass of another onnxsim version) is simplified again without onnxsim's fusions
(constant folding and shape inference only), and kept as exported if that fails too.

A model with external data (weights beside the graph, e.g. one over 2 GiB) is not simplified: simplification
here runs on one in-memory protobuf, which holds at most 2 GiB. Its graph and data are copied unchanged
(:func:`minreal.export.onnx_files.copy_onnx`) and the result records the reason.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from minreal.export.atomic import ensure_distinct
from minreal.export.onnx_files import copy_onnx, data_files, iter_nodes, onnx_size
from minreal.export.verify import DEFAULT_ATOL, DEFAULT_RTOL, Feeds, compare_output, feed_rows, run_ort
from minreal.facts import error_line
from minreal.runtime_bench.atomic import atomic_path
from minreal.runtime_bench.sessions import create_session

__all__ = ["CONTRIB_FUSIONS", "SimplifyResult", "simplify"]

logger = logging.getLogger(__name__)

CONTRIB_FUSIONS = ("fuse_attention", "fuse_gqa")
"""onnxsim passes that write ONNX Runtime ``com.microsoft`` kernels (``Attention``, ``GroupQueryAttention``) in place
of standard ops; skipped by name (a name an onnxsim version does not know skips nothing)."""


@dataclass(frozen=True)
class SimplifyResult:
    """What :func:`simplify` wrote.

    Attributes
    ----------
    path_in : str
        the input graph (never modified).
    path_out : str
        the written graph.
    simplified : bool
        ``True`` if ``path_out`` holds the onnxsim graph, ``False`` if the original was kept.
    reason : str | None
        one line: why the original was kept (``None`` when simplified).
    nodes_before : int
        nodes in the input's main graph.
    nodes_after : int
        nodes in the written graph.
    size_before_bytes : int
        size of the input file (with its external data, if any).
    size_after_bytes : int
        size of the written file (with its external data, if any).
    max_abs_diff : float | None
        largest ``|simplified - original|`` over the check inputs (``None`` if not run).
    """

    path_in: str
    path_out: str
    simplified: bool
    reason: str | None
    nodes_before: int
    nodes_after: int
    size_before_bytes: int
    size_after_bytes: int
    max_abs_diff: float | None


def _run_onnxsim(model: onnx.ModelProto, fuse: bool = True) -> onnx.ModelProto:
    """Simplify with onnxsim (its own random-input check off: we check on the caller's inputs), without the
    :data:`CONTRIB_FUSIONS`; with ``fuse`` off, without any of its optimizer passes."""
    try:
        import onnxsim
    except ImportError as exc:
        raise RuntimeError("onnxsim is not installed; `pip install onnxsim` to simplify graphs") from exc
    simplified, ok = onnxsim.simplify(model, check_n=0, skipped_optimizers=list(CONTRIB_FUSIONS),
                                      perform_optimization=fuse)
    if not ok:
        raise RuntimeError("onnxsim reported that the simplified model is invalid")
    onnx.checker.check_model(simplified)
    return simplified


def _foreign_ops(before: onnx.ModelProto, after: onnx.ModelProto) -> list[str]:
    """``domain:op xCOUNT`` of the ops outside the standard domain that ``after`` has and ``before`` has not
    (a new ``com.microsoft`` op counts even where ``before`` has another one of that domain)."""
    def ops(model: onnx.ModelProto) -> Iterator[tuple[str, str]]:  # ``ai.onnx`` is the standard domain ""
        return ((("" if n.domain == "ai.onnx" else n.domain), n.op_type) for n in iter_nodes(model.graph))

    known = set(ops(before))
    found = Counter(op for op in ops(after) if op[0] and op not in known)
    return [f"{domain}:{op} x{count}" for (domain, op), count in sorted(found.items())]


def _compare(
    candidate: bytes, check_inputs: Sequence[Feeds], reference: list[list[np.ndarray]], rtol: float, atol: float
) -> tuple[float, str | None]:
    """Run the candidate on every input; return the max abs difference and the first violation, if any."""
    session = create_session(candidate, arena=False)
    names = [o.name for o in session.get_outputs()]
    worst, problem = 0.0, None
    for x, expected in zip(check_inputs, reference):
        for name, ref, new in zip(names, expected, run_ort(session, x), strict=True):
            if ref.shape != new.shape:
                return float("inf"), f"output {name!r} changed shape {ref.shape} -> {new.shape} at batch {feed_rows(x)}"
            check = compare_output(name, feed_rows(x), new, ref, rtol, atol)
            worst = max(worst, check.max_abs_err)
            if not check.passed and problem is None:
                problem = (
                    f"output {name!r} at batch {feed_rows(x)} moved by {check.worst_measured:.3g} "
                    f"> allowed {check.worst_allowed:.3g}"
                )
    return worst, problem


def _simplified_or_reason(
    model: onnx.ModelProto,
    check_inputs: Sequence[Feeds],
    reference: list[list[np.ndarray]],
    rtol: float,
    atol: float,
) -> tuple[bytes | None, str | None, float | None]:
    """Return (simplified bytes or None, reason it was rejected, max abs diff)."""
    try:
        simplified = _run_onnxsim(model)
        if foreign := _foreign_ops(model, simplified):
            logger.info("onnxsim wrote %s; simplifying without its fusions", ", ".join(foreign))
            simplified = _run_onnxsim(model, fuse=False)
        if foreign := _foreign_ops(model, simplified):
            why = (f"onnxsim wrote ops outside the standard domain the exported graph does not have "
                   f"({', '.join(foreign)}), which TensorRT and ONNX Runtime's INT8 quantiser may not take")
            return None, why, None
        candidate = simplified.SerializeToString()
        diff, problem = _compare(candidate, check_inputs, reference, rtol, atol)
    except Exception as exc:
        return None, f"onnxsim failed: {error_line(exc, with_type=True)}", None
    if problem:
        return None, f"simplification changed outputs beyond rtol={rtol:g}, atol={atol:g}: {problem}", diff
    return candidate, None, diff


def simplify(
    path_in: str | Path,
    path_out: str | Path,
    check_inputs: Sequence[Feeds],
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> SimplifyResult:
    """Simplify an ONNX graph with onnxsim, keeping the original if that fails or changes outputs.

    Parameters
    ----------
    path_in : str | Path
        input ``.onnx`` file with one graph input (not modified).
    path_out : str | Path
        destination; must differ from ``path_in``; written atomically.
    check_inputs : Sequence[Feeds]
        arrays fed to the graph input (e.g. two batch sizes) to compare ORT outputs.
    rtol : float
        relative tolerance of the before/after comparison (default ``1e-4``).
    atol : float
        absolute tolerance of the before/after comparison (default ``1e-5``).

    Returns
    -------
    SimplifyResult
        A :class:`SimplifyResult` with node counts and file sizes before and after; for an input with external
        data, a copy of it (data in ``path_out.data``) and the reason it was not simplified.
    """
    ensure_distinct(path_in, path_out)
    if not check_inputs:
        raise ValueError("simplify needs at least one check input to compare outputs before and after")
    path_in, path_out = Path(path_in), Path(path_out)
    if data_files(path_in):
        return _copied_unsimplified(path_in, path_out)
    model = onnx.load(str(path_in))
    original = create_session(path_in, arena=False)
    reference = [run_ort(original, x) for x in check_inputs]
    del original  # closed before the candidate's session opens: one session's memory at a time
    candidate, reason, diff = _simplified_or_reason(model, check_inputs, reference, rtol, atol)
    with atomic_path(path_out) as tmp:
        if candidate is None:
            shutil.copyfile(path_in, tmp)
        else:
            tmp.write_bytes(candidate)
    if reason:
        logger.warning("kept the unsimplified graph for %s: %s", path_out.name, reason)
    nodes_after = len(onnx.load(str(path_out), load_external_data=False).graph.node)
    return SimplifyResult(
        path_in=str(path_in), path_out=str(path_out), simplified=candidate is not None, reason=reason,
        nodes_before=len(model.graph.node), nodes_after=nodes_after, size_before_bytes=path_in.stat().st_size,
        size_after_bytes=path_out.stat().st_size, max_abs_diff=diff,
    )  # fmt: skip


def _copied_unsimplified(path_in: Path, path_out: Path) -> SimplifyResult:
    """Copy an external-data model (graph and data) unchanged, recording why it was not simplified."""
    size = onnx_size(path_in)
    reason = (f"skipped: the model keeps its weights in external data ({size / 2**20:,.1f} MiB); simplification "
              "runs on one in-memory protobuf, which holds at most 2 GiB")
    logger.warning("kept the unsimplified graph for %s: %s", path_out.name, reason)
    copy_onnx(path_in, path_out)
    nodes = len(onnx.load(str(path_in), load_external_data=False).graph.node)
    return SimplifyResult(
        path_in=str(path_in), path_out=str(path_out), simplified=False, reason=reason, nodes_before=nodes,
        nodes_after=nodes, size_before_bytes=size, size_after_bytes=onnx_size(path_out), max_abs_diff=None,
    )  # fmt: skip
