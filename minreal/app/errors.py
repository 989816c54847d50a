"""The command line's error table: which exception leaves ``minreal`` with which exit code and one-line message
(2 for usage errors, 1 for failures, 3 for a release gate left undecided, 143 for SIGTERM; no tracebacks unless
``MINREAL_DEBUG=1``)."""

from __future__ import annotations

import os
import signal
import sys

import click

from minreal.app.signals import Terminated

__all__ = ["FAIL_EXIT", "TERM_EXIT", "UNDECIDED_EXIT", "USAGE_EXIT", "invoke", "usage_errors"]

USAGE_EXIT, FAIL_EXIT = 2, 1
UNDECIDED_EXIT = 3  # `check --paired`: a latency decision not made within its cap (neither passed nor failed)
TERM_EXIT = 128 + int(signal.SIGTERM)  # 143: what a shell reports for a process ended by SIGTERM


def usage_errors() -> tuple[type[BaseException], ...]:
    """The project errors that mean the command was given wrongly (exit 2, like click's usage errors)."""
    from minreal.app.callables import SpecError
    from minreal.app.method_options import MethodOptionError
    from minreal.app.rundir import RunDirError
    from minreal.app.tune import TuneError
    from minreal.compress import CompressionError, UnknownMethodError
    from minreal.export.errors import SameFileError
    from minreal.runtime_bench import (
        BenchInputError,
        CheckError,
        ModelFileError,
        ReportSchemaError,
        UnknownProviderError,
    )

    return (MethodOptionError, RunDirError, SpecError, UnknownMethodError, CompressionError, SameFileError, TuneError,
            BenchInputError, CheckError, ModelFileError, ReportSchemaError, UnknownProviderError)


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())
"""What click (>= 8.2) raises for a group called without arguments; older versions print the help themselves."""


def invoke(group: click.Group, argv: list[str] | None) -> None:
    """Run ``group`` on ``argv`` and turn whatever it raises into one line on stderr and :func:`sys.exit` with the
    table's exit code."""
    try:
        group.main(args=argv, prog_name="minreal", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("minreal: aborted", err=True)
        sys.exit(FAIL_EXIT)
    except _NO_ARGS_IS_HELP as exc:  # `minreal` alone: the help itself, not an error line
        exc.show()
        sys.exit(USAGE_EXIT)
    except click.UsageError as exc:  # one line, as every other error: what is wrong, and where the help is
        path = exc.ctx.command_path if exc.ctx is not None else "minreal"
        hint = f" (see `{path} --help`)" if exc.ctx is not None else ""
        message = _elsewhere(group, exc) or " ".join(exc.format_message().split())
        click.echo(f"{path}: error: {message}{hint}", err=True)
        sys.exit(USAGE_EXIT)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Terminated:
        click.echo("minreal: terminated (SIGTERM); partial output removed", err=True)
        sys.exit(TERM_EXIT)
    except SystemExit:
        raise
    except BaseException as exc:
        if os.environ.get("MINREAL_DEBUG"):
            raise
        from minreal.app.field_flags import flag_spelled
        from minreal.facts import error_line

        click.echo(f"minreal: error: {flag_spelled(exc, error_line(exc))}", err=True)
        sys.exit(USAGE_EXIT if isinstance(exc, usage_errors()) else FAIL_EXIT)


def _elsewhere(group: click.Group, exc: click.UsageError) -> str | None:
    """For an option this command does not take but others do (``compress --recover-int8``): the message naming
    them, instead of click's guess at a near spelling; None otherwise."""
    if not isinstance(exc, click.NoSuchOption) or exc.ctx is None:
        return None
    name = exc.option_name
    others = [cmd for cmd_name, cmd in sorted(group.commands.items())
              if cmd_name != exc.ctx.command.name
              and any(name in (*p.opts, *p.secondary_opts) for p in cmd.get_params(exc.ctx))]
    if not others:
        return None
    names = ", ".join(c.name or "" for c in others)
    longer = [p for p in exc.possibilities or () if p.startswith(name)]  # this command's own spelling of it
    if longer:
        return f"No such option '{name}': did you mean '{longer[0]}'? ({name} is an option of {names})"
    uses = " or ".join(f"`minreal {cmd.name} ... {name}`" for cmd in others)
    return f"No such option '{name}': it is an option of {names}: use {uses}"
