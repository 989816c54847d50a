"""Input shapes, dtypes and dynamic axes as users give them on the command line.

``--input-shape`` keeps its old meaning when unnamed (``3,224,224``: per sample, batch excluded, float32) and has
a named form that includes the batch and the dtype, repeatable (``input_ids:1x128:int64``; the dtype defaults to
float32). Naming one input twice with different sizes marks the differing axes dynamic (``input_ids:1x32:int64
--input-shape input_ids:1x128:int64``: the batch is dynamic anyway, the sequence axis becomes ``seq``).

``--dynamic-axes input_ids:batch,seq`` names the axes of one input in order; ``_`` keeps an axis fixed
(``pixel_values:batch,_,h,w``). One name on several inputs is one dimension (``input_ids:batch,seq
--dynamic-axes attention_mask:batch,seq``). The batch (axis 0) is always dynamic unless shapes are fixed.

When calibration and evaluation data give an input different lengths along an axis, that axis is dynamic too
(:func:`infer_dynamic_axes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from minreal.compress.core.inputs import Inputs, NamedInputs

__all__ = ["check_shape_names", "InputShapes", "parse_input_shapes", "parse_dynamic_axes", "parse_axis_values",
           "random_inputs", "infer_dynamic_axes", "merge_axes", "axis_lengths", "DTYPES"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "float64": torch.float64, "int64": torch.int64,
    "int32": torch.int32, "bool": torch.bool,
}
"""dtypes a named ``--input-shape`` may give."""


@dataclass(frozen=True)
class InputShapes:
    """What ``--input-shape`` said.

    Attributes
    ----------
    per_sample : tuple[int, ...] | None
        the unnamed form's per-sample shape (``None`` when inputs are named).
    named : dict[str, tuple[tuple[int, ...], torch.dtype]]
        input name → (full shape with batch, dtype), in the order given (first occurrence).
    dynamic : dict[str, dict[int, str]]
        axes that differ between repeated shapes of one input (:func:`merge_axes` form).
    """

    per_sample: tuple[int, ...] | None = None
    named: dict[str, tuple[tuple[int, ...], torch.dtype]] = field(default_factory=dict)
    dynamic: dict[str, dict[int, str]] = field(default_factory=dict)


def _ints(text: str, sep: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(sep))
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a list of integers separated by {sep!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{what}: sizes must be positive integers, got {text!r}")
    return values


def _named_shape(value: str) -> tuple[str, tuple[int, ...], torch.dtype]:
    parts = value.split(":")
    if len(parts) not in (2, 3) or not parts[0].isidentifier():
        raise ValueError(f"--input-shape {value!r}: give NAME:SHAPE[:DTYPE], e.g. input_ids:1x128:int64")
    dtype_name = parts[2] if len(parts) == 3 else "float32"
    if dtype_name not in DTYPES:
        raise ValueError(f"--input-shape {value!r}: unknown dtype {dtype_name!r}; use one of {', '.join(DTYPES)}")
    return parts[0], _ints(parts[1], "x", f"--input-shape {value!r}"), DTYPES[dtype_name]


def parse_input_shapes(values: Sequence[str]) -> InputShapes:
    """Parse every ``--input-shape`` (see the module docstring).

    Raises
    ------
    ValueError
        a malformed value, an unnamed shape mixed with named ones or given twice, or one input given
        two dtypes or ranks; the message quotes the value.
    """
    unnamed = [v for v in values if ":" not in v]
    if unnamed and (len(unnamed) > 1 or len(values) > 1):
        raise ValueError("give one unnamed --input-shape (per sample, e.g. 3,224,224), or name every input "
                         "(NAME:SHAPE[:DTYPE], repeatable)")
    if unnamed:
        return InputShapes(per_sample=_ints(unnamed[0], ",", f"--input-shape {unnamed[0]!r}"))
    seen: dict[str, list[tuple[tuple[int, ...], torch.dtype]]] = {}
    for value in values:
        name, shape, dtype = _named_shape(value)
        seen.setdefault(name, []).append((shape, dtype))
    named, dynamic = {}, {}
    for name, shapes in seen.items():
        if len({(len(s), d) for s, d in shapes}) > 1:
            raise ValueError(f"--input-shape gives input {name!r} different ranks or dtypes; repeat a name only "
                             "to give a second length of a dynamic axis")
        named[name] = shapes[-1]
        differ = {a for a in range(1, len(shapes[0][0])) if len({s[a] for s, _ in shapes}) > 1}
        if differ:
            dynamic[name] = {a: _axis_name(a, len(shapes[0][0])) for a in sorted(differ)}
    return InputShapes(named=named, dynamic=dynamic)


def _axis_name(axis: int, rank: int) -> str:
    """``seq`` for axis 1 of a (batch, seq[, features]) input; ``dimN`` otherwise."""
    return "seq" if axis == 1 and rank in (2, 3) else f"dim{axis}"


def parse_dynamic_axes(values: Sequence[str]) -> dict[str, dict[int, str]]:
    """``NAME:ax0,ax1,...`` per value → ``{name: {axis: dim name}}``; ``_`` (or empty) keeps an axis fixed.

    Raises
    ------
    ValueError
        a malformed value, a dimension name that is not an identifier, or an input named twice.
    """
    out: dict[str, dict[int, str]] = {}
    for value in values:
        name, sep, axes = value.partition(":")
        if not sep or not name.isidentifier() or not axes:
            raise ValueError(f"--dynamic-axes {value!r}: give NAME:AXIS0,AXIS1,... e.g. input_ids:batch,seq")
        if name in out:
            raise ValueError(f"--dynamic-axes names input {name!r} twice; list all its axes in one value")
        named = {i: a.strip() for i, a in enumerate(axes.split(",")) if a.strip() not in ("", "_")}
        bad = [a for a in named.values() if not a.isidentifier()]
        if bad:
            raise ValueError(f"--dynamic-axes {value!r}: axis names {bad} are not identifiers")
        if 0 in named and named[0] != "batch":
            raise ValueError(f"--dynamic-axes {value!r}: axis 0 is the batch; call it batch or _")
        if elsewhere := [i for i, a in named.items() if a == "batch" and i != 0]:
            raise ValueError(f"--dynamic-axes {value!r}: batch names axis 0 only; give axis {elsewhere[0]} a name "
                             "of its own (seq, height, ...)")
        out[name] = named
    return out


def parse_axis_values(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``--axis-values seq=32,128`` (repeatable) → ``{"seq": (32, 128)}``: the lengths latency is measured at."""
    out: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, sizes = value.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--axis-values {value!r}: give DIM=N[,N...], e.g. seq=32,128")
        out[name] = _ints(sizes, ",", f"--axis-values {value!r}")
    return out


def random_inputs(shapes: InputShapes, batch: int, seed: int = 0) -> Inputs:
    """An example at ``batch`` rows: standard-normal floats; integer inputs all ones (a valid token id for any
    vocabulary of two or more, and an all-attending mask: random integers could be out of range); bool True."""
    gen = torch.Generator().manual_seed(seed)
    if shapes.per_sample is not None:
        return torch.randn(batch, *shapes.per_sample, generator=gen)
    tensors = {}
    for name, (shape, dtype) in shapes.named.items():
        full = (batch, *shape[1:])
        tensors[name] = torch.randn(full, generator=gen).to(dtype) if dtype.is_floating_point else \
            torch.ones(full, dtype=dtype)
    return NamedInputs(tensors)


def infer_dynamic_axes(a: Inputs, b: Inputs) -> dict[str, dict[int, str]]:
    """Axes (besides the batch) along which two datasets' inputs differ in length: those must be dynamic.

    One tensor is called ``"input"``. Axes of equal length in the two are left alone.
    """
    ta = dict(a.items()) if isinstance(a, NamedInputs) else {"input": a}
    tb = dict(b.items()) if isinstance(b, NamedInputs) else {"input": b}
    out: dict[str, dict[int, str]] = {}
    for name, t in ta.items():
        other = tb.get(name)
        if other is None or other.ndim != t.ndim:
            continue
        differ = [ax for ax in range(1, t.ndim) if t.shape[ax] != other.shape[ax]]
        if differ:
            out[name] = {ax: _axis_name(ax, t.ndim) for ax in differ}
    return out


def merge_axes(*parts: Mapping[str, Mapping[int, str]]) -> dict[str, dict[int, str]]:
    """Union of dynamic-axis maps; a later map's name for an axis wins."""
    out: dict[str, dict[int, str]] = {}
    for part in parts:
        for name, axes in part.items():
            out.setdefault(name, {}).update(axes)
    return out


def axis_lengths(x: Inputs, axes: Mapping[str, Mapping[int, str]]) -> dict[str, int]:
    """Dimension name → its length in ``x`` (batch excluded)."""
    tensors = dict(x.items()) if isinstance(x, NamedInputs) else {"input": x}
    return {dim: int(tensors[name].shape[axis]) for name, per in axes.items() if name in tensors
            for axis, dim in per.items() if axis != 0}


def check_shape_names(x: Inputs, axes: Mapping[str, Mapping[int, str]], fixed: object | None = None) -> None:
    """Refuse, before any export, ``--dynamic-axes`` or ``--fixed-shapes`` entries naming an input the model does
    not take, an axis beyond its input's dimensions, or a dimension no input has (``fixed``: an
    :class:`minreal.export.mobile.ShapeSpec`).

    Raises
    ------
    SpecError
        naming the option, the unknown names and the model's inputs.
    """
    from minreal.app.callables import SpecError

    names = x.names if isinstance(x, NamedInputs) else ["input"]
    unknown = sorted(set(axes) - set(names))
    if unknown:
        raise SpecError(f"--dynamic-axes names input(s) {unknown} the model does not take; its inputs are {names}")
    tensors = dict(x.items()) if isinstance(x, NamedInputs) else {"input": x}
    for name, per in axes.items():
        if beyond := [f"{dim} (axis {axis})" for axis, dim in per.items() if axis >= tensors[name].dim()]:
            raise SpecError(f"--dynamic-axes names {', '.join(beyond)} of {name}, which has {tensors[name].dim()} "
                            f"axes (0 to {tensors[name].dim() - 1}, the batch's included)")
    if fixed is None:
        return
    dims = {"batch"} | {dim for per in axes.values() for dim in per.values()}
    bad_inputs = sorted({n for n, _ in getattr(fixed, "inputs", ())} - set(names))
    bad_dims = sorted({n for n, _ in getattr(fixed, "dims", ())} - dims)
    if bad_inputs or bad_dims:
        what = [f"input(s) {bad_inputs}"] * bool(bad_inputs) + [f"dimension(s) {bad_dims}"] * bool(bad_dims)
        raise SpecError(f"--fixed-shapes names {' and '.join(what)} the model does not have; its inputs are {names} "
                        f"and its dynamic dimensions {sorted(dims)}")
