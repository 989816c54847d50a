"""The commands' option class and ``--help``: options grouped by concern, one screen of the common ones with
``--help`` and every option with its help with ``--help-all`` (a flag of every command).

An option names its section with :class:`GroupedOption` (``group=``); those declared ``brief`` show a row in
``--help`` (their help's first sentence), the others only their flag, listed under their section.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import click

__all__ = ["BENCHMARK", "CRITERIA", "EXPORT", "GROUP_ORDER", "HELP_ALL", "MODEL_DATA", "OUTPUT", "RECOVERY", "SEARCH",
           "GroupedCommand", "GroupedOption", "MethodCommand", "first_sentence"]

MODEL_DATA = "Model and data"
CRITERIA = "Criteria (quality and size)"
SEARCH = "Search"
RECOVERY = "Recovery (after any method)"
EXPORT = "Export"
BENCHMARK = "Benchmark"
OUTPUT = "Output"
_BUDGET = "Budget (the methods that can meet it)"
#: Sections in the order ``--help`` prints them; any other section (image folders, ORT format, each method's own
#: options) comes after the last of these that precedes it in the command's option order.
GROUP_ORDER = (MODEL_DATA, _BUDGET, CRITERIA, SEARCH, RECOVERY, EXPORT, BENCHMARK, OUTPUT)

#: ``ctx.meta`` key set by ``--help-all``.
HELP_ALL = "minreal_help_all"
_HELP_ALL_LINE = "Every option with its help: --help-all."


class GroupedOption(click.Option):
    """A click option that names the ``--help`` section it belongs to (``group``), whether ``--help`` shows its row
    (``brief``; otherwise only its flag) and whether a method's config declares it (``method_option``).

    ``once``: a single-valued option given twice is a usage error (click alone keeps the last value silently);
    ``once_hint`` ends that error's message.
    """

    def __init__(self, *args: Any, group: str = "", brief: bool = False, method_option: bool = False,
                 once: bool = False, once_hint: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "multiple": once or kwargs.get("multiple", False)})
        self.group = group
        self.brief = brief
        self.method_option = method_option  # declared by a method's config (minreal methods NAME lists it)
        self.once, self.once_hint = once, once_hint

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        value = super().process_value(ctx, value)
        if not self.once:
            return value
        if len(value) > 1:
            flag = max(self.opts, key=len)
            raise click.UsageError(f"{ctx.command.name} takes one {flag}, got {', '.join(map(str, value))}"
                                   + (f": {self.once_hint}" if self.once_hint else ""), ctx)
        return value[0] if value else None


def first_sentence(text: str) -> str:
    """The first sentence of an option's help (up to the first '. ' or '; ' outside parentheses), what ``--help``
    shows of it."""
    text = " ".join(text.split())
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ".;" and text[i + 1:i + 2] == " ":
            return text[:i] + "."
    return text


def _help_all(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL] = True
        click.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


def _flag(record: tuple[str, str]) -> str:
    """The long flag of a help record's first column (``-q, --quiet`` → ``--quiet``)."""
    found = re.findall(r"--[\w-]+", record[0])
    return found[0] if found else record[0].split()[0]


class GroupedCommand(click.Command):
    """A command whose ``--help`` fits a screen: its options by section, a row for each ``brief`` one and the flags
    of the others, then a line pointing to ``--help-all`` (every option with its help, by section)."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        extra = GroupedOption(["--help-all"], is_flag=True, expose_value=False, is_eager=True, callback=_help_all,
                              group=OUTPUT, help="Show every option with its help, grouped, and exit.")
        return [*super().get_params(ctx), extra]

    def section_of(self, ctx: click.Context, param: click.Parameter, full: bool) -> str | None:
        """The section ``param`` is listed in; None leaves it out of the short help."""
        return getattr(param, "group", "") or OUTPUT

    def brief(self, param: click.Parameter) -> bool:
        """Whether the short help shows ``param``'s row (else only its flag)."""
        return bool(getattr(param, "brief", False))

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        full = bool(ctx.meta.get(HELP_ALL, False))
        help_names = {*ctx.help_option_names, "--help-all"}
        sections: dict[str, tuple[list[tuple[str, str]], list[str]]] = {}
        method_titles: set[str] = set()
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or isinstance(param, click.Argument):  # hidden; arguments are in the usage line
                continue
            if not full and set(param.opts) & help_names:  # the last line of the short help names --help-all
                continue
            title = self.section_of(ctx, param, full)
            if title is None:
                continue
            if getattr(param, "method_option", False):
                method_titles.add(title)
            rows, flags = sections.setdefault(title, ([], []))
            if full or self.brief(param):
                rows.append(record if full else _brief_record(param, record))
            else:
                flags.append(_flag(record))
        own = [t for t in _ordered(list(sections)) if t not in method_titles]
        with formatter.section("Options"):  # the command's own, by concern
            for i, title in enumerate(own):
                if i:
                    formatter.write_paragraph()
                formatter.write_heading(title)
                with formatter.indentation():
                    _write_section(formatter, *sections[title])
        for title in (t for t in sections if t in method_titles):  # the methods' options, by method
            with formatter.section(title):
                _write_section(formatter, *sections[title])
        self.format_more(ctx, formatter, full)
        if not full:
            formatter.write_paragraph()
            formatter.write_text(_HELP_ALL_LINE)

    def format_more(self, ctx: click.Context, formatter: click.HelpFormatter, full: bool) -> None:
        """Text after the sections (none here)."""


def _write_section(formatter: click.HelpFormatter, rows: list[tuple[str, str]], flags: list[str]) -> None:
    """A section's rows, then the flags of the options shown without their help."""
    if rows:
        formatter.write_dl(rows)
    if flags:
        width = max(40, (formatter.width or 80) - formatter.current_indent)
        text = textwrap.wrap(("also: " if rows else "") + " ".join(flags), width, break_on_hyphens=False)
        formatter.write_text("\b\n" + "\n".join(text))


def _brief_record(param: click.Parameter, record: tuple[str, str]) -> tuple[str, str]:
    """``--help``'s row of an option: its flags and the first sentence of its help, with click's extras
    (``[default: ...; required]``)."""
    text = getattr(param, "help", None) or ""
    extra = re.search(r"\s+(\[[^\[\]]*\])$", record[1])
    return record[0], first_sentence(text) + (f"  {extra.group(1)}" if extra else "")


def _ordered(titles: list[str]) -> list[str]:
    """Sections in :data:`GROUP_ORDER`, the others (image folders, ORT format, each method's own options) in the
    order the command declares them before the last, Output."""
    known = [t for t in GROUP_ORDER[:-1] if t in titles]
    return known + [t for t in titles if t not in GROUP_ORDER] + [t for t in GROUP_ORDER[-1:] if t in titles]


class MethodCommand(GroupedCommand):
    """A command that takes the methods' options: ``--help`` lists the budget options every method shares; each
    method's own options are accepted but listed by ``minreal methods NAME`` and by ``--help-all`` (one screen of
    help, not a hundred lines)."""

    def section_of(self, ctx: click.Context, param: click.Parameter, full: bool) -> str | None:
        if not getattr(param, "method_option", False) or full:
            return super().section_of(ctx, param, full)
        return _BUDGET if set(param.opts) & _budget_flags() else None

    def brief(self, param: click.Parameter) -> bool:
        return super().brief(param) or bool(set(param.opts) & _budget_flags())

    def format_more(self, ctx: click.Context, formatter: click.HelpFormatter, full: bool) -> None:
        if full:
            return
        hidden = sum(1 for p in self.get_params(ctx)
                     if getattr(p, "method_option", False) and not set(p.opts) & _budget_flags())
        several = (" Given once for several -m methods, an option reaches the methods that have it."
                   if ctx.command.name == "run" else "")
        with formatter.section("Method options"):
            formatter.write_text(f"Each method also takes options of its own ({hidden} in all); `minreal methods "
                                 "NAME` lists one method's options, budgets and defaults, e.g. `minreal methods "
                                 f"fde`.{several}")


def _budget_flags() -> set[str]:
    """The whole-model budget flags and their helpers (``--mac-ratio``, ``--latency-table``, ...)."""
    from minreal.compress.core.options import BUDGET_FIELDS, BUDGET_HELPERS

    fields = (*BUDGET_FIELDS, *(h for hs in BUDGET_HELPERS.values() for h in hs))
    return {"--" + f.replace("_", "-") for f in fields}
