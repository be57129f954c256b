"""The policies x capacities grid of ``simulate`` and ``sweep``, with a progress bar."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from kvoffload.cli import inputs, output
from kvoffload.cli.errors import UserError
from kvoffload.cli.shadow_report import shadow_rows, shadow_table
from kvoffload.sim.capacity import Capacity
from kvoffload.sim.records import Trace
from kvoffload.sim.sweep import SweepResult, run_sweep


def progress_bar(enabled: bool) -> Any:
    """A rich progress bar on stderr, or ``None`` (disabled, not a terminal, or no rich)."""
    if not enabled or not sys.stderr.isatty():
        return None
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
    except ImportError:
        return None
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


@dataclass
class Grid:
    """A finished grid: its trace, capacities and results."""

    trace: Trace
    capacities: list[Capacity]
    sweep: SweepResult


def run_grid(args: argparse.Namespace, default_caps: str) -> Grid:
    """Check every input and output first, then replay the grid."""
    output.check_outputs(args.output, args.plot)
    output.check_outputs([args.windows_output] if args.windows_output else None, None)
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    trace = inputs.load_input(args)
    policies = inputs.policies(args)
    options = inputs.replay_options(args)
    tiered = inputs.tier_capacities(args, trace)
    capacities = tiered if tiered is not None else inputs.capacities(args, trace, default_caps)
    with_bounds = not args.no_bounds and tiered is None  # bounds are single-tier
    if tiered is not None and options.measure.active:
        raise UserError("--tiers replays report whole-trace figures: drop --warmup-*/--window-s")
    progress = progress_bar(not args.no_progress)
    state: dict[str, Any] = {}

    def started(total: int) -> None:
        if progress is not None:
            progress.start()
            state["task"] = progress.add_task("simulating", total=total)

    def done(label: str) -> None:
        if progress is not None:
            progress.update(state["task"], advance=1, description=label)

    try:
        sweep = run_sweep(
            trace,
            policies,
            capacities,
            options,
            with_bounds=with_bounds,
            workers=args.workers,
            on_task_done=done,
            on_started=started,
        )
    finally:
        if progress is not None:
            progress.stop()
    return Grid(trace, capacities, sweep)


def report(args: argparse.Namespace, grid: Grid) -> int:
    """Print the results (table or JSON), then write the files; 1 if a file failed.

    With ``--shadow`` candidates the shadow estimates follow (``"shadow"`` in JSON).
    """
    trace, sweep = grid.trace, grid.sweep
    labels = [c.label for c in grid.capacities] if sweep.bounds else []
    record = output.sweep_record(trace, sweep, labels, args.timing)
    candidates = inputs.shadow_candidates(args)
    rows = shadow_rows(sweep.results, candidates) if candidates else []
    if rows:
        record["shadow"] = rows
    if args.format == "json":
        output.emit_json(record)
    else:
        tables = output.tables()
        mode = args.mode + (", overlapped" if args.overlap else "")
        items = [
            output.trace_caption(trace, f"mode {mode}"),
            tables.results_table(sweep.results, sweep.bounds, timing=args.timing),
            tables.results_legend(args.mode, args.timing, bounds=bool(sweep.bounds)),
        ]
        if any(r.tiers is not None for r in sweep.results):
            items += [tables.tiers_table(sweep.results), tables.tiers_legend(sweep.results)]
        if rows:
            items += [
                shadow_table(rows),
                "estimated: the candidate's miniature on the sampled keys (block hit ratio), "
                "read from the first policy's replay; actual: its own full replay; error = "
                "estimated - actual block hit ratio.",
            ]
        output.print_rich(*items)
    title = (args.trace and args.trace.rsplit("/", 1)[-1]) or "generated workload"
    errors = output.write_outputs(args.output, args.plot, record, sweep, title, args.timing)
    errors += output.write_windows(args.windows_output, args.plot, sweep.results, title)
    for line in errors:
        print(f"kvoffload: error: {line}", file=sys.stderr)
    return 1 if errors else 0


__all__ = ["Grid", "progress_bar", "report", "run_grid"]
