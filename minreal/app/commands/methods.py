"""``minreal methods [NAME]``: the registered compression methods, or one method's options, budgets and
defaults."""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

import click

from minreal.app.cli_help import GroupedCommand
from minreal.app.cli_options import common
from minreal.app.console import Console, plain
from minreal.facts import PROVIDERS

__all__ = ["methods_cmd"]


@click.command("methods", cls=GroupedCommand)
@click.argument("name", required=False)
@common
def methods_cmd(name: str | None, quiet: bool, as_json: bool) -> None:
    """List the registered compression methods, or one method's options, budgets and defaults (NAME)."""
    from minreal.app.method_options import method_option_specs
    from minreal.compress import get_method, method_names

    con = Console(quiet, as_json)
    if name is not None and name not in method_names():
        raise click.UsageError(f"unknown method {name!r}; choose from {', '.join(method_names())}")
    specs = method_option_specs()
    if name is not None:
        con.table(_method_page(name, specs))
        con.result(_method_record(name, specs))
        return
    rows = {n: {"summary": get_method(n).summary, "two_phase": get_method(n).two_phase,
                "options": [s.flag for s in specs if n in s.methods]} for n in method_names()}
    phase = {True: "prepares once, realises each budget cheaply", False: "all its work depends on the budget"}
    con.table("\n".join(f"{n:<12} {r['summary']} ({phase[r['two_phase']]})\n{'':<12} {' '.join(r['options'])}"
                        for n, r in rows.items()) + "\n\n`minreal methods NAME`: one method's options and defaults.")
    con.result(rows)


def _method_record(name: str, specs: list[Any]) -> dict[str, Any]:
    """One method's summary, budgets and options (flag, default, help, choices), as ``methods NAME --json``."""
    from minreal.compress import get_method

    method = get_method(name)
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else None
                for f in dataclasses.fields(method.config_cls)}
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(method.config_cls)}
    by_provider = {p: method.provider_defaults((p,)) for p in PROVIDERS}
    options = [{"flag": s.flag, "default": plain(defaults.get(s.field)), "help": helps.get(s.field, s.help),
                "choices": list(s.choices) if s.choices else None,
                "default_by_provider": {p: plain(d[s.field]) for p, d in by_provider.items() if s.field in d} or None}
               for s in specs if name in s.methods]
    return {"name": name, "summary": method.summary, "budgets": list(method.budgets),
            "two_phase": method.two_phase, "options": options}


def _method_page(name: str, specs: list[Any]) -> str:
    """One method's page of ``minreal methods NAME``: summary, budgets, then each option with its default."""
    record = _method_record(name, specs)
    budgets = ", ".join("--" + b.replace("_", "-") for b in record["budgets"]) or "none (its own options set the size)"
    lines = [f"{name}: {record['summary']}", f"budgets: {budgets}",
             "prepares once and realises each budget cheaply" if record["two_phase"] else
             "all its work depends on the budget", "", "options (default):"]
    for o in record["options"]:
        shown = _shown(o["default"])
        if o["default_by_provider"]:  # the command line's default follows --providers; the Python API's is fixed
            per = ", ".join(f"{p} {_shown(v)}" for p, v in o["default_by_provider"].items())
            shown = f"--providers: {per}; Python API {shown}"
        lines.append(f"  {o['flag']} ({shown})" + (f" one of {', '.join(o['choices'])}" if o["choices"] else ""))
        lines += ["      " + ln for ln in textwrap.wrap(o["help"], 100)]
    return "\n".join(lines)


def _shown(value: Any) -> str:
    """A default as a user types it: on/off, none, a plain number or word."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == [] or value == ():
        return "none"
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
