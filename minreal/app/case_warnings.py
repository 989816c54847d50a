"""The warnings a case's run raises on its way (the library's log records, ONNX Runtime's quantiser and torch.onnx
logging, Python warnings), collected as that case's warnings: the run keeps every one in ``report.json`` and
``report.md`` and shows them with its results, grouped per case and kind on a brief console
(:mod:`minreal.app.digest`).

A brief console (the demo's) holds such a record back from its own handler while a :class:`CaseWarnings` collects it
(:class:`HeldForResults`, installed by :class:`minreal.app.console.Console`), and shows the held records when the
case fails; any other console shows them live. A record at ERROR or worse is collected under its level
(``ERROR: text``, :func:`split_level`)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CaseWarnings", "HeldForResults", "collected_warnings", "split_level"]


class CaseWarnings(logging.Handler):
    """Collects the text of every WARNING (and worse) record while it is attached to the root logger; a record above
    WARNING under its level (``ERROR: text``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        level = "" if record.levelno <= logging.WARNING else f"{record.levelname}: "
        self.texts.append(f"{level}{record.getMessage()}")


def split_level(text: str) -> tuple[str, str]:
    """``("ERROR", "text")`` for a collected ``ERROR: text``, ``("WARNING", text)`` for any other text."""
    level, sep, rest = text.partition(": ")
    return (level, rest) if sep and level in ("ERROR", "CRITICAL") else ("WARNING", text)


class HeldForResults(logging.Filter):
    """A brief console handler's filter: holds back a record that a :class:`CaseWarnings` on the root logger collects
    (the case's results show it); lets every other record through. :meth:`release` shows the held ones (the case
    failed) or forgets them (its results show them)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if any(isinstance(h, CaseWarnings) and record.levelno >= h.level for h in logging.getLogger().handlers):
            self.held.append(record)
            return False
        return True

    def release(self, handler: logging.Handler, show: bool) -> None:
        """Pass the held records on to ``handler`` (``show``), else forget them."""
        held, self.held = self.held, []
        for record in held if show else ():
            handler.handle(record)


def _python_warning(w: warnings.WarningMessage) -> str:
    """``UserWarning (utils.py): text``: the kind before the colon is the category and the file that raised it."""
    return f"{w.category.__name__} ({Path(w.filename).name}): {w.message}"


def _release_held(root: logging.Logger, show: bool) -> None:
    """Every :class:`HeldForResults` on the root logger's handlers: :meth:`HeldForResults.release`."""
    for handler in root.handlers:
        for f in handler.filters:
            if isinstance(f, HeldForResults):
                f.release(handler, show)


@contextlib.contextmanager
def collected_warnings() -> Iterator[list[str]]:
    """Collect what the block logs at WARNING or worse, on any logger, and the Python warnings it raises (under the
    filters in force), into the list it yields; each text once, in the order first met. The list is complete when
    the block ends, whether it ends normally or by an exception; then the records a brief console held back are
    shown (see :class:`HeldForResults`).

    Where the root logger has no handler (a Python API user who set up no logging), the records still reach stderr
    as :data:`logging.lastResort` would print them. Inside another such block (nested), the inner block's Python
    warnings reach the outer block's list too, as its log records do."""
    catcher, root = CaseWarnings(), logging.getLogger()
    nested = any(isinstance(h, CaseWarnings) for h in root.handlers)
    last_resort = logging.lastResort if not root.handlers else None
    texts: list[str] = []
    root.addHandler(catcher)
    if last_resort is not None:
        root.addHandler(last_resort)  # attaching the catcher alone would switch logging.lastResort off
    failed = True
    try:
        with warnings.catch_warnings(record=True) as raised:
            yield texts
        failed = False
    finally:
        root.removeHandler(catcher)
        if last_resort is not None:
            root.removeHandler(last_resort)
        texts.extend(dict.fromkeys([*catcher.texts, *map(_python_warning, raised)]))
        if not nested:
            _release_held(root, show=failed)
        for w in raised if nested else ():
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
