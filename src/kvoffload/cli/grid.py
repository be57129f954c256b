"""The policies x capacities grid of ``simulate`` and ``sweep``, with a progress bar."""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload.cli import answer, inputs, output
from kvoffload.cli.errors import EXIT_INTERRUPTED, UserError
from kvoffload.cli.shadow_report import shadow_rows, shadow_table
from kvoffload.policies import get_cache_policy_cls
from kvoffload.sim.capacity import Capacity
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import PolicySpec
from kvoffload.sim.sweep import SweepInterrupted, SweepResult, failed_cell, run_sweep


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


def blame_user_policy(exc: BaseException) -> UserError | None:
    """A user error naming the out-of-tree policy whose replay raised ``exc``, or ``None``.

    Why: the manager trusts its policy's answers (an ``evict`` that returns a protected or
    pinned block breaks it later, somewhere else), so an exception in the replay of a policy
    that is not one of ours is the policy's fault far more often than ours; the conformance
    check names the broken rule at once. A built-in's failure stays a bug (``None``).
    """
    cell = failed_cell(exc)
    if cell is None:
        return None
    policy, capacity = cell
    try:
        cls = get_cache_policy_cls(policy.name, policy.module_path)
    except Exception:  # it loaded for the replay; if it no longer does, say nothing more
        return None
    module = cls.__module__
    if module == "kvoffload" or module.startswith("kvoffload."):
        return None
    name = cls.__qualname__
    check = (
        f"from kvoffload.testing import check_policy_conformance; from {module} import "
        f"{name.split('.')[0]}; check_policy_conformance({name})"
    )
    return UserError(
        f"policy '{policy.label}' broke the replay at capacity {capacity} "
        f"({type(exc).__name__}: {exc}); it is not a built-in policy: check it against the "
        f'policy contract with  python -c "{check}"  which names the rule it breaks '
        "(--debug shows the traceback)"
    )


@dataclass
class Grid:
    """A finished grid: its trace, capacities and results."""

    trace: Trace
    capacities: list[Capacity]
    sweep: SweepResult
    specs: list[PolicySpec]


def run_grid(args: argparse.Namespace, default_caps: str) -> Grid:
    """Check every input and output first, then replay the grid.

    Ctrl-C after some tasks finished returns the partial grid (``sweep.partial``) for
    :func:`report` to print and write; before any finished, it raises ``KeyboardInterrupt``
    and leaves no plot directory it made.
    """
    new_plot_dir = bool(args.plot) and not Path(args.plot).exists()
    output.check_outputs(args.output, args.plot)
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    trace = inputs.load_input(args)
    policies = inputs.policies(args)
    options = inputs.replay_options(args)
    tiered = inputs.tier_capacities(args, trace)
    capacities = tiered if tiered is not None else inputs.capacities(args, trace, default_caps)
    with_bounds = not args.no_bounds and tiered is None  # bounds are single-tier
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
    except SweepInterrupted as interrupted:
        sweep = interrupted.partial
        if not sweep.tasks_done:
            if new_plot_dir:
                _remove_if_empty(Path(args.plot))
            raise
    except Exception as exc:
        blame = blame_user_policy(exc)
        if blame is None:
            raise
        raise blame from exc
    finally:
        if progress is not None:
            progress.stop()
    return Grid(trace, capacities, sweep, policies)


def _remove_if_empty(directory: Path) -> None:
    # Not empty (someone wrote there) or already gone: leave it.
    with contextlib.suppress(OSError):
        directory.rmdir()


def report(args: argparse.Namespace, grid: Grid) -> int:
    """Print the results (table or JSON), then write the files; 1 if a file failed.

    With ``--shadow`` candidates the shadow estimates follow (``"shadow"`` in JSON).
    """
    trace, sweep = grid.trace, grid.sweep
    label_of = {c.blocks: c.label for c in grid.capacities}
    labels = [label_of.get(b.capacity_blocks, "") for b in sweep.bounds]
    record = output.sweep_record(trace, sweep, labels, args.timing)
    finished = f"{sweep.tasks_done} of {sweep.tasks_total} tasks finished"
    if sweep.partial:  # Ctrl-C: what finished, marked so nobody takes it for the whole grid
        record.update(partial=True, tasks_finished=sweep.tasks_done, tasks_total=sweep.tasks_total)
    candidates = inputs.shadow_candidates(args)
    rows = shadow_rows(sweep.results, candidates) if candidates else []
    if rows:
        record["shadow"] = rows
    if args.format == "json":
        output.emit_json(record)
    else:
        tables = output.tables()
        mode = args.mode + (", overlapped" if args.overlap else "")
        autos = answer.auto_candidates(grid.specs)
        items = [
            output.trace_caption(trace, f"mode {mode}"),
            tables.results_table(
                sweep.results,
                sweep.bounds,
                timing=args.timing,
                display=lambda r: answer.display_name(r, autos),
            ),
            tables.results_legend(
                args.mode,
                args.timing,
                bounds=bool(sweep.bounds),
                auto=any(answer.ran(r, autos) for r in sweep.results),
            ),
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
        name = args.trace and args.trace.rsplit("/", 1)[-1]
        source = f"this trace ({name})" if name else "this generated workload"
        lines = answer.answer_lines(sweep.results, autos, source)
        items += ["", *lines] if lines else []
        if sweep.partial:
            items.append(f"partial: interrupted, {finished}")
        output.print_rich(*items)
    title = (args.trace and args.trace.rsplit("/", 1)[-1]) or "generated workload"
    if sweep.partial:
        title += f" (partial: {finished})"
    errors = output.write_outputs(
        args.output,
        args.plot,
        record,
        sweep,
        title,
        args.timing,
        all_policies=getattr(args, "all_policies", False),
    )
    for line in errors:
        print(f"kvoffload: error: {line}", file=sys.stderr)
    if sweep.partial:
        written = " and ".join(
            what for what, given in (("the files", args.output), ("the plots", args.plot)) if given
        )
        kept = f"; {written} hold them, marked partial" if written else ""
        print(f"kvoffload: interrupted: {finished}{kept}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 1 if errors else 0


__all__ = ["Grid", "blame_user_policy", "progress_bar", "report", "run_grid"]
