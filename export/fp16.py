"""FP16 copies of exported fp32 ONNX files, checked against the fp32 file at float16-derived tolerances.

:func:`convert_fp16` runs ONNX Runtime's converter (``onnxruntime.transformers.float16``) on a verified fp32
file, keeping graph inputs and outputs in float32 by default (a Cast after each input and before each output,
so callers feed the same arrays), puts the graph back in topological order (the converter appends its Casts at
the end; TensorRT's parser and ``onnx.checker`` need producers first) and publishes ``NAME.fp16.onnx`` beside
the fp32 file only once :func:`fp16_parity` passed.

Ops left in float32: ONNX Runtime's ``DEFAULT_OP_BLOCK_LIST`` (ML ops, TopK, Range, CumSum, Min/Max, ...) plus
:data:`FP16_KEEP_FP32_OPS`, reductions whose intermediate sum (of squares, of exponentials) overflows float16
(max 65504) while their result fits. Blocking an op only helps such ops: the converter casts a blocked node's
output back to float16, so an op whose *result* overflows cannot be rescued by the block list.

Tolerance rule (:func:`fp16_atol`): float16 has machine epsilon ``2**-10`` (unit roundoff ``2**-11``), about
1e-3 relative per rounding. An element passes when ``|fp16 - fp32| <= atol + rtol * |fp32|`` with
``rtol = 10 * eps`` (~9.8e-3: room for about twenty roundings along the path to one element: weights once,
activations after each op) and ``atol = atol_scale * max|fp32|`` of that output at that batch size (``atol_scale``
also ``10 * eps``): the rounding error of a sum ``sum_i w_i x_i`` is relative to the size of its terms, not of
its result, so an element that cancels to near zero is judged on the output's scale. float32 tolerances
(``rtol=1e-3``) would reject correct FP16 files; these still reject a single corrupted weight.

ONNX Runtime's CPU provider (x86, 1.32) has float16 kernels for few ops (LayerNormalization; Relu, inlined as
Max): it wraps the others (Conv, MatMul, Gemm, Add, Softmax, Gelu, pooling, ...) in Casts to float32 and then
removes the Cast pairs between them, so on CPU an FP16 file computes in float32 with float16-rounded weights.
Parity on CPU therefore checks the conversion (graph, weight rounding and range) but not float16 arithmetic;
:func:`kernel_precisions` reports which nodes run in which precision on a provider.
"""

from __future__ import annotations

import collections
import heapq
import logging
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from minreal.export.atomic import ensure_distinct
from minreal.export.errors import ParityError, SameFileError
from minreal.export.onnx_files import data_file_name, data_files, onnx_size, staged_onnx
from minreal.export.verify import Feeds, OutputParity, compare_output, feed_rows, finite_abs_max, output_scale
from minreal.facts import PROVIDERS, error_line

__all__ = [
    "FP16_EPS",
    "FP16_RTOL",
    "FP16_SUFFIX",
    "FP16_KEEP_FP32_OPS",
    "Fp16Config",
    "Fp16Parity",
    "Fp16Result",
    "fp16_path",
    "fp16_atol",
    "fp16_parity",
    "kernel_precisions",
    "convert_fp16",
]

logger = logging.getLogger(__name__)

FP16_EPS = float(np.finfo(np.float16).eps)
"""float16 machine epsilon, ``2**-10``: the relative spacing of float16 numbers at 1."""

FP16_RTOL = 10 * FP16_EPS
"""Default relative tolerance (and ``atol_scale``) of FP16 parity, ~9.8e-3 (see the module docstring)."""

FP16_SUFFIX = ".fp16.onnx"
"""``model.onnx`` → ``model.fp16.onnx``."""

FP16_KEEP_FP32_OPS: tuple[str, ...] = ("ReduceL2", "ReduceLogSum", "ReduceLogSumExp")
"""Op types kept in float32 besides ONNX Runtime's default block list: their intermediate sum overflows float16
while their result fits."""

_FLOAT_TYPES = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16"}
_NON_FLOAT_OUTPUT_OPS = frozenset({"Shape", "Size", "ArgMax", "ArgMin", "Equal", "Greater", "GreaterOrEqual", "Less",
                                   "LessOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf", "NonZero"})


@dataclass(frozen=True)
class Fp16Config:
    """Options of :func:`convert_fp16`.

    Attributes
    ----------
    keep_io_types : bool
        keep float32 graph inputs and outputs (Casts inside the graph); ``False`` makes them float16.
    keep_fp32_ops : tuple[str, ...]
        op types left in float32 besides ONNX Runtime's default block list.
    keep_fp32_nodes : tuple[str, ...]
        node names left in float32 (e.g. nodes whose activations overflow float16).
    rtol : float
        relative parity tolerance.
    atol_scale : float
        absolute parity tolerance as a fraction of each output's largest ``|fp32|`` value.
    provider : str
        short provider name the FP16 file is checked on (the fp32 reference always runs on CPU).
    """

    keep_io_types: bool = True
    keep_fp32_ops: tuple[str, ...] = FP16_KEEP_FP32_OPS
    keep_fp32_nodes: tuple[str, ...] = ()
    rtol: float = FP16_RTOL
    atol_scale: float = FP16_RTOL
    provider: str = "cpu"

    def __post_init__(self) -> None:
        if not self.rtol > 0 or not self.atol_scale >= 0:
            raise ValueError(f"Fp16Config.rtol must be > 0 and atol_scale >= 0, got {self.rtol} and {self.atol_scale}")
        if self.provider not in PROVIDERS:
            raise ValueError(f"Fp16Config.provider={self.provider!r} is not one of {tuple(PROVIDERS)}")


@dataclass(frozen=True)
class Fp16Parity:
    """The FP16 file against its fp32 file on the same inputs.

    Attributes
    ----------
    status : str
        ``"passed"``, ``"failed"`` or ``"not checked on CPU: <reason>"`` (no session, or it did not run).
    provider : str
        short name of the provider the FP16 file ran on.
    rtol, atol_scale : float
        tolerances (``atol = atol_scale * max|fp32|`` per output and batch size).
    batch_sizes : list[int]
        batch sizes checked.
    checks : list[OutputParity]
        one :class:`minreal.export.verify.OutputParity` per output and batch size (``worst_allowed`` holds the
        derived atol at the worst element).
    max_abs_err : float | None
        worst ``|fp16 - fp32|``.
    max_scaled_err : float | None
        worst ``|fp16 - fp32| / max|fp32|`` of an output: error on the output's scale.
    passed : bool | None
        every check passed; ``None`` when not checked.
    """

    status: str
    provider: str
    rtol: float
    atol_scale: float
    batch_sizes: list[int] = field(default_factory=list)
    checks: list[OutputParity] = field(default_factory=list)
    max_abs_err: float | None = None
    max_scaled_err: float | None = None
    passed: bool | None = None

    @property
    def checked(self) -> bool:
        """Whether the FP16 file ran at all (``passed`` is then a verdict)."""
        return self.passed is not None


@dataclass(frozen=True)
class Fp16Result:
    """What :func:`convert_fp16` wrote.

    Attributes
    ----------
    fp32_path : str
        the float32 model (not modified).
    out_path : str
        the FP16 model.
    keep_io_types : bool
        graph inputs and outputs stayed float32.
    size_fp32_bytes, size_fp16_bytes : int
        file sizes (with external data).
    nodes_fp32, nodes_fp16 : int
        node counts of the two graphs (the FP16 one includes the Casts added).
    node_counts : dict[str, int]
        op type → count in the FP16 graph.
    fp32_nodes : dict[str, int]
        nodes of the FP16 graph the block lists kept in float32, by op type.
    provider_precisions : dict[str, dict[str, int]]
        ``{"float16": {op: n}, "float32": {op: n}}``: what the parity provider actually runs
        in each precision after its own optimisations (:func:`kernel_precisions`; empty when not checked).
    parity : Fp16Parity
        :class:`Fp16Parity`.
    """

    fp32_path: str
    out_path: str
    keep_io_types: bool
    size_fp32_bytes: int
    size_fp16_bytes: int
    nodes_fp32: int
    nodes_fp16: int
    node_counts: dict[str, int]
    fp32_nodes: dict[str, int]
    provider_precisions: dict[str, dict[str, int]]
    parity: Fp16Parity


def fp16_path(fp32_path: str | Path) -> Path:
    """``dir/model.onnx`` → ``dir/model.fp16.onnx``."""
    path = Path(fp32_path)
    return path.with_name(path.stem + FP16_SUFFIX)


def _scale(reference: np.ndarray, got: np.ndarray | None = None, atol_scale: float = FP16_RTOL) -> float:
    """Largest finite ``|reference|``, at least float16's smallest normal number (an all-zero output still allows
    rounding); an inf element would make every tolerance infinite, a NaN every tolerance NaN. Given the FP16 output
    ``got``, a constant it reproduces exactly (a mask) sets the scale only as far as :func:`output_scale` allows."""
    magnitude = finite_abs_max(reference) if got is None else output_scale(got, reference, atol_scale)
    return max(magnitude, float(np.finfo(np.float16).tiny))


def fp16_atol(reference: np.ndarray, atol_scale: float = FP16_RTOL, got: np.ndarray | None = None) -> float:
    """Absolute tolerance for one output: ``atol_scale * max|reference|`` (the module docstring says why; ``got``:
    see :func:`_scale`)."""
    return atol_scale * _scale(reference, got, atol_scale)


def _provider_label(provider: str) -> str:
    """``CPU`` for the CPU provider (``not checked on CPU: ...``), else ONNX Runtime's provider name."""
    return "CPU" if provider == "cpu" else PROVIDERS[provider]


def _session(path: Path, provider: str, optimized: Path | None = None) -> Any:
    """A session on ``provider`` (short name); :class:`RuntimeError` if it cannot be made or falls back."""
    from minreal.runtime_bench.providers import provider_mismatch
    from minreal.runtime_bench.sessions import create_session

    session = create_session(path, PROVIDERS[provider], threads=1, optimized_model_path=optimized)
    mismatch = provider_mismatch(PROVIDERS[provider], session.get_providers())
    if mismatch:
        raise RuntimeError(mismatch)
    return session


def _typed_feeds(session: Any, feeds: Feeds) -> dict[str, np.ndarray]:
    """``feeds`` by input name, float arrays cast to float16 for the inputs the session takes as float16."""
    inputs = session.get_inputs()
    named = dict(feeds) if isinstance(feeds, Mapping) else {inputs[0].name: feeds}
    kinds = {i.name: i.type for i in inputs}
    return {n: a.astype(np.float16) if kinds.get(n) == "tensor(float16)" and a.dtype.kind == "f" else a
            for n, a in named.items()}


def _check_feed(reference: Any, session: Any, feeds: Feeds, config: Fp16Config) -> list[tuple[OutputParity, float]]:
    """Every output of the FP16 session against the fp32 one on ``feeds``, with its scale ``max|fp32|``."""
    want = reference.run(None, _typed_feeds(reference, feeds))
    got = session.run(None, _typed_feeds(session, feeds))
    names, batch = [o.name for o in session.get_outputs()], feed_rows(feeds)
    out = []
    for name, g, w in zip(names, got, want):
        if g.shape != w.shape:
            raise ParityError(f"FP16 output {name!r} at batch size {batch} has shape {g.shape}, fp32 {w.shape}")
        g = g.astype(np.float32)
        scale = _scale(w, g, config.atol_scale)  # fp16_atol's rule, computed once
        out.append((compare_output(name, batch, g, w, config.rtol, config.atol_scale * scale), scale))
    return out


def fp16_parity(fp32_path: str | Path, fp16_file: str | Path, feeds: Sequence[Feeds],
                config: Fp16Config | None = None) -> Fp16Parity:
    """Compare an FP16 file with its fp32 file on the same inputs (at least two batch sizes).

    The fp32 file runs on CPU; the FP16 file on ``config.provider``. Float inputs are cast to float16 for a graph
    that takes float16 inputs; outputs are compared in float64 with the rule of :func:`fp16_atol`.

    Returns
    -------
    Fp16Parity
        An :class:`Fp16Parity`; when either session cannot be created or run, its status is
        ``"not checked on <provider>: <reason>"`` and ``passed`` is ``None`` (never a silent pass).

    Raises
    ------
    ValueError
        fewer than two distinct batch sizes.
    ParityError
        an output changes shape.
    """
    config = config or Fp16Config()
    batches = [feed_rows(f) for f in feeds]
    if len(set(batches)) < 2:
        raise ValueError(f"FP16 parity needs inputs at two or more batch sizes, got batch sizes {batches}")
    base = Fp16Parity("", config.provider, config.rtol, config.atol_scale, batches)
    try:
        reference, session = _session(Path(fp32_path), "cpu"), _session(Path(fp16_file), config.provider)
        pairs = [pair for f in feeds for pair in _check_feed(reference, session, f, config)]
    except ParityError:
        raise
    except Exception as exc:
        status = f"not checked on {_provider_label(config.provider)}: {error_line(exc)}"
        logger.warning("%s: FP16 parity %s", Path(fp16_file).name, status)
        return replace(base, status=status)
    checks = [c for c, _ in pairs]
    passed = all(c.passed for c in checks)
    over = fp16_range_violations(Path(fp32_path), Path(fp16_file), feeds)
    status = "passed" if passed else "failed"
    if over:  # ONNX Runtime's CPU provider computes most fp16 ops in fp32, so the outputs alone can hide this
        name, peak = max(over, key=lambda kv: kv[1])
        status, passed = (f"failed: tensor {name!r} reaches {peak:.3g} in the fp32 file, beyond float16's "
                          f"{FP16_MAX:g} ({len(over)} tensor(s) in all); keep its nodes in float32 "
                          "(Fp16Config.keep_fp32_nodes)"), False
    return replace(base, status=status, checks=checks, passed=passed,
                   max_abs_err=max(c.max_abs_err for c in checks),
                   max_scaled_err=max(c.max_abs_err / scale for c, scale in pairs))


FP16_MAX = float(np.finfo(np.float16).max)
"""Largest finite float16 (65504)."""


def fp16_range_violations(fp32_path: Path, fp16_file: Path, feeds: Sequence[Feeds]) -> list[tuple[str, float]]:
    """Tensors that the FP16 file holds in float16 (and the graph outputs) whose fp32 values on ``feeds`` exceed
    :data:`FP16_MAX`, with their peak |value|: each would be inf in real float16 arithmetic. Models with external
    data are not checked (one in-memory protobuf holds at most 2 GiB)."""
    from minreal.runtime_bench.sessions import create_session

    if data_files(fp32_path):
        return []
    half_model = onnx.shape_inference.infer_shapes(onnx.load(str(fp16_file), load_external_data=False))
    half = {v.name for v in (*half_model.graph.value_info, *half_model.graph.output)
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    model = onnx.load(str(fp32_path))
    outputs = [o.name for o in model.graph.output]
    produced = {o for n in model.graph.node for o in n.output if o}
    extra = sorted((half & produced) - set(outputs))
    model.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in extra)
    session = create_session(model.SerializeToString())
    names = [o.name for o in session.get_outputs()]
    peaks: dict[str, float] = {}
    for feed in feeds:
        for name, value in zip(names, session.run(None, _typed_feeds(session, feed))):
            value = np.asarray(value)
            if value.dtype.kind == "f" and value.size:
                finite = np.abs(value[np.isfinite(value)])
                peak = float(finite.max()) if finite.size else 0.0
                if peak > FP16_MAX:
                    peaks[name] = max(peak, peaks.get(name, 0.0))
    return sorted(peaks.items())


def _raise_failed(parity: Fp16Parity, out: Path) -> None:
    """:class:`ParityError` naming the worst failing output, its batch size, measured and allowed (or the tensor
    beyond float16's range)."""
    failing = [c for c in parity.checks if not c.passed]
    if not failing:
        raise ParityError(f"FP16 parity of {out.name} {parity.status}", parity)
    worst = max(failing, key=lambda c: c.worst_measured / c.worst_allowed if c.worst_allowed else float("inf"))
    hint = ("; an output is not finite: a tensor exceeds float16's range (65504), keep its nodes in float32 "
            "(Fp16Config.keep_fp32_nodes)" if not np.isfinite(worst.worst_measured) else "")
    raise ParityError(
        f"FP16 output {worst.output!r} at batch size {worst.batch_size} differs from the fp32 file in {out.name}: "
        f"|diff| {worst.worst_measured:.3g} > allowed {worst.worst_allowed:.3g} (rtol={parity.rtol:.3g}, "
        f"atol={parity.atol_scale:.3g} x max|fp32|; {len(failing)} of {len(parity.checks)} checks failed){hint}",
        parity,
    )


def _subgraph_inputs(node: onnx.NodeProto) -> Iterable[str]:
    """Names read by the nodes of ``node``'s subgraphs (If/Loop/Scan bodies), outer-scope names included."""
    for attr in node.attribute:
        for graph in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
            for inner in graph.node:
                yield from inner.input
                yield from _subgraph_inputs(inner)


def _sort_topologically(graph: onnx.GraphProto) -> None:
    """Reorder ``graph.node`` so every node follows its producers, keeping the given order where it is free."""
    nodes = [onnx.NodeProto() for _ in graph.node]
    for copy, node in zip(nodes, graph.node):
        copy.CopyFrom(node)
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    needs = [{producer[name] for name in (*n.input, *_subgraph_inputs(n)) if producer.get(name, i) != i}
             for i, n in enumerate(nodes)]
    users: dict[int, list[int]] = collections.defaultdict(list)
    for i, deps in enumerate(needs):
        for j in deps:
            users[j].append(i)
    waiting = [len(d) for d in needs]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise ValueError("the FP16 graph has a cycle; it cannot be ordered topologically")
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)


def _check_nodes(model: onnx.ModelProto, names: Sequence[str]) -> None:
    unknown = sorted(set(names) - {n.name for n in model.graph.node})
    if unknown:
        raise ValueError(f"Fp16Config.keep_fp32_nodes names nodes {unknown} that are not in the graph")


def _converted(fp32_path: Path, config: Fp16Config, external: bool) -> onnx.ModelProto:
    """The FP16 model (shape inference on the graph alone, so a model over 2 GiB converts too)."""
    from onnx.external_data_helper import load_external_data_for_model
    from onnxruntime.transformers import float16

    model = onnx.shape_inference.infer_shapes(onnx.load(str(fp32_path), load_external_data=False))
    _check_nodes(model, config.keep_fp32_nodes)
    if external:
        load_external_data_for_model(model, str(fp32_path.parent))
    model = float16.convert_float_to_float16(
        model, keep_io_types=config.keep_io_types, disable_shape_infer=True,
        op_block_list=[*float16.DEFAULT_OP_BLOCK_LIST, *config.keep_fp32_ops],
        node_block_list=list(config.keep_fp32_nodes),
    )  # fmt: skip
    _sort_topologically(model.graph)
    return model


def _blocked(model: onnx.ModelProto, config: Fp16Config) -> dict[str, int]:
    """Op type → nodes of the converted graph the block lists kept in float32."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    ops = {*DEFAULT_OP_BLOCK_LIST, *config.keep_fp32_ops}
    hits = (n.op_type for n in model.graph.node if n.op_type in ops or n.name in config.keep_fp32_nodes)
    return dict(collections.Counter(hits))


def _save(model: onnx.ModelProto, path: Path, external: bool) -> None:
    """Write ``model`` at ``path``; its tensors in ``path.data`` when the fp32 file kept them outside too."""
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_file_name(path))
    else:
        onnx.save_model(model, str(path))


def _output_type(node: onnx.NodeProto, compute: int | None) -> int | None:
    """Element type of ``node``'s outputs: a Cast's target, a constant's type, else the type it computes in."""
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Cast" and "to" in attrs:
        return attrs["to"].i
    if node.op_type in ("Constant", "ConstantOfShape") and "value" in attrs:
        return attrs["value"].t.data_type
    return None if node.op_type in _NON_FLOAT_OUTPUT_OPS else compute


def kernel_precisions(path: str | Path, provider: str = "cpu") -> dict[str, dict[str, int]]:
    """``{"float16": {op: n}, "float32": {op: n}}``: the nodes (Casts aside) of the graph ONNX Runtime runs for
    ``provider`` after all its optimisations, by the precision of their first float input, traced from the graph
    inputs, initializers and Casts (nodes of subgraphs are not counted).

    Raises
    ------
    RuntimeError
        no session on ``provider`` (or it fell back to another provider).
    """
    with tempfile.TemporaryDirectory(prefix="minreal-fp16-") as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        _session(Path(path), provider, optimized)
        graph = onnx.load(str(optimized), load_external_data=False).graph
    types: dict[str, int | None] = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    types.update({t.name: t.data_type for t in graph.initializer})
    counts: dict[str, collections.Counter[str]] = {"float16": collections.Counter(), "float32": collections.Counter()}
    for node in graph.node:
        compute = next((types[n] for n in node.input if types.get(n) in _FLOAT_TYPES), None)
        types.update({out: _output_type(node, compute) for out in node.output})
        if compute is not None and node.op_type != "Cast":
            counts[_FLOAT_TYPES[compute]][node.op_type] += 1
    return {k: dict(v) for k, v in counts.items()}


def _precisions(path: Path, provider: str) -> dict[str, dict[str, int]]:
    """:func:`kernel_precisions`, or ``{}`` with a warning when ONNX Runtime cannot write its optimised graph (a
    diagnostic: it never stops a conversion whose parity passed)."""
    try:
        return kernel_precisions(path, provider)
    except (RuntimeError, OSError, ValueError) as exc:
        logger.warning("%s: cannot read the graph %s runs: %s", path.name, provider, error_line(exc))
        return {}


def _check_outputs(fp32_path: Path, out: Path) -> None:
    """Refuse an output (graph or its data file) that is the input graph or one of its data files."""
    ensure_distinct(fp32_path, out)
    taken = {f.resolve() for f in (fp32_path, *data_files(fp32_path))}
    for path in (out, out.with_name(data_file_name(out))):
        if path.resolve() in taken:
            raise SameFileError(f"output {path} is a file of the input model {fp32_path}; choose another output path")


def convert_fp16(fp32_path: str | Path, feeds: Sequence[Feeds], out_path: str | Path | None = None,
                 config: Fp16Config | None = None) -> Fp16Result:
    """Convert a verified fp32 ONNX file to FP16 and check it against the fp32 file.

    Parameters
    ----------
    fp32_path : str | Path
        the float32 model (not modified); its external data, if any, is converted too.
    feeds : Sequence[Feeds]
        inputs at two or more batch sizes (one array for a one-input graph, or arrays by input name), e.g.
        ``[feeds_of(b) for b in minreal.export.variant.parity_inputs(x)]``.
    out_path : str | Path | None
        destination (default :func:`fp16_path`, ``NAME.fp16.onnx`` beside the input); written
        atomically, only once parity passed or could not be checked on the provider.
    config : Fp16Config | None
        options; default :class:`Fp16Config` (fp32 I/O, checked on CPU).

    Returns
    -------
    Fp16Result
        An :class:`Fp16Result`; ``parity.status`` says ``"not checked on CPU: <reason>"`` when no session could
        run the files there (the file is still written: another provider may run it).

    Raises
    ------
    SameFileError
        ``out_path`` is the input (or one of its data files).
    ValueError
        ``config.keep_fp32_nodes`` names a node that is not in the graph, or fewer than two batch sizes.
    ParityError
        an output differs beyond the tolerance of :func:`fp16_atol` (the file is not written).
    """
    config = config or Fp16Config()
    fp32_path = Path(fp32_path)
    out = Path(out_path) if out_path is not None else fp16_path(fp32_path)
    _check_outputs(fp32_path, out)
    external = bool(data_files(fp32_path))
    model = _converted(fp32_path, config, external)
    with staged_onnx(out) as staged:
        _save(model, staged, external)
        parity = fp16_parity(fp32_path, staged, feeds, config)
        parity = replace(parity, status=parity.status.replace(str(staged), str(out)))
        if parity.passed is False:
            _raise_failed(parity, out)
        precisions = _precisions(staged, config.provider) if parity.checked else {}
    logger.info("%s: FP16 parity %s (max error %s of the output scale)", out.name, parity.status,
                "-" if parity.max_scaled_err is None else f"{parity.max_scaled_err:.3g}")
    return Fp16Result(
        fp32_path=str(fp32_path), out_path=str(out), keep_io_types=config.keep_io_types,
        size_fp32_bytes=onnx_size(fp32_path), size_fp16_bytes=onnx_size(out),
        nodes_fp32=len(onnx.load(str(fp32_path), load_external_data=False).graph.node),
        nodes_fp16=len(model.graph.node),
        node_counts=dict(collections.Counter(n.op_type for n in model.graph.node)),
        fp32_nodes=_blocked(model, config), provider_precisions=precisions, parity=parity,
    )  # fmt: skip
