"""The one exception the command reports as a plain line: something the user can fix."""

from __future__ import annotations

#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), partial results written or not.
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """Bad input, configuration or output path: printed as one line, exit status 1.

    Everything else that escapes a command is a bug and is reported as one (with a hint to
    rerun with ``--debug`` for the traceback), never dressed up as bad input.
    """


__all__ = ["EXIT_INTERRUPTED", "UserError"]
