"""The warnings a case's run raises on its way (the library's log records, ONNX Runtime's quantiser and torch.onnx
logging, Python warnings), collected as that case's warnings: the run shows them with its results, grouped per case
and kind on a brief console (:mod:`minreal.app.digest`), and keeps every one in ``report.json`` and ``report.md``,
instead of printing raw lines while the case runs.

The console's own handler holds such a record back (:class:`HeldForResults`, installed by
:func:`minreal.app.console.setup_logging`) while a :class:`CaseWarnings` collects it."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CaseWarnings", "HeldForResults", "collected_warnings"]


class CaseWarnings(logging.Handler):
    """Collects the text of every WARNING (and worse) record while it is attached to the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(record.getMessage())


class HeldForResults(logging.Filter):
    """A console handler's filter: holds back a record that a :class:`CaseWarnings` on the root logger collects (the
    case's results show it); lets every other record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(isinstance(h, CaseWarnings) and record.levelno >= h.level for h in logging.getLogger().handlers)


def _python_warning(w: warnings.WarningMessage) -> str:
    """``UserWarning (utils.py): text``: the kind before the colon is the category and the file that raised it."""
    return f"{w.category.__name__} ({Path(w.filename).name}): {w.message}"


@contextlib.contextmanager
def collected_warnings() -> Iterator[list[str]]:
    """Collect what the block logs at WARNING or worse, on any logger, and the Python warnings it raises (under the
    filters in force), into the list it yields; each text once, in the order first met. The list is complete when
    the block ends."""
    catcher, root = CaseWarnings(), logging.getLogger()
    texts: list[str] = []
    root.addHandler(catcher)
    try:
        with warnings.catch_warnings(record=True) as raised:
            yield texts
    finally:
        root.removeHandler(catcher)
    texts.extend(dict.fromkeys([*catcher.texts, *map(_python_warning, raised)]))
