"""A process-wide guard that closes every path by which loading a file could run code from it.

Recognising "bad" archive members by their bytes can be fooled (protocol 0/1 pickles have no magic
number; config files inside an archive can be forged). Instead, untrusted files are read under
:func:`no_unpickling`. While it is active:

- ``torch.load`` accepts only ``weights_only=True`` (torch's restricted unpickler, which builds tensors and
  plain containers and never imports or calls anything); ``pickle.load``/``pickle.loads``/
  ``pickle.Unpickler`` (also through ``_pickle``) and ``torch._C._pickle_load_obj`` raise. A future torch
  that adds another ``weights_only=False`` fallback therefore still cannot run code from the file.
- ``sympy``'s string parser (``parse_expr``, behind ``sympify``, which ``eval``s its input) accepts only
  arithmetic over symbols, numbers and an allow-list of sympy/torch function names: no attribute access,
  no subscripts, no other names. ``torch.export.load`` parses the program's symbolic shapes this way.
- pytree deserialisation (``torch.utils._pytree``, which imports the modules a program's tree specs name)
  may import only torch's own modules and ``builtins``/``collections``/``enum``: an untrusted file must not
  make us import anything. Imports torch makes for itself while loading are not limited.

Each refusal raises :class:`UnpicklingRefused` and is recorded, so a caller that swallows the error is
still found out.

The guard patches module attributes, so it covers every caller that looks them up at call time (as torch
does); it is not thread-safe and is meant for the single-threaded load at the CLI's input edge.
"""

from __future__ import annotations

import _pickle
import functools
import importlib
import io
import pickle
import re
import tokenize
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


#: Names a symbolic-shape expression may use: sympy constructors and relations torch serialises, the assumption
#: keywords of ``Symbol``, and (added at run time) everything ``torch.utils._sympy.functions`` exports.
_SYMPY_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Max", "Min", "Abs", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And",
    "Or", "Not", "Pow", "Mul", "Add", "floor", "ceiling", "sqrt", "oo", "zoo", "nan", "pi", "True", "False",
    "positive", "negative", "nonnegative", "integer", "real", "finite", "even", "odd",
})
_SYMBOL_NAME = re.compile(r"[A-Za-z]{1,4}\d+")  # torch's symbol names: s0, u12, ps3, ...
_STRING_LITERAL = re.compile(r"""(['"])[A-Za-z_][A-Za-z0-9_]*\1""")
_OPERATORS = frozenset({"+", "-", "*", "/", "//", "%", "**", "(", ")", ",", "=", "<", ">", "<=", ">=", "==", "!="})
_IGNORED_TOKENS = frozenset({tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT})
_IMPORTABLE = re.compile(r"(torch(\..+)?|builtins|collections|enum)")


def _sympy_names() -> frozenset[str]:
    import torch.utils._sympy.functions as torch_sympy

    return _SYMPY_NAMES | frozenset(getattr(torch_sympy, "__all__", ()))


def _is_plain_arithmetic(text: str, names: frozenset[str]) -> bool:
    """True when ``text`` tokenises to numbers, identifier-like strings, operators and allowed names only."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return False
    for tok in tokens:
        if tok.type in _IGNORED_TOKENS or tok.type == tokenize.NUMBER:
            continue
        if tok.type == tokenize.NAME and (tok.string in names or _SYMBOL_NAME.fullmatch(tok.string)):
            continue
        if tok.type == tokenize.STRING and _STRING_LITERAL.fullmatch(tok.string):
            continue
        if tok.type == tokenize.OP and tok.string in _OPERATORS:
            continue
        return False
    return True


def _arithmetic_only(parse: Callable[..., Any], refusals: list[str]) -> Callable[..., Any]:
    """``sympy.parsing.sympy_parser.parse_expr`` that refuses anything but plain arithmetic."""
    names = _sympy_names()

    @functools.wraps(parse)
    def guarded(s: str, *args: Any, **kwargs: Any) -> Any:
        if not _is_plain_arithmetic(str(s), names):
            shown = str(s) if len(str(s)) <= 60 else str(s)[:57] + "..."
            _refuse(f"evaluating the expression {shown!r}", refusals)()
        return parse(s, *args, **kwargs)

    return guarded


def _known_modules_only(import_module: Callable[..., Any], refusals: list[str]) -> Callable[..., Any]:
    """``importlib.import_module`` limited to torch's own modules and three standard containers' modules."""

    @functools.wraps(import_module)
    def guarded(name: str, package: str | None = None) -> Any:
        if package is not None or not _IMPORTABLE.fullmatch(str(name)):
            _refuse(f"importing module {name!r}", refusals)()
        return import_module(name)

    return guarded


class _ImportlibView:
    """``importlib`` as one module sees it, with a guarded ``import_module``: only the deserialiser's own lookups
    of names read from the file are limited, not the imports torch itself makes while loading."""

    def __init__(self, import_module: Callable[..., Any]) -> None:
        self.import_module = import_module

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib, name)


@contextmanager
def no_unpickling() -> Iterator[list[str]]:
    """Within the block, only torch's weights-only unpickler may run; any other unpickling raises.

    Yields
    ------
    list[str]
        The list of refused calls, filled as they happen. Check it after the block: code inside may have
        caught :class:`UnpicklingRefused` and carried on (``torch.export.load`` catches ``RuntimeError``).

    Raises
    ------
    UnpicklingRefused
        (inside the block) when code calls a full unpickler.
    """
    refusals: list[str] = []
    guarded_load = _weights_only(torch.serialization.load, refusals)
    patches: list[tuple[Any, str, Any]] = [
        (torch, "load", guarded_load),
        (torch.serialization, "load", guarded_load),
        (torch._C, "_pickle_load_obj", _refuse("torch._C._pickle_load_obj", refusals)),
    ]
    import sympy.parsing.sympy_parser as sympy_parser
    import torch.utils._pytree as pytree

    patches += [(sympy_parser, "parse_expr", _arithmetic_only(sympy_parser.parse_expr, refusals)),
                (pytree, "importlib", _ImportlibView(_known_modules_only(importlib.import_module, refusals)))]
    for module in (pickle, _pickle):
        patches += [(module, "load", _refuse(f"{module.__name__}.load", refusals)),
                    (module, "loads", _refuse(f"{module.__name__}.loads", refusals)),
                    (module, "Unpickler", _refused_unpickler(refusals))]
    with ExitStack() as stack:
        for target, name, value in patches:
            stack.enter_context(mock.patch.object(target, name, value))
        yield refusals
