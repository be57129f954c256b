"""``kvoffload bounds``: what no policy can beat, at each capacity."""

from __future__ import annotations

import argparse

from kvoffload.cli import args as cli_args
from kvoffload.cli import inputs, output
from kvoffload.cli.grid import progress_bar
from kvoffload.sim.bounds import TraceBounds
from kvoffload.sim.report import bounds_record

NAME = "bounds"
CAPACITIES = "1%,5%,10%,25%"
HELP = "infinite-cache, Belady MIN and OPT-with-bypass hit ratios"
DESCRIPTION = (
    "The hit ratios no policy can beat on a trace: an infinite cache, Belady's MIN and "
    f"OPT with bypass, at each capacity (default {CAPACITIES})."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_trace(parser)
    cli_args.add_capacity(parser, CAPACITIES)
    cli_args.add_progress(parser)
    cli_args.add_format(parser)


def run(args: argparse.Namespace) -> int:
    trace = inputs.load_input(args)
    capacities = inputs.capacities(args, trace, CAPACITIES)
    trace_bounds = TraceBounds(trace)
    progress = progress_bar(not args.no_progress)
    if progress is None:
        bounds = [trace_bounds.at(c.blocks) for c in capacities]
    else:
        with progress:
            task = progress.add_task("bounds", total=len(capacities))
            bounds = []
            for capacity in capacities:
                progress.update(task, description=f"bounds @ {capacity.label}")
                bounds.append(trace_bounds.at(capacity.blocks))
                progress.advance(task)
    if args.format == "json":
        records = [bounds_record(b, c.label) for b, c in zip(bounds, capacities, strict=True)]
        output.emit_json({"trace": trace.describe(), "bounds": records})
        return 0
    tables = output.tables()
    output.print_rich(
        output.trace_caption(trace),
        tables.bounds_table(bounds, [c.label for c in capacities]),
        tables.BOUNDS_LEGEND,
    )
    return 0
