"""The command line's console: progress bars and lines on stderr, tables on stdout, ``--json`` documents, and
the logging set-up that routes the library's progress records to them."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from minreal.app.case_warnings import HeldForResults
from minreal.facts import DETAIL_KEY, PROGRESS_KEY  # compress and runtime_bench log with this key

__all__ = ["LIBRARY_LOGGERS", "Console", "ProgressBars", "RepeatFilter", "plain", "setup_logging", "shown_live"]

LIBRARY_LOGGERS = ("minreal.compress", "minreal.runtime_bench", "minreal.export")


class ProgressBars(logging.Handler):
    """Draws the library's progress log records as tqdm bars on stderr (one bar per task); where stderr is not a
    terminal (a log file, CI), one line per task at most every :data:`LINE_EVERY_S` seconds and at its end, with
    the elapsed time."""

    LINE_EVERY_S = 10.0

    def __init__(self, clock: Callable[[], float] = time.monotonic, brief: bool = False) -> None:
        super().__init__(logging.INFO)
        self.bars: dict[str, Any] = {}
        self.clock = clock
        self.brief = brief  # bars only where stderr is a terminal, and no detail lines (an epoch's losses)
        self.lines: dict[str, tuple[float, float, int]] = {}  # task -> (started, last line, done)

    def emit(self, record: logging.LogRecord) -> None:
        info = getattr(record, PROGRESS_KEY, None)
        if info is None:
            return
        detail = "" if self.brief else getattr(record, DETAIL_KEY, "")
        if not sys.stderr.isatty():
            if not self.brief:
                self._line(*info, detail)
            return
        from tqdm import tqdm

        task, done, total = info
        if detail:
            tqdm.write(f"· {task}: {done}/{total}: {detail}", file=sys.stderr)
        bar = self.bars.get(task)
        if bar is None or done <= bar.n:
            if bar is not None:
                bar.close()
            bar = self.bars[task] = tqdm(total=total, desc=task, leave=False, file=sys.stderr, disable=None)
        bar.update(done - bar.n)
        if done >= total:
            self.bars.pop(task).close()

    def _line(self, task: str, done: int, total: int, detail: str = "") -> None:
        """``· task: done/total (elapsed s)``, throttled per task; the last one, and one with a detail (an epoch's
        losses), always."""
        now = self.clock()
        started, last, before = self.lines.get(task, (now, -math.inf, -1))
        if done < before:  # the task began again (e.g. after an error): its own clock
            started, last = now, -math.inf
        if done < total and not detail and now - last < self.LINE_EVERY_S:
            self.lines[task] = (started, last, done)
            return
        click.echo(f"· {task}: {done}/{total}: {detail}" if detail
                   else f"· {task}: {done}/{total} ({now - started:.0f} s)",
                   err=True)
        if done >= total:
            self.lines.pop(task, None)
        else:
            self.lines[task] = (started, now, done)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()
        self.lines.clear()
        super().close()


class Console:
    """Where the CLI talks: progress and tables on stderr/stdout, or one JSON document with ``--json``. A ``brief``
    console (the demo's) shows the library's progress as bars on a terminal only, without detail lines, and holds a
    running case's warnings back for its results (:class:`~minreal.app.case_warnings.HeldForResults`); any other
    console shows them live."""

    def __init__(self, quiet: bool, as_json: bool, brief: bool = False) -> None:
        self.quiet, self.as_json = quiet, as_json
        root = logging.getLogger()
        for old in [h for h in root.handlers if isinstance(h, ProgressBars)]:
            root.removeHandler(old)
            old.close()
        if not quiet:
            root.addHandler(ProgressBars(brief=brief))
            for name in LIBRARY_LOGGERS:
                logging.getLogger(name).setLevel(logging.INFO)
        _hold_case_warnings(root, brief)

    def progress(self, msg: str) -> None:
        """One ``· msg`` line on stderr, unless ``--quiet``."""
        if not self.quiet:
            click.echo(f"· {msg}", err=True)

    def table(self, text: str) -> None:
        """A human-readable result on stdout, unless ``--json``."""
        if not self.as_json:  # --quiet silences progress only; results are still shown
            click.echo(text)

    def result(self, obj: Any) -> None:
        """The result as one JSON document on stdout, with ``--json``."""
        if self.as_json:
            click.echo(json.dumps(plain(obj), indent=2))


def _hold_case_warnings(root: logging.Logger, hold: bool) -> None:
    """Install (``hold``) or remove :class:`~minreal.app.case_warnings.HeldForResults` on the console's own handler
    (the one :func:`setup_logging` gave a :class:`RepeatFilter`), before its repeat filter: a held record is not
    counted as a repeat."""
    for handler in root.handlers:
        if any(isinstance(f, RepeatFilter) for f in handler.filters):
            handler.filters = [f for f in handler.filters if not isinstance(f, HeldForResults)]
            if hold:
                handler.filters.insert(0, HeldForResults())


def plain(obj: Any) -> Any:
    """``obj`` (a dataclass or plain data) as JSON-ready values."""
    from minreal.export.json_safe import to_jsonable  # one JSON conversion for the whole tool

    return to_jsonable(obj)


class RepeatFilter(logging.Filter):
    """Lets a record through the first time its logger says its text; repeats (the same step failing the same way
    on every file of a run) are counted in :attr:`seen`, not shown again."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.getMessage())
        self.seen[key] = self.seen.get(key, 0) + 1
        return self.seen[key] == 1

    def summary(self) -> str | None:
        """The line that says how many repeats were not shown (``None``: none were), printed when the command ends."""
        repeated = {k: n - 1 for k, n in self.seen.items() if n > 1}
        if not repeated:
            return None
        return (f"WARNING minreal: {sum(repeated.values())} repeat(s) of {len(repeated)} warning(s) above not shown "
                "(each text is shown once)")


def shown_live(text: str) -> bool:
    """Whether the console's own handler already printed a record that says ``text`` (its :class:`RepeatFilter` let
    it through): a console that does not hold a case's warnings back shows them as they come, and its results need
    not repeat them."""
    return any(text == said for handler in logging.getLogger().handlers for f in handler.filters
               if isinstance(f, RepeatFilter) for (_, said), n in f.seen.items() if n)


def _print_summary(repeats: RepeatFilter, stream: Any) -> None:
    """At exit: how many repeated warnings :class:`RepeatFilter` held back, if any."""
    if line := repeats.summary():
        with contextlib.suppress(OSError, ValueError):  # stderr closed or a broken pipe: nothing left to tell
            print(line, file=stream)


def setup_logging() -> None:
    """Warnings on stderr as ``LEVEL logger: message``, each text once per logger (:class:`RepeatFilter`); the
    library's INFO records reach only the progress bars. A brief :class:`Console` holds a running case's warnings
    back for its results."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, ProgressBars):
            handler.setLevel(logging.WARNING)  # library INFO records reach only the progress bars
        if type(handler) is logging.StreamHandler and not any(isinstance(f, RepeatFilter) for f in handler.filters):
            repeats = RepeatFilter()
            handler.addFilter(repeats)  # the console's own handler, not a test's capturing subclass
            atexit.register(_print_summary, repeats, handler.stream)
