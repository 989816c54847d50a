"""Errors raised by the compression library, and the check that statistics are finite."""

from __future__ import annotations

from typing import TYPE_CHECKING

from minreal.facts import FieldError

if TYPE_CHECKING:
    import torch

__all__ = ["CompressionError", "UnknownMethodError", "field_error", "require_finite"]


class CompressionError(FieldError):
    """A model, layer or option cannot be compressed as asked; the message says which and what to do.

    An error about config fields names them as the Python API spells them, in backticks (`` `mac_ratio` ``, or
    with their config class, `` `DepthConfig.criterion` ``), and lists their bare names in ``fields``
    (:class:`minreal.facts.FieldError`), so that the command line can put its flags in their place.
    """


def field_error(config: object, name: str, problem: str) -> CompressionError:
    """The :class:`CompressionError` of config field ``name`` of ``config`` (a config instance): "`Cls.name`
    ``problem``", e.g. "`DepthConfig.score_samples` must be >= 8, got 4"."""
    return CompressionError(f"`{type(config).__name__}.{name}` {problem}", fields=(name,))


class UnknownMethodError(KeyError):
    """A method name that is not registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it a plain sentence.
        return str(self.args[0])


def require_finite(t: torch.Tensor, layer: str, what: str) -> None:
    """Raise :class:`CompressionError` naming ``layer`` when ``t`` (activations or statistics) holds NaN/inf.

    Finite inputs can still overflow inside a model (e.g. values near 3e38 in float32); the decompositions
    downstream would then fail with an opaque linear-algebra error. A finite sum means every value is finite (a NaN
    or an infinity makes any sum NaN or infinite): one reduction, a fraction of an elementwise test's cost (issue 44),
    which runs only when the sum is not finite (values finite but their sum overflowing).
    """
    if not bool(t.sum().isfinite()) and not bool(t.isfinite().all()):
        raise CompressionError(f"layer {layer!r}: {what} contain NaN/inf (values overflow inside the model); "
                               "check the data scale, e.g. normalise the inputs")
