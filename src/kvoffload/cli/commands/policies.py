"""``kvoffload policies``: the cache policies resolvable by name."""

from __future__ import annotations

import argparse

from kvoffload.cli import args as cli_args
from kvoffload.cli import output
from kvoffload.policies import CachePolicyFactory

NAME = "policies"
HELP = "list the cache policies resolvable by name"
DESCRIPTION = "List the cache policies resolvable by name: built-ins, registered and plug-ins."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_format(parser)


def run(args: argparse.Namespace) -> int:
    infos = CachePolicyFactory.describe_cache_policies()
    if args.format == "json":
        output.emit_json({"policies": [info.__dict__ for info in infos]})
        return 0
    table = output.tables().policies_table(infos)
    output.print_rich(table)
    return 0
