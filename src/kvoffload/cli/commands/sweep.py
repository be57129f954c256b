"""``kvoffload sweep``: ``simulate`` over a finer capacity grid, made for files and plots."""

from __future__ import annotations

import argparse

from kvoffload.cli import args as cli_args
from kvoffload.cli import grid

NAME = "sweep"
CAPACITIES = "1%,2%,5%,10%,20%,30%,50%"
HELP = "policies x capacities grid with JSON/CSV output and plots"
DESCRIPTION = (
    "Replay every policy at every capacity (default "
    f"{CAPACITIES} of the unique blocks) with the bounds at each, in "
    "parallel worker processes; write the grid with -o FILE.json / FILE.csv and draw "
    "miss-ratio curves and per-capacity bar charts with --plot DIR."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_trace(parser)
    cli_args.add_capacity(parser, CAPACITIES)
    cli_args.add_replay(parser)
    cli_args.add_tiers(parser)
    cli_args.add_format(parser)


def run(args: argparse.Namespace) -> int:
    return grid.report(args, grid.run_grid(args, CAPACITIES))
