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
    f"{CAPACITIES}."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_trace(parser)
    cli_args.add_capacity(parser, CAPACITIES)
    cli_args.add_replay(parser)
    cli_args.add_tiers(parser)
    cli_args.add_format(parser)
    g = parser.add_argument_group("shadow evaluation")
    g.add_argument(
        "--shadow",
        action="append",
        metavar="NAMES",
        help="candidate policies (comma-separated, repeatable) evaluated as sampled miniatures "
        "on each replay's key stream; prints each one's estimate next to its full replay "
        "(without --policy, the candidates are the policies replayed)",
    )
    g.add_argument(
        "--shadow-rate",
        type=float,
        default=0.01,
        help="share of the keys the shadows sample (default 0.01)",
    )
    g.add_argument(
        "--shadow-min-blocks",
        type=int,
        default=256,
        help="raise the rate so each miniature holds at least this many blocks (default 256)",
    )


def run(args: argparse.Namespace) -> int:
    if args.shadow and not args.policy:
        args.policy = list(args.shadow)
    return grid.report(args, grid.run_grid(args, CAPACITIES))
