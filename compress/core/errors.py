"""Errors raised by the compression library, and the check that statistics are finite."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

__all__ = ["CompressionError", "UnknownMethodError", "field_error", "require_finite"]


class CompressionError(ValueError):
    """A model, layer or option cannot be compressed as asked; the message says which and what to do.

    An error about config fields names them as the Python API spells them, in backticks (`` `mac_ratio` ``, or
    with their config class, `` `DepthConfig.criterion` ``), and lists their bare names in :attr:`fields`, so that
    a caller with other spellings of them (the command line's flags) can put its own in their place: only a
    backticked mention of a listed field is such a mention.

    Parameters
    ----------
    message
        what is wrong and what to do.
    fields
        the config fields the message names (bare field names, e.g. ``("mac_ratio",)``).
    """

    def __init__(self, message: str, *, fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.fields: tuple[str, ...] = tuple(fields)


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
    downstream would then fail with an opaque linear-algebra error.
    """
    if not bool(t.isfinite().all()):
        raise CompressionError(f"layer {layer!r}: {what} contain NaN/inf (values overflow inside the model); "
                               "check the data scale, e.g. normalise the inputs")
