"""A process-wide guard that makes every unpickling path raise, for reading untrusted files.

Recognising "bad" archive members by their bytes can be fooled (protocol 0/1 pickles have no magic
number; config files inside an archive can be forged). Instead, untrusted files are read under
:func:`no_unpickling`: while it is active, ``torch.load`` accepts only ``weights_only=True`` (torch's
restricted unpickler, which builds tensors and plain containers and never imports or calls anything), and
``pickle.load``/``pickle.loads``/``pickle.Unpickler`` (also through ``_pickle``) and
``torch._C._pickle_load_obj`` raise :class:`UnpicklingRefused`. A future torch that adds another
``weights_only=False`` fallback therefore still cannot run code from the file.

The guard patches module attributes, so it covers every caller that looks them up at call time (as torch
does); it is not thread-safe and is meant for the single-threaded load at the CLI's input edge.
"""

from __future__ import annotations

import _pickle
import functools
import pickle
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

import torch
import torch.serialization

__all__ = ["UnpicklingRefused", "no_unpickling"]


class UnpicklingRefused(RuntimeError):
    """Something tried to unpickle arbitrary objects while :func:`no_unpickling` was active."""


def _refuse(what: str, refusals: list[str]) -> Callable[..., Any]:
    """A stand-in that records ``what`` in ``refusals`` and raises (callers may swallow the error; the
    record stays, so the guard's owner still knows)."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        refusals.append(what)
        raise UnpicklingRefused(f"{what} was refused: it can run arbitrary code")

    return refused


def _refused_unpickler(refusals: list[str]) -> type:
    """A stand-in for ``pickle.Unpickler``: it and subclasses (torch's ``UnpicklerWrapper``) fail when built."""

    class RefusedUnpickler:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _refuse("pickle.Unpickler", refusals)()

    return RefusedUnpickler


def _weights_only(load: Callable[..., Any], refusals: list[str]) -> Callable[..., Any]:
    """``torch.load`` that refuses any call not explicitly asking for ``weights_only=True``."""

    @functools.wraps(load)
    def guarded(*args: Any, weights_only: bool | None = None, **kwargs: Any) -> Any:
        if weights_only is not True:
            _refuse(f"torch.load(weights_only={weights_only})", refusals)()
        return load(*args, weights_only=True, **kwargs)

    return guarded


@contextmanager
def no_unpickling() -> Iterator[list[str]]:
    """Within the block, only torch's weights-only unpickler may run; any other unpickling raises.

    Yields:
        The list of refused calls, filled as they happen. Check it after the block: code inside may have
        caught :class:`UnpicklingRefused` and carried on (``torch.export.load`` catches ``RuntimeError``).

    Raises:
        UnpicklingRefused: (inside the block) when code calls a full unpickler.
    """
    refusals: list[str] = []
    guarded_load = _weights_only(torch.serialization.load, refusals)
    patches: list[tuple[Any, str, Any]] = [
        (torch, "load", guarded_load),
        (torch.serialization, "load", guarded_load),
        (torch._C, "_pickle_load_obj", _refuse("torch._C._pickle_load_obj", refusals)),
    ]
    for module in (pickle, _pickle):
        patches += [(module, "load", _refuse(f"{module.__name__}.load", refusals)),
                    (module, "loads", _refuse(f"{module.__name__}.loads", refusals)),
                    (module, "Unpickler", _refused_unpickler(refusals))]
    with ExitStack() as stack:
        for target, name, value in patches:
            stack.enter_context(mock.patch.object(target, name, value))
        yield refusals
