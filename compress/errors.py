"""Errors raised by the compression library."""

__all__ = ["CompressionError", "UnknownMethodError"]


class CompressionError(ValueError):
    """A model, layer or option cannot be compressed as asked; the message says which and what to do."""


class UnknownMethodError(KeyError):
    """A method name that is not registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it a plain sentence.
        return str(self.args[0])
