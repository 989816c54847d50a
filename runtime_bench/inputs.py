"""Model input specifications (read from the ONNX file, or an ORT-format file's session) and timing inputs built
from them.

Data ``x`` is either one array (for single-input models) or a mapping from graph input name to array; every
array holds the same number of rows along axis 0.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from minreal.facts import error_line

from .errors import BenchInputError, ModelFileError

if TYPE_CHECKING:  # onnx (1-2 s with ml_dtypes) is imported where a file is read, not by a timing worker
    import onnx

__all__ = ["InputSpec", "Data", "has_qdq", "input_specs", "index_bounds", "timing_inputs", "batch_inputs", "named_data",
           "check_values", "data_rows", "take_rows", "symbolic_axes", "check_batch", "load_model_proto",
           "check_external_data", "external_tensors", "data_digest", "ORT_SUFFIX"]

Dim = int | str | None
#: Evaluation/timing data: one array (single-input models) or arrays keyed by graph input name.
Data = np.ndarray | Mapping[str, np.ndarray]
ORT_SUFFIX = ".ort"
"""The suffix by which ONNX Runtime loads a file in its ORT format (flatbuffers) rather than as ONNX."""
#: ONNX Runtime's tensor type names (``tensor(float)``) → numpy dtype names, for an ``.ort`` file's inputs.
_ORT_TYPES = {"float": "float32", "double": "float64", "float16": "float16", "int64": "int64", "int32": "int32",
              "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool"}
#: Ops an index tensor may pass through unchanged on its way to a Gather (see :func:`index_bounds`).
_INDEX_PASS_THROUGH = ("Cast", "Identity")


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, numpy dtype name and shape (int, symbolic name, or None if unknown).

    ``high`` is the exclusive upper bound of valid values of an integer input that indexes an embedding
    table (see :func:`index_bounds`); None when the graph gives none.
    """

    name: str
    dtype: str
    shape: tuple[Dim, ...]
    high: int | None = None

    def fixed_batch(self) -> int | None:
        """The batch dimension if it is a fixed integer, else None (dynamic)."""
        first = self.shape[0] if self.shape else None
        return first if isinstance(first, int) else None


def load_model_proto(path: Path, load_external_data: bool = False) -> onnx.ModelProto:
    """Load an ONNX model, raising :class:`ModelFileError` naming the file on any failure."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises several unrelated types for corrupt files
        raise ModelFileError(f"cannot read ONNX model {path}: {error_line(exc, with_type=True)}; is it an ONNX "
                             "file (written completely)?") from None
    if not model.graph.output:  # protobuf reads any bytes, none included, as an empty message
        size = path.stat().st_size
        raise ModelFileError(f"ONNX model {path} holds no graph ({'an empty file' if not size else f'{size} bytes'} "
                             "with no outputs); is it an ONNX file (written completely)?")
    check_external_data(model, path)
    if load_external_data:
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except Exception as exc:
            raise ModelFileError(f"cannot read the external data of ONNX model {path}: "
                                 f"{error_line(exc, with_type=True)}") from None
    return model


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers and tensor attributes of ``graph`` and of its subgraphs (If/Loop/Scan bodies)."""
    yield from graph.initializer
    yield from (sparse.values for sparse in graph.sparse_initializer)
    for node in graph.node:
        for attr in node.attribute:
            yield from ([attr.t] if attr.HasField("t") else [])
            yield from attr.tensors
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                yield from _tensors(sub)


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Tensors (subgraphs included) whose data lives in another file."""
    import onnx

    return [t for t in _tensors(model.graph) if t.data_location == onnx.TensorProto.EXTERNAL]


def check_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Refuse external-data locations that are absolute or leave the model's folder (e.g. ``../../etc/x``).

    Nothing is read: the locations are only resolved (symlinks included) and compared with the folder.
    """
    folder = Path(path).parent.resolve()
    for tensor in external_tensors(model):
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not location or Path(location).is_absolute() or folder not in target.parents:
            raise ModelFileError(f"ONNX model {path}: tensor {tensor.name!r} keeps its data at {location!r}, outside "
                                 "the model's folder; refusing to read it — keep external data files next to the model")


def has_qdq(path: Path) -> bool:
    """Whether the model at ``path`` holds QuantizeLinear/DequantizeLinear nodes (an explicitly quantised file)."""
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in load_model_proto(Path(path)).graph.node)


def input_specs(path: Path) -> list[InputSpec]:
    """Graph inputs of the model at ``path`` that are not initializers; of an ORT-format file (``.ort``, which the
    onnx package cannot read), as ONNX Runtime's session reports them (no embedding bounds)."""
    if Path(path).suffix == ORT_SUFFIX:
        return _ort_input_specs(Path(path))
    graph = load_model_proto(path).graph
    initializers = {init.name for init in graph.initializer}
    bounds = index_bounds(graph)
    return [_spec(value, bounds.get(value.name), path) for value in graph.input if value.name not in initializers]


def _ort_input_specs(path: Path) -> list[InputSpec]:
    """The inputs of an ORT-format file, read from a CPU session."""
    from .sessions import create_session

    specs = []
    for arg in create_session(path).get_inputs():
        dtype = arg.type.removeprefix("tensor(").removesuffix(")")
        if dtype not in _ORT_TYPES:
            raise BenchInputError(f"{path}: input {arg.name!r} has type {arg.type}, which the benchmark cannot feed")
        specs.append(InputSpec(arg.name, _ORT_TYPES[dtype], tuple(d if isinstance(d, int) else d or None
                                                                  for d in arg.shape)))
    return specs


def index_bounds(graph: onnx.GraphProto) -> dict[str, int]:
    """Exclusive upper bounds of graph inputs that index an embedding table.

    An input that feeds (directly or through Cast/Identity nodes) the indices of a ``Gather`` whose data is an
    initializer only takes values in ``[0, dims[axis])`` of that initializer; with several such Gathers the
    smallest bound holds. Inputs without such a Gather are absent.
    """
    tables = {init.name: tuple(init.dims) for init in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    bounds = {value.name: _gather_bound(value.name, consumers, tables) for value in graph.input}
    return {name: bound for name, bound in bounds.items() if bound is not None}


def _gather_bound(name: str, consumers: Mapping[str, list[onnx.NodeProto]],
                  tables: Mapping[str, tuple[int, ...]]) -> int | None:
    """Smallest table length among the Gathers that ``name`` (or a Cast/Identity of it) indexes."""
    found, pending, seen = [], [name], set()
    while pending:
        tensor = pending.pop()
        seen.add(tensor)
        for node in consumers.get(tensor, ()):
            if node.op_type in _INDEX_PASS_THROUGH and node.domain in ("", "ai.onnx"):
                pending += [out for out in node.output if out not in seen]
            elif node.op_type == "Gather" and node.input[1:2] == [tensor] and node.input[0] in tables:
                found.append(_axis_length(node, tables[node.input[0]]))
    found = [length for length in found if length is not None and length > 0]
    return min(found) if found else None


def _axis_length(gather: onnx.NodeProto, dims: tuple[int, ...]) -> int | None:
    """Length of the table ``dims`` along the Gather's ``axis`` (default 0); None if out of range."""
    import onnx

    axis = next((onnx.helper.get_attribute_value(a) for a in gather.attribute if a.name == "axis"), 0)
    axis = axis + len(dims) if axis < 0 else axis
    return dims[axis] if 0 <= axis < len(dims) else None


def _spec(value: onnx.ValueInfoProto, high: int | None = None, path: Path | None = None) -> InputSpec:
    import onnx

    tensor = value.type.tensor_type
    where = f"ONNX model {path}" if path is not None else "the ONNX model"
    if value.type.WhichOneof("value") != "tensor_type":
        raise BenchInputError(f"{where}: input {value.name!r} is a {value.type.WhichOneof('value') or 'typeless'} "
                              "value, not a tensor; the benchmark feeds tensors only")
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
    except (KeyError, TypeError, ValueError):  # 0 (UNDEFINED), or a number no ONNX type has: a damaged file
        raise BenchInputError(f"{where}: input {value.name!r} has element type {tensor.elem_type}, which is no "
                              "ONNX tensor type the benchmark can feed (is the file damaged?)") from None
    shape = tuple(_dim(d) for d in tensor.shape.dim)
    return InputSpec(name=value.name, dtype=dtype, shape=shape, high=high)


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    if dim.HasField("dim_value"):
        return int(dim.dim_value)
    return dim.dim_param or None


def timing_inputs(
    specs: list[InputSpec],
    batch_size: int,
    x: Data | None,
    seed: int,
    model: str,
    axis_values: Mapping[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Inputs for timing one model at ``batch_size`` and one shape.

    With data, each input takes the first ``batch_size`` rows of its array (tiled if there are fewer), cut
    to ``axis_values[name]`` along every symbolic axis ``name`` given there; data shorter than a requested
    length is an error (never padded). Without data, seeded random values fill the input's shape (batch set
    to ``batch_size``, symbolic axes to ``axis_values``): standard-normal floats; integers in
    ``[0, spec.high)`` where the graph bounds them (indices of an embedding table), else ones (e.g. an
    attention mask with every position valid); booleans True. A symbolic axis without a value is an error.

    Parameters
    ----------
    specs : list[InputSpec]
        The model's inputs (:func:`input_specs`).
    batch_size : int
        Rows per run.
    x : Data | None
        Data (one array for a single-input model, or arrays keyed by input name), or None.
    seed : int
        Seed of the random inputs.
    model : str
        Model name, for error messages.
    axis_values : Mapping[str, int] | None
        One value per symbolic axis name (``dim_param``) to time at.
    """
    check_batch(specs, batch_size, model)
    values = axis_values or {}
    if x is not None:
        named = named_data(specs, x, model)
        return {s.name: _cast(_narrow(_tile(named[s.name], batch_size), s, values, model), s, model) for s in specs}
    rng = np.random.default_rng(seed)
    return {spec.name: _random(spec, batch_size, rng, model, values) for spec in specs}


def batch_inputs(specs: list[InputSpec], rows: Data, model: str) -> dict[str, np.ndarray]:
    """Feed a batch of data rows (one array, or arrays keyed by input name) to the model, cast to its dtypes."""
    named = named_data(specs, rows, model)
    return {spec.name: _cast(named[spec.name], spec, model) for spec in specs}


def named_data(specs: list[InputSpec], x: Data, model: str) -> dict[str, np.ndarray]:
    """``x`` keyed by the model's input names: an array feeds a single-input model; a mapping names each input.

    Raises
    ------
    BenchInputError
        an array for a model with several inputs, or a mapping missing an input or holding
        a name the model has no input for.
    """
    if not isinstance(x, Mapping):
        single = {_single_input(specs, model).name: np.asarray(x)}
        check_values(specs, single, model)
        return single
    names = [s.name for s in specs]
    missing = [n for n in names if n not in x]
    if missing:
        raise BenchInputError(f"model {model!r} input {', '.join(map(repr, missing))} has no array in data x "
                              f"(x holds {list(x)}); key x by the model's input names {names}")
    extra = [k for k in x if k not in names]
    if extra:
        raise BenchInputError(f"data x holds {', '.join(map(repr, extra))} but model {model!r} has no such input "
                              f"(its inputs are {names}); drop it from x")
    named = {n: np.asarray(x[n]) for n in names}
    check_values(specs, named, model)
    return named


def check_values(specs: list[InputSpec], named: Mapping[str, np.ndarray], model: str) -> None:
    """Refuse data the graph cannot take, before ONNX Runtime meets it: indices outside an embedding table the
    graph bounds (:func:`index_bounds`), and inputs that share a symbolic axis but differ in its length.

    Raises
    ------
    BenchInputError
        naming the input, the values or lengths found and what the graph allows.
    """
    for spec in specs:
        array = named[spec.name]
        if spec.high is not None and array.size and array.dtype.kind in "iu" \
                and (int(array.min()) < 0 or int(array.max()) >= spec.high):
            raise BenchInputError(f"data for model {model!r} input {spec.name!r} holds values "
                                  f"{int(array.min())}..{int(array.max())}, but it indexes a table of {spec.high} "
                                  f"rows (valid 0..{spec.high - 1})")
    lengths: dict[str, dict[str, int]] = {}
    for spec in specs:
        for axis, dim in enumerate(spec.shape[1:], start=1):
            if isinstance(dim, str) and dim and named[spec.name].ndim > axis:
                lengths.setdefault(dim, {})[spec.name] = int(named[spec.name].shape[axis])
    for dim, by_input in lengths.items():
        if len(set(by_input.values())) > 1:
            shown = ", ".join(f"{name} {n}" for name, n in by_input.items())
            raise BenchInputError(f"data for model {model!r}: inputs sharing axis {dim!r} differ in its length "
                                  f"({shown}); give them arrays of one length")


def data_rows(x: Data) -> int:
    """Rows of ``x`` along axis 0; every array must have at least one, and a mapping's arrays the same count."""
    arrays = {f"x[{k!r}]": np.asarray(v) for k, v in x.items()} if isinstance(x, Mapping) else {"x": np.asarray(x)}
    if not arrays:
        raise BenchInputError("data x is an empty mapping; key it by the models' input names")
    for label, array in arrays.items():
        if array.ndim < 1 or len(array) == 0:
            raise BenchInputError(f"{label} must have at least one row, got shape {array.shape}")
    counts = {label: len(array) for label, array in arrays.items()}
    if len(set(counts.values())) > 1:
        raise BenchInputError(f"data x arrays have different row counts ({counts}); every input needs the same rows")
    return next(iter(counts.values()))


def take_rows(x: Data, start: int, stop: int) -> Data:
    """Rows ``start:stop`` of ``x`` (of every array of a mapping)."""
    if isinstance(x, Mapping):
        return {name: array[start:stop] for name, array in x.items()}
    return x[start:stop]


def symbolic_axes(specs: list[InputSpec]) -> set[str]:
    """Names (``dim_param``) of the symbolic axes beyond batch of ``specs``."""
    return {dim for spec in specs for dim in spec.shape[1:] if isinstance(dim, str)}


def check_batch(specs: list[InputSpec], batch_size: int, model: str) -> None:
    """Raise if an input has a fixed batch dimension different from ``batch_size``."""
    for spec in specs:
        fixed = spec.fixed_batch()
        if fixed is not None and fixed != batch_size:
            raise BenchInputError(
                f"model {model!r} input {spec.name!r} has fixed batch size {fixed}; cannot run batch {batch_size}"
            )


def _single_input(specs: list[InputSpec], model: str) -> InputSpec:
    if len(specs) != 1:
        names = [s.name for s in specs]
        raise BenchInputError(f"model {model!r} has {len(specs)} inputs {names}; an array x feeds single-input models "
                              "only: pass x as a dict keyed by input name")
    return specs[0]


def _tile(rows: np.ndarray, batch_size: int) -> np.ndarray:
    """The first ``batch_size`` rows, repeating ``rows`` when it has fewer."""
    reps = -(-batch_size // len(rows))
    return np.concatenate([rows] * reps)[:batch_size] if reps > 1 else rows[:batch_size]


def _narrow(rows: np.ndarray, spec: InputSpec, values: Mapping[str, int], model: str) -> np.ndarray:
    """Cut ``rows`` to ``values[dim]`` along each symbolic axis ``dim`` of ``spec`` given a value."""
    for axis, dim in enumerate(spec.shape[1 : rows.ndim], start=1):
        if not isinstance(dim, str) or dim not in values:
            continue
        if values[dim] > rows.shape[axis]:
            raise BenchInputError(
                f"model {model!r} input {spec.name!r} axis {axis} ({dim!r}) has length {rows.shape[axis]} in the "
                f"data, shorter than the requested {dim}={values[dim]}; pass longer data or a smaller "
                f"axis_values[{dim!r}] (data is never padded)")
        rows = rows[(slice(None),) * axis + (slice(0, values[dim]),)]
    return rows


def _cast(rows: np.ndarray, spec: InputSpec, model: str) -> np.ndarray:
    expected = tuple(spec.shape[1:])
    got = rows.shape[1:]
    if len(got) != len(expected) or any(isinstance(e, int) and e != g for e, g in zip(expected, got)):
        raise BenchInputError(f"data rows of shape {got} do not fit model {model!r} input {spec.name!r} {spec.shape}")
    if not np.can_cast(rows.dtype, spec.dtype, casting="same_kind"):
        raise BenchInputError(f"data dtype {rows.dtype} cannot feed model {model!r} input {spec.name!r} ({spec.dtype})")
    return np.ascontiguousarray(rows, dtype=spec.dtype)


def _random(
    spec: InputSpec, batch_size: int, rng: np.random.Generator, model: str, values: Mapping[str, int]
) -> np.ndarray:
    """Seeded values valid for ``spec`` (see :func:`timing_inputs`)."""
    shape = (batch_size, *(_size(spec, axis, values, model) for axis in range(1, len(spec.shape))))
    dtype = np.dtype(spec.dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return np.ones(shape, dtype=bool)
    if dtype.kind in "iu" and spec.high is not None:
        return rng.integers(0, min(spec.high, int(np.iinfo(dtype).max) + 1), size=shape, dtype=dtype)
    if dtype.kind in "iu":
        return np.ones(shape, dtype=dtype)  # not an index: a mask or flag, where 1 (all valid) is safe
    raise BenchInputError(f"model {model!r} input {spec.name!r} is {spec.dtype}; pass data x to time it")


def _size(spec: InputSpec, axis: int, values: Mapping[str, int], model: str) -> int:
    """Length of ``spec`` along ``axis`` (>= 1): fixed, or the value given for its symbolic name."""
    dim = spec.shape[axis]
    if isinstance(dim, int):
        return dim
    if dim in values:
        return values[dim]
    if not dim:
        raise BenchInputError(f"model {model!r} input {spec.name!r} has symbolic dims {spec.shape}: axis {axis} "
                              "has no name and no value; pass data x to time it")
    raise BenchInputError(f"model {model!r} input {spec.name!r} has symbolic dims {spec.shape}: axis {axis} "
                          f"({dim!r}) has no value; give `BenchConfig.axis_values` lengths for {dim} or pass data "
                          "x to time it", fields=("axis_values",))


def data_digest(x: Data) -> str | None:
    """A digest (BLAKE2b) of data: each array's name, dtype, shape and bytes in C order (the same values in another
    layout give the same digest; rows in another order another one). ``None`` for data holding Python objects (their
    bytes are pointers: equal data would not give equal digests)."""
    h = hashlib.blake2b(digest_size=20)
    for name, value in sorted(x.items()) if isinstance(x, Mapping) else [("", x)]:
        a = np.ascontiguousarray(value)
        if a.dtype.hasobject:
            return None
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.reshape(-1).view(np.uint8))  # any fixed-size dtype (bfloat16 and float8 too: no buffer format)
    return h.hexdigest()
