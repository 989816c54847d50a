"""Errors raised by the compression library, and the check that statistics are finite."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["CompressionError", "UnknownMethodError", "require_finite"]


class CompressionError(ValueError):
    """A model, layer or option cannot be compressed as asked; the message says which and what to do."""


class UnknownMethodError(KeyError):
    """A method name that is not registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it a plain sentence.
        return str(self.args[0])


def require_finite(t: torch.Tensor, layer: str, what: str) -> None:
    """Raise :class:`CompressionError` naming ``layer`` when ``t`` (activations or statistics) holds NaN/inf.

    Finite inputs can still overflow inside a model (e.g. values near 3e38 in float32); the decompositions
    downstream would then fail with an opaque linear-algebra error.
    """
    if not bool(t.isfinite().all()):
        raise CompressionError(f"layer {layer!r}: {what} contain NaN/inf (values overflow inside the model); "
                               "check the data scale, e.g. normalise the inputs")
