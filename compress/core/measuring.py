"""Whether a method takes its own optional measurements on the calibration data.

A caller that measures the result on its own held-out data (``tune``, ``compress`` with a held-out split) realises
with ``measure=False`` (:func:`minreal.compress.registry.realise`), which turns them off for that call: the ``fde``
graph path's float64 output deviation over all the prepared data, a pass of both models in float64 that was 62 % of its
realise time on the digits ResNet-20. Stdlib only: the registry reads it without importing torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["measuring", "method_measurements"]

_MEASURE: ContextVar[bool] = ContextVar("minreal_method_measurements", default=True)


def measuring() -> bool:
    """Whether the method being realised should take its optional measurements (True unless a caller said not)."""
    return _MEASURE.get()


@contextlib.contextmanager
def method_measurements(enabled: bool) -> Iterator[None]:
    """Within the block, :func:`measuring` returns ``enabled``; the previous value comes back however it ends."""
    token = _MEASURE.set(bool(enabled))
    try:
        yield
    finally:
        _MEASURE.reset(token)
