"""Model inputs: one tensor, or several named tensors that share the sample axis.

A model whose ``forward`` takes several tensors (``input_ids``, ``attention_mask``; an image and a scale) gets
its inputs as :class:`NamedInputs`: an ordered ``name → tensor`` map, ordered as the ``forward`` parameters, whose
tensors all have the samples along axis 0. It indexes, slices and concatenates like a tensor does along that
axis, so :class:`~minreal.compress.core.data.Dataset` and every batch loop work unchanged; a model is called with
:func:`call`, which unpacks the tensors as positional arguments.

Single-input models keep plain tensors everywhere; nothing here changes them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["Inputs", "NamedInputs", "call", "cat", "args_of", "count", "sample_shapes", "shapes_of_sample",
           "to_device", "as_floating", "first_tensor", "is_named", "repeat_to", "input_names", "slice_axis",
           "halve_axes", "PackedInputs", "takes_varargs"]


class NamedInputs:
    """Several named tensors with the samples along axis 0 (same count in each).

    Parameters
    ----------
    tensors
        ``name → tensor`` in the order of the model's ``forward`` parameters.

    Raises
    ------
    ValueError
        no tensors, a 0-d tensor, or tensors with different sample counts.
    """

    __slots__ = ("_tensors",)

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        if not tensors:
            raise ValueError("NamedInputs needs at least one tensor")
        counts = {}
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor) or t.ndim == 0:
                raise ValueError(f"input {name!r} must be a tensor with a sample axis, got {type(t).__name__}")
            counts[name] = len(t)
        if len(set(counts.values())) > 1:
            raise ValueError(f"named inputs have different sample counts: {counts}")
        self._tensors = dict(tensors)

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """``name → tensor`` (a copy of the map; the tensors are shared)."""
        return dict(self._tensors)

    @property
    def names(self) -> list[str]:
        """Input names, in ``forward`` order."""
        return list(self._tensors)

    def args(self) -> tuple[torch.Tensor, ...]:
        """The tensors in ``forward`` order, to call the model with."""
        return tuple(self._tensors.values())

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._tensors.items())

    def __len__(self) -> int:
        return len(next(iter(self._tensors.values())))

    def __getitem__(self, index: Any) -> "NamedInputs":
        if isinstance(index, str):
            raise TypeError(f"index NamedInputs by samples; use .tensors[{index!r}] for one input")
        return NamedInputs({n: t[index] for n, t in self._tensors.items()})

    def map(self, fn: Any) -> "NamedInputs":
        """Apply ``fn`` to every tensor."""
        return NamedInputs({n: fn(t) for n, t in self._tensors.items()})

    def to(self, *args: Any, **kwargs: Any) -> "NamedInputs":
        """``Tensor.to`` on every tensor for a device; a dtype is applied to floating tensors only."""
        return self.map(lambda t: _to(t, *args, **kwargs))

    def numpy(self) -> dict[str, Any]:
        """``name → numpy array`` (for ONNX Runtime feeds)."""
        return {n: t.detach().cpu().numpy() for n, t in self._tensors.items()}

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                          for n, t in self._tensors.items())
        return f"NamedInputs({parts})"


Inputs = torch.Tensor | NamedInputs
"""What a model is called with: one tensor, or several named ones."""


def _to(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    dtypes = [a for a in (*args, kwargs.get("dtype")) if isinstance(a, torch.dtype)]
    if dtypes and not t.is_floating_point():
        kwargs.pop("dtype", None)
        args = tuple(a for a in args if not isinstance(a, torch.dtype))
        if not args and not kwargs:
            return t
    return t.to(*args, **kwargs)


def is_named(x: Any) -> bool:
    """True for :class:`NamedInputs`."""
    return isinstance(x, NamedInputs)


def args_of(x: Inputs) -> tuple[torch.Tensor, ...]:
    """Positional arguments for ``model(*args)``."""
    return x.args() if isinstance(x, NamedInputs) else (x,)


def call(model: nn.Module | Any, x: Inputs) -> Any:
    """``model(x)`` for one tensor, ``model(*tensors)`` for named inputs."""
    return model(*x.args()) if isinstance(x, NamedInputs) else model(x)


def count(x: Inputs) -> int:
    """Samples along axis 0."""
    return len(x)


def first_tensor(x: Inputs) -> torch.Tensor:
    """The tensor, or the first named one (its dtype/device stand for the batch)."""
    return x.args()[0] if isinstance(x, NamedInputs) else x


def input_names(x: Inputs, default: str = "input") -> list[str]:
    """Graph input names: the named inputs' names, or ``[default]`` for one tensor."""
    return x.names if isinstance(x, NamedInputs) else [default]


def sample_shapes(x: Inputs) -> dict[str, tuple[int, ...]]:
    """Per-sample shape (axis 0 dropped) of every input; one tensor is called ``"input"``."""
    if isinstance(x, NamedInputs):
        return {n: tuple(t.shape[1:]) for n, t in x.items()}
    return {"input": tuple(x.shape[1:])}


def shapes_of_sample(x: Inputs) -> dict[str, list[int]]:
    """:func:`sample_shapes` as JSON lists: what a count of one sample's MACs names as its input."""
    return {name: list(shape) for name, shape in sample_shapes(x).items()}


def cat(parts: Sequence[Inputs]) -> Inputs:
    """Concatenate along the sample axis (all tensors, or all named inputs with the same names)."""
    if not parts:
        raise ValueError("nothing to concatenate")
    if isinstance(parts[0], NamedInputs):
        names = parts[0].names
        if any(not isinstance(p, NamedInputs) or p.names != names for p in parts):
            raise ValueError(f"cannot concatenate named inputs with different names (first: {names})")
        return NamedInputs({n: torch.cat([p.tensors[n] for p in parts]) for n in names})  # type: ignore[union-attr]
    return torch.cat(list(parts))  # type: ignore[arg-type]


def repeat_to(x: Inputs, rows: int) -> Inputs:
    """The first ``rows`` samples, repeating ``x`` when it has fewer."""
    reps = -(-rows // len(x))
    return cat([x] * reps)[:rows] if reps > 1 else x[:rows]


def to_device(x: Inputs, device: torch.device | str) -> Inputs:
    """``x`` on ``device``."""
    return x.to(device)


def as_floating(x: Inputs, dtype: torch.dtype) -> Inputs:
    """Floating tensors cast to ``dtype``; integer inputs (token ids, masks) unchanged."""
    if isinstance(x, NamedInputs):
        return x.to(dtype)
    return x.to(dtype) if x.is_floating_point() else x


def slice_axis(x: Inputs, axes: Mapping[str, Mapping[int, int]]) -> Inputs:
    """Each named input at ``size`` along the given axes (``{name: {axis: size}}``): cut to it, or grown to it by
    repeating the axis's last slice; for a shorter or longer sequence.

    One tensor is addressed as ``"input"``. Axes not named keep their size.
    """
    def sized(name: str, t: torch.Tensor) -> torch.Tensor:
        for axis, size in axes.get(name, {}).items():
            if size <= t.shape[axis]:
                t = t.narrow(axis, 0, size)
            else:
                t = t.index_select(axis, torch.arange(size, device=t.device).clamp(max=t.shape[axis] - 1))
        return t

    if isinstance(x, NamedInputs):
        return NamedInputs({n: sized(n, t) for n, t in x.items()})
    return sized("input", x)


def halve_axes(x: Inputs, axes: Mapping[str, Mapping[int, str]]) -> Inputs | None:
    """``x`` with every dynamic axis besides the batch (``{input: {axis: dimension name}}``, one tensor named
    ``"input"``) at another length, one size per dimension name: half of it, or 2 for a length of 1 (its slice
    repeated; torch.export fixes a size of 1, so that is where a graph most often claims a dimension it cannot
    take); ``None`` when there is no such axis."""
    tensors = dict(x.items()) if isinstance(x, NamedInputs) else {name: x for name in axes}
    sizes = {dim: int(tensors[name].shape[axis]) for name, per in axes.items() if name in tensors
             for axis, dim in per.items()}
    target = {dim: size // 2 if size >= 2 else 2 for dim, size in sizes.items() if dim != "batch" and size >= 1}
    if not target:
        return None
    return slice_axis(x, {name: {axis: target[dim] for axis, dim in per.items() if dim in target}
                          for name, per in axes.items()})


class PackedInputs(nn.Module):
    """A model whose ``forward`` takes one dict (or tuple) of tensors, called with those tensors one by one.

    Lets a model with a structured input (``forward(self, batch)`` reading ``batch["image"]``) be exported with one
    ONNX input per tensor and compressed like any other model: ``PackedInputs(model, ["image", "boxes"])`` is
    called as ``wrapped(image, boxes)`` and calls ``model({"image": image, "boxes": boxes})`` (or
    ``model((image, boxes))`` with ``as_tuple``). Layer names gain the prefix ``model.``.
    """

    def __init__(self, model: nn.Module, names: Sequence[str], as_tuple: bool = False) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)
        self.as_tuple = as_tuple

    def forward(self, *inputs: torch.Tensor) -> Any:
        # indexing (not zip/unpacking) keeps this traceable by torch.fx, where ``inputs`` is one proxy
        if self.as_tuple:
            return self.model(tuple(inputs[i] for i in range(len(self.names))))
        return self.model({name: inputs[i] for i, name in enumerate(self.names)})


def takes_varargs(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes ``*args`` (torch.export then wants its dynamic shapes nested once more)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)
