"""Where results go: stdout (table or JSON) and the ``-o`` / ``--plot`` files.

Output paths are checked before any work starts (a run must not be lost to a typo in a
directory name), and stdout is written before the files, so a file that still fails to
write never takes the table with it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kvoffload.cli.errors import UserError
from kvoffload.sim.records import Trace
from kvoffload.sim.report import dump_json, grid_record, write_results_csv
from kvoffload.sim.sweep import SweepResult

OUTPUT_SUFFIXES = (".json", ".csv")
CURVE_FILE = "hit_ratio_curve.png"


def _probe_file(path: Path, what: str) -> None:
    """Fail now if ``path`` cannot be written; leaves an existing file's bytes untouched."""
    if path.is_dir():
        raise UserError(f"{what} '{path}' is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise UserError(f"{what} '{path}': directory '{parent}' does not exist")
    existed = path.exists()
    try:
        with path.open("a"):
            pass
    except OSError as exc:
        raise UserError(f"{what} '{path}' cannot be written: {exc.strerror or exc}") from None
    if not existed:
        path.unlink()


def check_outputs(outputs: Sequence[str] | None, plot: str | None) -> None:
    """Every ``-o`` file and the ``--plot`` directory can be written (raises otherwise)."""
    for name in outputs or ():
        if Path(name).suffix not in OUTPUT_SUFFIXES:
            raise UserError(f"--output '{name}': use a .json or .csv file name")
        _probe_file(Path(name), "--output")
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UserError(
                "--plot needs matplotlib: pip install 'kvoffload[plot]' (or pip install matplotlib)"
            ) from None
        directory = Path(plot)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(
                f"--plot '{plot}': cannot create the directory: {exc.strerror or exc}"
            ) from None
        if not os.access(directory, os.W_OK):
            raise UserError(f"--plot '{plot}': the directory is not writable")
        _probe_file(directory / CURVE_FILE, "--plot")


def emit_json(obj: Any) -> None:
    dump_json(obj, sys.stdout)
    sys.stdout.flush()


def tables() -> ModuleType:
    """:mod:`kvoffload.sim.report.table`, or a user error naming the extra it needs."""
    try:
        from kvoffload.sim.report import table
    except ImportError as exc:
        raise UserError(str(exc)) from None
    return table


def print_rich(*items: Any) -> None:
    """Text and tables on stdout (rich: the ``[cli]`` extra)."""
    table = tables()
    table.print_renderables(table.stdout_console(), *items)
    sys.stdout.flush()


def trace_caption(trace: Trace, extra: str = "") -> str:
    return (
        f"{trace.source}: {len(trace.requests):,} requests, {trace.block_accesses:,} block "
        f"accesses, {trace.num_unique_blocks:,} unique blocks of {trace.block_tokens} tokens"
        + (f"; {extra}" if extra else "")
    )


def sweep_record(trace: Trace, sweep: SweepResult, labels: Sequence[str], timing: bool) -> Any:
    return grid_record(trace.describe(), sweep.results, sweep.bounds, labels, timing)


def write_outputs(
    outputs: Sequence[str] | None,
    plot: str | None,
    record: dict[str, Any],
    sweep: SweepResult,
    title: str,
    timing: bool,
    all_policies: bool = False,
) -> list[str]:
    """Write every file; return one error line per file that failed (the others are written)."""
    errors: list[str] = []
    for name in outputs or ():
        path = Path(name)
        try:
            with path.open("w", newline="") as out:
                if path.suffix == ".csv":
                    write_results_csv(
                        sweep.results, sweep.bounds, out, timing, partial=sweep.partial
                    )
                else:
                    dump_json(record, out)
        except OSError as exc:
            errors.append(f"--output '{name}' was not written: {exc.strerror or exc}")
    if plot:
        from kvoffload.sim.report.plot import (
            TOP_POLICIES,
            plot_capacity_bars,
            plot_hit_ratio_curves,
            plot_tiers,
        )

        directory = Path(plot)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if any(r.tiers is not None for r in sweep.results):  # --tiers: one tier chart
                plot_tiers(sweep.results, directory / "tiers.png", title)
            else:
                plot_hit_ratio_curves(
                    sweep.results,
                    sweep.bounds,
                    directory / CURVE_FILE,
                    title,
                    top=None if all_policies else TOP_POLICIES,
                )
                plot_capacity_bars(sweep.results, sweep.bounds, directory, title)
        except OSError as exc:
            errors.append(f"--plot '{plot}' was not written: {exc.strerror or exc}")
    return errors


__all__ = [
    "check_outputs",
    "emit_json",
    "print_rich",
    "sweep_record",
    "tables",
    "trace_caption",
    "write_outputs",
]
