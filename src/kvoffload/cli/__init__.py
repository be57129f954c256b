"""The ``kvoffload`` command (``kvoffload.cli:main``); see :mod:`kvoffload.cli.main`.

One module per sub-command in :mod:`kvoffload.cli.commands`; shared argument groups in
:mod:`kvoffload.cli.args`; checked inputs in :mod:`kvoffload.cli.inputs`; stdout and files
in :mod:`kvoffload.cli.output`.
"""

from __future__ import annotations

from kvoffload.cli.errors import UserError
from kvoffload.cli.main import build_parser, main

__all__ = ["UserError", "build_parser", "main"]
