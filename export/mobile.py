"""Fixed input shapes for edge runtimes, and ONNX Runtime's mobile-usability verdict (NNAPI, CoreML).

NNAPI runs no node whose input has a symbolic dimension, and CoreML is slower with them: an exported ResNet-20
runs 0 of its 54 nodes on NNAPI with a dynamic batch and all 54 once the batch is fixed.

- :func:`fix_shapes` writes a copy of an ONNX file with symbolic dimensions fixed, by dimension name or by
  input name with a full shape, with ONNX Runtime's own ``make_dim_param_fixed``/``make_input_shape_fixed``
  (what ``python -m onnxruntime.tools.make_dynamic_shape_fixed`` runs), then ONNX shape inference.
- :func:`fix_verified` replaces a verified export by its fixed copy once ONNX Runtime gives the same outputs
  at the fixed shape (parity at two batch sizes is checked on the dynamic graph before).
- :func:`mobile_usability` runs the analysis of ``python -m onnxruntime.tools.check_onnx_model_mobile_usability``
  in-process (the same optimisation, shape inference, partitioning and suitability rules, without its console
  log) and returns it typed; it never raises. About 40 ms for ResNet-20 once onnxruntime is imported.

The command-line form of a :class:`ShapeSpec` (:func:`parse_fixed_shapes`) is ``NAME=N`` for a dimension and
``INPUT=AxBxC`` for an input's whole shape, comma separated: ``batch=1``, ``batch=1,seq=128``,
``input_ids=1x128``. A plain integer always names a dimension and a value with an ``x`` always names an input,
so the two never clash (the dimension of a one-dimensional input is fixed by its name).
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from minreal.export.errors import ParityError
from minreal.export.onnx_files import iter_nodes
from minreal.export.quiet import Captured, captured_output
from minreal.export.verify import compare_output
from minreal.facts import error_line
from minreal.runtime_bench.atomic import atomic_path
from minreal.runtime_bench.sessions import create_session

__all__ = ["ShapeSpec", "parse_fixed_shapes", "FixedCheck", "FixedShapes", "fix_shapes", "check_fixed",
           "fix_verified", "EpUsability", "MobileUsability", "mobile_usability", "mobile_verdict",
           "ep_summary", "unsupported_summary", "usability_from_dict"]

logger = logging.getLogger(__name__)

Dim = int | str | None
Examples = np.ndarray | Mapping[str, np.ndarray]
"""Example inputs: one array for a one-input graph, or arrays by graph input name (batch first)."""

_DIM_VALUE = re.compile(r"[1-9][0-9]*")
_SHAPE_VALUE = re.compile(r"[1-9][0-9]*(?:x[1-9][0-9]*)+")


@dataclass(frozen=True)
class ShapeSpec:
    """What to fix: symbolic dimensions by name, whole input shapes by input name (pairs, so it stays hashable).

    Attributes
    ----------
    dims : tuple[tuple[str, int], ...]
        ``(dimension name, size)`` pairs, e.g. ``(("batch", 1),)``; minreal's exporter names axis 0 ``batch``.
    inputs : tuple[tuple[str, tuple[int, ...]], ...]
        ``(graph input name, full shape)`` pairs, e.g. ``(("input_ids", (1, 128)),)``.
    """

    dims: tuple[tuple[str, int], ...] = ()
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        names = [n for n, _ in self.dims] + [n for n, _ in self.inputs]
        if not names:
            raise ValueError("a fixed-shape spec needs at least one dimension (batch=1) or input (input=1x3x32x32)")
        if len(set(names)) != len(names):
            raise ValueError(f"a fixed-shape spec names {sorted(n for n in set(names) if names.count(n) > 1)} twice")
        sizes = [v for _, v in self.dims] + [d for _, s in self.inputs for d in s]
        if any(not isinstance(v, int) or v < 1 for v in sizes) or any(not s for _, s in self.inputs):
            raise ValueError(f"fixed sizes must be positive integers, got {self}")

    def batch(self) -> int | None:
        """The batch size of a file fixed by this spec (dimension ``batch`` or axis 0 of a named input's
        shape), or ``None`` when the batch stays dynamic."""
        sizes = {v for n, v in self.dims if n == "batch"} | {s[0] for _, s in self.inputs}
        return sizes.pop() if len(sizes) == 1 else None


def parse_fixed_shapes(text: str) -> ShapeSpec:
    """Parse the command-line form: ``NAME=N`` (a dimension) or ``INPUT=AxBxC`` (an input), comma separated.

    Raises
    ------
    ValueError
        an item that is neither form, a repeated name, or an empty spec; the message shows the syntax.
    """
    dims: list[tuple[str, int]] = []
    inputs: list[tuple[str, tuple[int, ...]]] = []
    for item in (part.strip() for part in text.split(",")):
        name, _, value = (s.strip() for s in item.rpartition("="))
        if name and _DIM_VALUE.fullmatch(value):
            dims.append((name, int(value)))
        elif name and _SHAPE_VALUE.fullmatch(value):
            inputs.append((name, tuple(int(v) for v in value.split("x"))))
        elif name and re.fullmatch(r"[0-9]+(?:x[0-9]+)*", value):  # the form is right, a size is 0 or 0-padded
            raise ValueError(f"fixed shape {item!r}: every size must be a whole number of 1 or more, without "
                             "leading zeros")
        else:
            raise ValueError(f"fixed shape {item!r} is neither DIM=N (batch=1) nor INPUT=AxBxC (input_ids=1x128); "
                             "separate several with commas")
    return ShapeSpec(tuple(dims), tuple(inputs))


@dataclass(frozen=True)
class FixedCheck:
    """ONNX Runtime's outputs of the fixed file against the dynamic one at the fixed shape.

    Attributes
    ----------
    shapes : dict[str, list[int]]
        graph input name → the shape fed.
    max_abs_err : float
        max ``|fixed - dynamic|`` over every output.
    rtol, atol : float
        tolerances (``numpy.allclose``'s rule).
    passed : bool
        every output within tolerance.
    """

    shapes: dict[str, list[int]]
    max_abs_err: float
    rtol: float
    atol: float
    passed: bool


@dataclass(frozen=True)
class FixedShapes:
    """What :func:`fix_shapes` fixed.

    Attributes
    ----------
    dims : dict[str, int]
        dimension name → size, as asked.
    inputs : dict[str, list[int]]
        graph input name → full shape, as asked.
    input_shapes : dict[str, list[int | str]]
        every graph input's shape in the written file (a string for a dimension left symbolic).
    dynamic_inputs : list[str]
        graph inputs that still have a symbolic dimension (NNAPI cannot run nodes fed by them).
    check : FixedCheck | None
        the fixed file checked against the dynamic one (:func:`fix_verified`), else ``None``.
    """

    dims: dict[str, int]
    inputs: dict[str, list[int]]
    input_shapes: dict[str, list[int | str]]
    dynamic_inputs: list[str]
    check: FixedCheck | None = None


def _graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers (what a caller feeds)."""
    initializers = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in initializers]


def _shape(value: onnx.ValueInfoProto) -> list[Dim]:
    """A tensor's dims: an int, the symbolic name, or ``None`` when unknown."""
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
            for d in value.type.tensor_type.shape.dim]


def _check_names(graph: onnx.GraphProto, dims: Mapping[str, int], inputs: Mapping[str, tuple[int, ...]]) -> None:
    """Raise ``ValueError`` naming an unknown dimension or input (and listing the model's), or a wrong rank."""
    shapes = {i.name: _shape(i) for i in _graph_inputs(graph)}
    symbols = sorted({d for s in shapes.values() for d in s if isinstance(d, str)})
    unknown = sorted(set(dims) - set(symbols))
    if unknown:
        raise ValueError(f"no input dimension named {unknown} in the model; its symbolic dimensions are {symbols} "
                         f"(inputs {shapes})")
    for name, shape in inputs.items():
        if name not in shapes:
            raise ValueError(f"no graph input named {name!r}; the inputs are {shapes}")
        if len(shape) != len(shapes[name]):
            raise ValueError(f"input {name!r} has {len(shapes[name])} dimensions {shapes[name]}, the fixed shape "
                             f"{list(shape)} has {len(shape)}")


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference with the fixed inputs: intermediate shapes left symbolic are dropped and inferred again."""
    from onnxruntime.tools.onnx_model_utils import fix_output_shapes, is_fixed_size_tensor

    fix_output_shapes(model)
    kept = [v for v in model.graph.value_info if is_fixed_size_tensor(v)]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def fix_shapes(src: str | os.PathLike[str], dst: str | os.PathLike[str], dims: Mapping[str, int] | None = None,
               inputs: Mapping[str, tuple[int, ...]] | None = None) -> FixedShapes:
    """Write ``dst``: ``src`` with symbolic dimensions fixed, then ONNX shape inference (written atomically).

    Parameters
    ----------
    src : str | os.PathLike[str]
        ONNX file (``dst`` may be the same path).
    dst : str | os.PathLike[str]
        destination ``.onnx``.
    dims : Mapping[str, int] | None
        dimension name → size, fixed wherever the name appears (``{"batch": 1}``).
    inputs : Mapping[str, tuple[int, ...]] | None
        graph input name → full shape (``{"input_ids": (1, 128)}``); a symbolic dimension it replaces
        is fixed everywhere else too.

    Returns
    -------
    FixedShapes
        A :class:`FixedShapes` with the written inputs' shapes and those still dynamic.

    Raises
    ------
    ValueError
        an unknown dimension or input name (the message lists the model's), a rank that differs, or
        a size that contradicts a dimension already fixed.
    """
    from onnxruntime.tools.onnx_model_utils import make_dim_param_fixed, make_input_shape_fixed

    dims, inputs = dict(dims or {}), {k: tuple(v) for k, v in (inputs or {}).items()}
    model = onnx.load(str(src))
    _check_names(model.graph, dims, inputs)
    for name, size in dims.items():
        make_dim_param_fixed(model.graph, name, size)
    for name, shape in inputs.items():
        try:
            make_input_shape_fixed(model.graph, name, list(shape))
        except ValueError as exc:
            raise ValueError(f"input {name!r} cannot take the shape {list(shape)}: {error_line(exc)}") from None
    model = _infer(model)
    with atomic_path(dst) as tmp:
        onnx.save(model, str(tmp))
    shapes = {i.name: _shape(i) for i in _graph_inputs(model.graph)}
    return FixedShapes(dims, {k: list(v) for k, v in inputs.items()}, shapes,
                       [n for n, s in shapes.items() if not all(isinstance(d, int) for d in s)])


def _fill(name: str, array: np.ndarray, shape: list[Dim]) -> np.ndarray:
    """``array`` with its rows repeated or cut to a fixed batch; ``ValueError`` if another fixed dim differs."""
    rows = shape[0] if shape and isinstance(shape[0], int) else len(array)
    out = np.concatenate([array] * math.ceil(rows / len(array)))[:rows]
    if out.ndim != len(shape) or any(isinstance(d, int) and d != n for d, n in zip(shape[1:], out.shape[1:])):
        raise ValueError(f"input {name!r} is fixed to {shape} but the example data has shape {list(array.shape)}; "
                         "fix only dimensions the data has, or give data of that shape")
    return out


def _fixed_feeds(model: onnx.ModelProto, examples: Examples) -> dict[str, np.ndarray]:
    """Feeds at the fixed shapes of ``model``'s inputs, from the example rows."""
    graph_inputs = _graph_inputs(model.graph)
    if not isinstance(examples, Mapping):
        if len(graph_inputs) != 1:
            raise ValueError(f"the graph has inputs {[i.name for i in graph_inputs]}; give examples by input name")
        examples = {graph_inputs[0].name: examples}
    missing = sorted({i.name for i in graph_inputs} - set(examples))
    if missing:
        raise ValueError(f"no example data for graph input(s) {missing}")
    return {i.name: _fill(i.name, np.asarray(examples[i.name]), _shape(i)) for i in graph_inputs}


def check_fixed(dynamic: str | os.PathLike[str], fixed: str | os.PathLike[str], examples: Examples,
                rtol: float, atol: float) -> FixedCheck:
    """Run both files with ONNX Runtime at the fixed shape and compare every output.

    Parameters
    ----------
    dynamic : str | os.PathLike[str]
        the verified file with symbolic dimensions.
    fixed : str | os.PathLike[str]
        its copy from :func:`fix_shapes`.
    examples : Examples
        example rows (repeated or cut to a fixed batch).
    rtol, atol : float
        tolerances, ``|fixed - dynamic| <= atol + rtol * |dynamic|``.

    Raises
    ------
    ParityError
        an output differs beyond the tolerance (or in shape).
    ValueError
        the examples do not fit the fixed shape.
    """
    feeds = _fixed_feeds(onnx.load(str(fixed), load_external_data=False), examples)
    want = create_session(Path(dynamic)).run(None, feeds)
    session = create_session(Path(fixed))
    got = session.run(None, feeds)
    names = [o.name for o in session.get_outputs()]
    bad = [n for n, g, w in zip(names, got, want) if g.shape != w.shape]
    if bad:
        raise ParityError(f"fixed-shape file {Path(fixed).name}: output(s) {bad} change shape")
    checks = [compare_output(n, len(g), g, w, rtol, atol) for n, g, w in zip(names, got, want)]
    result = FixedCheck({k: list(v.shape) for k, v in feeds.items()}, max(c.max_abs_err for c in checks), rtol,
                        atol, all(c.passed for c in checks))
    if not result.passed:
        raise ParityError(f"fixed-shape file {Path(fixed).name} differs from the dynamic graph: max |diff| "
                          f"{result.max_abs_err:.3g} (rtol={rtol:g}, atol={atol:g}, inputs {result.shapes})", result)
    return result


def fix_verified(path: str | os.PathLike[str], spec: ShapeSpec | None, examples: Examples, rtol: float,
                 atol: float) -> FixedShapes | None:
    """Replace the verified dynamic file ``path`` by its fixed copy, once both give the same outputs.

    Parity at two batch sizes cannot run on a fixed-batch file, so it is checked on the dynamic graph first
    (:func:`minreal.export.verify.verify_parity`); this checks the fixed copy against that graph at the fixed shape.

    Returns
    -------
    FixedShapes | None
        ``None`` without a spec (``path`` untouched), else the :class:`FixedShapes` with its check.
    """
    if spec is None:
        return None
    with atomic_path(path) as tmp:  # path keeps the dynamic graph unless the check passes
        fixed = fix_shapes(path, tmp, dict(spec.dims), dict(spec.inputs))
        check = check_fixed(path, tmp, examples, rtol, atol)
    return FixedShapes(fixed.dims, fixed.inputs, fixed.input_shapes, fixed.dynamic_inputs, check)


@dataclass(frozen=True)
class EpUsability:
    """ONNX Runtime's mobile-usability analysis of one execution provider (op support by type, as the checker).

    Attributes
    ----------
    ep : str
        the checker's name for it (``NNAPI``, ``CoreML NeuralNetwork``, ``CoreML MLProgram``).
    partitions : int
        node groups the provider would take (each a device round trip).
    partition_sizes : list[int]
        nodes per partition.
    supported_nodes, nodes : int
        nodes the provider would run, of all nodes (after basic optimisation).
    unsupported_ops : dict[str, int]
        op → nodes the provider cannot run because of the op (``domain:op`` outside ai.onnx).
    dynamic_shape_nodes : int
        nodes it cannot run only because an input has a symbolic dimension.
    suitability : str
        the checker's verdict for the file as it is: ``YES``, ``MAYBE`` or ``NO``.
    supported_nodes_if_fixed, partitions_if_fixed, suitability_if_fixed
        the same with every shape fixed
        (``None`` when the file has no dynamic input).
    """

    ep: str
    partitions: int
    partition_sizes: list[int]
    supported_nodes: int
    nodes: int
    unsupported_ops: dict[str, int]
    dynamic_shape_nodes: int
    suitability: str
    supported_nodes_if_fixed: int | None = None
    partitions_if_fixed: int | None = None
    suitability_if_fixed: str | None = None


@dataclass(frozen=True)
class MobileUsability:
    """ONNX Runtime's mobile-usability verdict of one ONNX file.

    Attributes
    ----------
    eps : dict[str, EpUsability]
        ``nnapi``, ``coreml`` (NeuralNetwork format) and ``coreml_mlprogram`` → :class:`EpUsability`.
    dynamic_inputs : list[str]
        graph inputs with a symbolic dimension.
    try_accelerator : bool
        the checker's overall recommendation: ``True`` when NNAPI or CoreML may pay (compare
        it with the CPU EP on the device), ``False`` for the CPU EP.
    recommendation : str
        that recommendation in one line.
    error : str | None
        why the analysis failed (one line), else ``None``; the other fields are then empty.
    """

    eps: dict[str, EpUsability] = field(default_factory=dict)
    dynamic_inputs: list[str] = field(default_factory=list)
    try_accelerator: bool = False
    recommendation: str = ""
    error: str | None = None


def _checkers() -> dict[str, tuple[str, Callable[[onnx.ModelProto, bool], Any]]]:
    """Key → (checker's provider name, its partition check) for every provider the checker knows."""
    from onnxruntime.tools.mobile_helpers import usability_checker as uc

    def coreml(ops_file: str) -> Callable[[onnx.ModelProto, bool], Any]:
        return lambda model, require_fixed: uc.check_coreml_partitions(model, require_fixed, ops_file)

    return {"nnapi": ("NNAPI", uc.check_nnapi_partitions),
            "coreml": ("CoreML NeuralNetwork", coreml("coreml_supported_neuralnetwork_ops.md")),
            "coreml_mlprogram": ("CoreML MLProgram", coreml("coreml_supported_mlprogram_ops.md"))}


def _op_counts(graph: onnx.GraphProto, ops: set[str]) -> dict[str, int]:
    """Nodes of each ``domain:op`` in ``ops`` (the checker's names), keyed ``op`` in ai.onnx, else ``domain:op``."""
    counts = Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in iter_nodes(graph))
    return {op.removeprefix("ai.onnx:"): counts[op] for op in sorted(ops)}


def _ep(name: str, check: Callable[[onnx.ModelProto, bool], Any], model: onnx.ModelProto,
        dynamic: bool) -> EpUsability:
    """One provider as the checker rates it: shapes as they are, and (for a dynamic model) fixed."""
    info = check(model, True)
    usable = EpUsability(name, info.num_partitions, [len(g) for g in info.supported_groups], info.num_supported_nodes,
                         info.num_nodes, _op_counts(model.graph, info.unsupported_ops),
                         info.nodes_unsupported_due_to_dynamic_input, info.suitability().name)
    if not dynamic:
        return usable
    fixed = check(model, False)
    return replace(usable, supported_nodes_if_fixed=fixed.num_supported_nodes, partitions_if_fixed=fixed.num_partitions,
                   suitability_if_fixed=fixed.suitability().name)


def _recommend(eps: dict[str, EpUsability]) -> tuple[bool, str]:
    """The checker's overall advice: try an accelerator when any provider (fixed or not) is not ``NO``."""
    best = {k: max((e.suitability, e.suitability_if_fixed or "NO"), key=("NO", "MAYBE", "YES").index)
            for k, e in eps.items()}
    good = [k for k, s in best.items() if s != "NO"]
    if not good:
        return False, "use the CPU EP: neither NNAPI nor CoreML would run enough of the model in few partitions"
    needs_fixing = [eps[k].ep for k in good if eps[k].suitability == "NO"]
    fix = f" (only with fixed shapes for {', '.join(needs_fixing)}: --fixed-shapes)" if needs_fixing else ""
    return True, f"compare {', '.join(eps[k].ep for k in good)} with the CPU EP on the device{fix}"


def _analyse(path: Path, tmp: Path) -> MobileUsability:
    """The checker's ``analyze_model``: basic ORT optimisation, shape inference, partitions per provider."""
    from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, is_fixed_size_tensor, optimize_model

    optimized = tmp / path.name
    optimize_model(path, optimized, use_external_initializers=True)
    model = ModelProtoWithShapeInfo(optimized).model_with_shape_info
    dynamic = [i.name for i in _graph_inputs(model.graph) if not is_fixed_size_tensor(i)]
    eps = {k: _ep(name, check, model, bool(dynamic)) for k, (name, check) in _checkers().items()}
    try_eps, line = _recommend(eps)
    return MobileUsability(eps, dynamic, try_eps, line)


def mobile_usability(path: str | os.PathLike[str]) -> MobileUsability:
    """ONNX Runtime's mobile-usability check of ``path`` for NNAPI and CoreML, in-process and silent.

    The same analysis as ``python -m onnxruntime.tools.check_onnx_model_mobile_usability`` (its
    ``usability_checker`` functions), returned typed instead of logged. Op support is by op type (the
    checker's lists); caveats such as "only 2-D Conv" are not checked. The checker sets ``onnx.NodeProto``'s
    hash to the object id (process-wide; protobuf messages are otherwise unhashable).

    Returns
    -------
    MobileUsability
        A :class:`MobileUsability`; never raises: a failure is its ``error`` line (and a debug log record).
    """
    printed = Captured()
    try:
        with tempfile.TemporaryDirectory(prefix=".minreal-mobile-") as tmp, captured_output() as printed:
            return _analyse(Path(path), Path(tmp))
    except Exception as exc:
        logger.debug("mobile-usability check of %s failed: %s\n%s", path, exc, printed.text)
        return MobileUsability(error=f"mobile-usability check failed: {error_line(exc, with_type=True)}")


def ep_summary(e: EpUsability) -> str:
    """``54/54 nodes in 1 partition(s) (YES)``, and for a dynamic file what fixing the shapes would give."""
    cell = f"{e.supported_nodes}/{e.nodes} nodes in {e.partitions} partition(s) ({e.suitability}"
    if e.supported_nodes_if_fixed is not None:
        cell += (f"; with fixed shapes {e.supported_nodes_if_fixed}/{e.nodes} in {e.partitions_if_fixed}, "
                 f"{e.suitability_if_fixed}")
    return cell + ")"


def unsupported_summary(m: MobileUsability) -> str:
    """``CoreML NeuralNetwork: ReduceMean; CoreML MLProgram: Pad x2`` (``-`` when every op is supported)."""
    parts = [f"{e.ep}: " + ", ".join(op + (f" x{n}" if n > 1 else "") for op, n in e.unsupported_ops.items())
             for e in m.eps.values() if e.unsupported_ops]
    return "; ".join(parts) or "-"


def usability_from_dict(d: Mapping[str, Any]) -> MobileUsability:
    """A :class:`MobileUsability` back from its dict (a record's ``mobile`` field in report.json)."""
    eps = {k: EpUsability(**v) for k, v in (d.get("eps") or {}).items()}
    return MobileUsability(eps, list(d.get("dynamic_inputs") or []), bool(d.get("try_accelerator")),
                           str(d.get("recommendation", "")), d.get("error"))


def mobile_verdict(usability: Mapping[str, Any] | MobileUsability) -> str:
    """One line: nodes per provider and the recommendation (from the dataclass or a record's ``mobile`` dict)."""
    m = usability if isinstance(usability, MobileUsability) else usability_from_dict(usability)
    if m.error:
        return m.error
    cells = "; ".join(f"{e.ep} {ep_summary(e)}" for e in m.eps.values())
    return f"mobile: {cells} - {m.recommendation}"
