"""``python -m minreal``: the same command line as the ``minreal`` script."""

from minreal.app.cli import console

console()
