"""The ``kvoffload`` command: list policies, replay traces, compute bounds, sweep, generate.

Every command prints an aligned table (``--format table``, default; needs rich, the ``[cli]``
extra) or one JSON object (``--format json``; needs nothing). A user error (bad input,
configuration or output path, or a replay an out-of-tree policy broke) is one line on stderr
and exit status 1 (2 for bad usage); any other exception is a bug and says so (exit status
70), with ``--debug`` for the traceback.
Long work shows a progress bar on stderr when stderr is a terminal; Ctrl-C stops it (workers
included) with exit status 130, after writing what finished, marked partial (``simulate``,
``sweep``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from kvoffload.cli.commands import COMMANDS
from kvoffload.cli.errors import EXIT_INTERRUPTED, UserError

EXIT_USER_ERROR = 1
EXIT_BUG = 70  # EX_SOFTWARE


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvoffload")
    except PackageNotFoundError:  # running from a source tree without metadata
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: one sub-command per module of :mod:`kvoffload.cli.commands`."""
    parser = argparse.ArgumentParser(
        prog="kvoffload",
        description="KV-cache offloading: eviction policies, trace replay and optimal bounds.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )
    for command in COMMANDS:
        p = sub.add_parser(
            command.NAME, parents=[common], help=command.HELP, description=command.DESCRIPTION
        )
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _import_like_python_m() -> None:
    """Put the current directory first on ``sys.path``, as ``python -m`` does.

    The console script's ``sys.path[0]`` is its own ``bin/`` directory, so ``--policy
    my_mod:Cls`` would not find ``./my_mod.py`` although ``python -m kvoffload`` would.
    """
    cwd = os.getcwd()
    if not any(entry in ("", cwd) for entry in sys.path):
        sys.path.insert(0, cwd)


def _restore_ctrl_c() -> None:
    """Let SIGINT raise ``KeyboardInterrupt`` even when the command started with it ignored.

    Why: a shell without job control (any script, ``nohup cmd &``) starts a background job
    with SIGINT ignored, and the process inherits that; Ctrl-C or ``kill -INT`` would then do
    nothing and a sweep would run to its end. A handler someone installed is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvoffload`` console script; returns the exit status."""
    _restore_ctrl_c()
    if argv is None:
        _import_like_python_m()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print("kvoffload: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python's exit-time flush
        # from complaining about it again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except UserError as exc:
        if debug:
            raise
        print(f"kvoffload: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:
        if debug:
            raise
        print(
            f"kvoffload: internal error: {type(exc).__name__}: {_one_line(exc)}\n"
            "kvoffload: this is a bug, not bad input; rerun with --debug for the traceback "
            "and report it",
            file=sys.stderr,
        )
        return EXIT_BUG


__all__ = ["EXIT_BUG", "EXIT_INTERRUPTED", "EXIT_USER_ERROR", "build_parser", "main"]
