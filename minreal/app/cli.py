"""The ``minreal`` command: the click group, its commands (one module each in :mod:`minreal.app.commands`) and the
entry points; a thin shell over the Python API (compress, export, runtime_bench)."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

import click

from minreal.app.commands.bench import bench_cmd
from minreal.app.commands.check import check_cmd
from minreal.app.commands.compress import compress_cmd
from minreal.app.commands.demo import demo_cmd
from minreal.app.commands.export import export_cmd
from minreal.app.commands.latency_table import latency_table_cmd
from minreal.app.commands.methods import methods_cmd
from minreal.app.commands.run import run_cmd
from minreal.app.commands.tune import tune_cmd
from minreal.app.console import setup_logging
from minreal.app.errors import FAIL_EXIT, invoke
from minreal.app.signals import sigterm_raises

__all__ = ["cli", "console", "main", "run"]

#: OpenMP threads sleep when idle unless the user says otherwise: busy-waiting threads stall torch's many small CPU
#: operations whenever another process shares the cores (the statistics pass of a ResNet-20: 40 s against 2 s on a
#: 2-core machine running a second job). Read once, when torch loads, which the command line defers until needed.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@click.group(commands=[methods_cmd, compress_cmd, export_cmd, bench_cmd, check_cmd, run_cmd, demo_cmd,
                       latency_table_cmd, tune_cmd],
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="minreal")
def cli() -> None:
    """minreal: compress PyTorch models by structure, export to ONNX, benchmark with ONNX Runtime.

    Models: a torchvision name or resnet20_cifar (with --weights), path/file.py:factory,
    package.module:factory, a .pt2 torch.export program. Data: digits, digits-flat, digits-seq, digits32,
    file.npz/.npy, an image folder, or module:callable.
    """


def run(argv: list[str] | None = None) -> int:
    """Run ``minreal`` with ``argv`` exactly as the console script does, and return its exit code instead of
    exiting (for embedding the CLI, e.g. in a release job written in Python, and for tests)."""
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else FAIL_EXIT)
    return 0


def console() -> None:
    """The ``minreal`` console script: :func:`main` on ``sys.argv``, then, once a command has imported torch, an exit
    that skips the interpreter's final teardown (1-2 s of freeing torch's modules that nothing needs). Exit
    handlers still run first (logging, multiprocessing and temporary-folder cleanup) and the output streams are
    flushed; an unexpected error with ``MINREAL_DEBUG=1`` keeps Python's own exit and traceback."""
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    if "torch" not in sys.modules:
        sys.exit(code)
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else FAIL_EXIT
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry (the console script is :func:`console`): one-line errors, exit 2 for usage errors and 1
    for failures, no tracebacks (the table is :mod:`minreal.app.errors`).

    Ctrl-C (SIGINT) exits 1 and SIGTERM exits 143 (128 + 15), each with one line on stderr, after removing
    what the command had started to write (staging folder, lock file, temporary files, folders it created).
    Set ``MINREAL_DEBUG=1`` to see the traceback of an unexpected error.
    """
    setup_logging()
    with sigterm_raises():
        invoke(cli, argv)


if __name__ == "__main__":  # python -m minreal.app.cli (torchrun -m minreal.app.cli compress ...)
    console()
