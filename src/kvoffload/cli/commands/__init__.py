"""One module per sub-command, each with ``NAME``, ``HELP``, ``add_arguments`` and ``run``."""

from __future__ import annotations

from types import ModuleType

from kvoffload.cli.commands import bounds, demo, generate, mrc, policies, simulate, sweep

COMMANDS: tuple[ModuleType, ...] = (policies, simulate, sweep, mrc, bounds, generate, demo)

__all__ = ["COMMANDS"]
