"""Model input specifications (read from the ONNX file) and timing inputs built from them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from .errors import BenchInputError, ModelFileError
from .facts import error_line

__all__ = ["InputSpec", "input_specs", "timing_inputs", "batch_inputs", "load_model_proto",
           "check_external_data"]

Dim = int | str | None


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, numpy dtype name and shape (int, symbolic name, or None if unknown)."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]

    def fixed_batch(self) -> int | None:
        """The batch dimension if it is a fixed integer, else None (dynamic)."""
        first = self.shape[0] if self.shape else None
        return first if isinstance(first, int) else None


def load_model_proto(path: Path, load_external_data: bool = False) -> onnx.ModelProto:
    """Load an ONNX model, raising :class:`ModelFileError` naming the file on any failure."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises several unrelated types for corrupt files
        raise ModelFileError(f"cannot read ONNX model {path}: {error_line(exc, with_type=True)}; is it an ONNX "
                             "file (written completely)?") from None
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


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Tensors (subgraphs included) whose data lives in another file."""
    return [t for t in _tensors(model.graph) if t.data_location == onnx.TensorProto.EXTERNAL]


def check_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Refuse external-data locations that are absolute or leave the model's folder (e.g. ``../../etc/x``).

    Nothing is read: the locations are only resolved (symlinks included) and compared with the folder.
    """
    folder = Path(path).parent.resolve()
    for tensor in _external_tensors(model):
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not location or Path(location).is_absolute() or folder not in target.parents:
            raise ModelFileError(f"ONNX model {path}: tensor {tensor.name!r} keeps its data at {location!r}, outside "
                                 "the model's folder; refusing to read it — keep external data files next to the model")


def input_specs(path: Path) -> list[InputSpec]:
    """Graph inputs of the model at ``path`` that are not initializers."""
    graph = load_model_proto(path).graph
    initializers = {init.name for init in graph.initializer}
    return [_spec(value) for value in graph.input if value.name not in initializers]


def _spec(value: onnx.ValueInfoProto) -> InputSpec:
    tensor = value.type.tensor_type
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
    shape = tuple(_dim(d) for d in tensor.shape.dim)
    return InputSpec(name=value.name, dtype=dtype, shape=shape)


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    if dim.HasField("dim_value"):
        return int(dim.dim_value)
    return dim.dim_param or None


def timing_inputs(
    specs: list[InputSpec], batch_size: int, x: np.ndarray | None, seed: int, model: str
) -> dict[str, np.ndarray]:
    """Inputs for timing one model at ``batch_size``.

    With data, the first ``batch_size`` rows of ``x`` (tiled if there are fewer) feed the model's
    single input. Without data, seeded standard-normal values of the input's float dtype fill the
    shape with the batch dimension set to ``batch_size``; other symbolic dimensions are an error.
    """
    check_batch(specs, batch_size, model)
    if x is not None:
        spec = _single_input(specs, model)
        reps = -(-batch_size // len(x))
        rows = np.concatenate([x] * reps)[:batch_size] if reps > 1 else x[:batch_size]
        return {spec.name: _cast(rows, spec, model)}
    rng = np.random.default_rng(seed)
    return {spec.name: _random(spec, batch_size, rng, model) for spec in specs}


def batch_inputs(specs: list[InputSpec], rows: np.ndarray, model: str) -> dict[str, np.ndarray]:
    """Feed a batch of data rows to the model's single input, cast to its dtype."""
    spec = _single_input(specs, model)
    return {spec.name: _cast(rows, spec, model)}


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
        raise BenchInputError(f"model {model!r} has {len(specs)} inputs {names}; data x feeds single-input models only")
    return specs[0]


def _cast(rows: np.ndarray, spec: InputSpec, model: str) -> np.ndarray:
    expected = tuple(spec.shape[1:])
    got = rows.shape[1:]
    if len(got) != len(expected) or any(isinstance(e, int) and e != g for e, g in zip(expected, got)):
        raise BenchInputError(f"data rows of shape {got} do not fit model {model!r} input {spec.name!r} {spec.shape}")
    if not np.can_cast(rows.dtype, spec.dtype, casting="same_kind"):
        raise BenchInputError(f"data dtype {rows.dtype} cannot feed model {model!r} input {spec.name!r} ({spec.dtype})")
    return np.ascontiguousarray(rows, dtype=spec.dtype)


def _random(spec: InputSpec, batch_size: int, rng: np.random.Generator, model: str) -> np.ndarray:
    rest = spec.shape[1:]
    if any(not isinstance(d, int) for d in rest):
        raise BenchInputError(
            f"model {model!r} input {spec.name!r} has symbolic dims {spec.shape}; pass data x to time it"
        )
    if np.dtype(spec.dtype).kind != "f":
        raise BenchInputError(f"model {model!r} input {spec.name!r} is {spec.dtype}; pass data x to time it")
    return rng.standard_normal((batch_size, *rest)).astype(spec.dtype)
