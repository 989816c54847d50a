"""Former home of the ``minreal`` command, now :mod:`export.app.cli`; kept so ``python -m export.cli`` and
``from export.cli import cli, main`` keep working."""

from export.app.cli import cli, console, main

__all__ = ["cli", "main"]

if __name__ == "__main__":  # python -m export.cli
    console()
