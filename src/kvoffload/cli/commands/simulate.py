"""``kvoffload simulate``: replay a trace through policies, next to the optimal bounds."""

from __future__ import annotations

import argparse

from kvoffload.cli import args as cli_args
from kvoffload.cli import grid

NAME = "simulate"
CAPACITIES = "1%,5%,25%"
HELP = "replay a trace (default: a generated workload) through policies"
DESCRIPTION = (
    "Replay a trace through policies and show each next to the optimal bounds. With no "
    "arguments: the generated default workload, every built-in policy, capacities "
    f"{CAPACITIES.replace('%', '%%')}."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_trace(parser)
    cli_args.add_capacity(parser, CAPACITIES)
    cli_args.add_replay(parser)
    cli_args.add_tiers(parser)
    cli_args.add_format(parser)


def run(args: argparse.Namespace) -> int:
    return grid.report(args, grid.run_grid(args, CAPACITIES))
