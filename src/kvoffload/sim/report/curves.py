"""What ``mrc`` writes: a JSON record, CSV rows and two charts (hit ratio against capacity,
and against time per window). JSON and CSV need the standard library only; the charts need
matplotlib (the ``[plot]`` extra) and are imported on use."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from kvoffload.sim.mrc import CurvePoint, Curves


def curves_record(trace: dict[str, Any], curves: Curves, timing: bool = False) -> dict[str, Any]:
    """``{"trace", "mode", "measure", "points", "windows"}`` (``elapsed_s`` with ``timing``)."""
    record: dict[str, Any] = {
        "trace": trace,
        "mode": curves.mode,
        "measure": curves.measure.describe(),
        "points": [p.to_dict() for p in curves.points],
        "windows": [p.to_dict() for p in curves.windows],
    }
    if timing:
        record["elapsed_s"] = curves.elapsed_s
    return record


def write_curves_csv(points: Sequence[CurvePoint], out: IO[str]) -> None:
    """One row per point (empty cells where a method gives no figure)."""
    rows = [p.to_dict() for p in points]
    if not rows:
        return
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})


def _pyplot() -> Any:
    from kvoffload.sim.report.plot import _pyplot as pyplot

    return pyplot()


def _by_policy(points: Sequence[CurvePoint]) -> dict[str, list[CurvePoint]]:
    out: dict[str, list[CurvePoint]] = {}
    for p in points:
        out.setdefault(f"{p.policy} ({p.method})", []).append(p)
    return out


def _metric(point: CurvePoint, mode: str) -> float:
    if mode == "prefix" and point.prefix_hit_ratio is not None:
        return point.prefix_hit_ratio
    return point.block_hit_ratio


def plot_curves(
    curves: Curves, path: str | os.PathLike[str], title: str = "", metric: str = "block"
) -> Path:
    """Hit ratio (y, as in the tables) against capacity (x), one line per policy; sampled
    points carry their error estimate as an error bar."""
    from kvoffload.sim.report.plot import policy_style

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 6))
    for i, (label, rows) in enumerate(_by_policy(curves.points).items()):
        rows = sorted(rows, key=lambda p: p.capacity_blocks)
        errors = [p.error_estimate or 0.0 for p in rows]
        mode = curves.mode if metric == "prefix" else "blocks"
        ax.errorbar(
            [p.capacity_blocks for p in rows],
            [_metric(p, mode) for p in rows],
            yerr=errors if any(errors) else None,
            label=label,
            markersize=4,
            linewidth=1.2,
            capsize=2,
            **policy_style(i),
        )
    ax.set_xscale("log")
    ax.set_xlabel("capacity (blocks)")
    ax.set_ylabel(("prefix" if metric == "prefix" else "block") + " hit ratio; higher is better")
    ax.set_title(title or "Hit-ratio curves")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")
    out = Path(path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_windows(
    points: Sequence[CurvePoint | Any], path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Hit ratio (y) over trace time (x, each window's start), one line per policy and
    capacity. Takes curve points or (label, WindowFigures) pairs."""
    from kvoffload.sim.report.plot import policy_style

    plt = _pyplot()
    series: dict[str, list[tuple[float, float]]] = {}
    for p in points:
        if isinstance(p, CurvePoint):
            label = f"{p.policy} @ {p.capacity}"
            series.setdefault(label, []).append((p.window_start_s or 0.0, p.block_hit_ratio))
        else:
            label, figures = p
            series.setdefault(label, []).append((figures.start_s or 0.0, figures.block_hit_ratio))
    fig, ax = plt.subplots(figsize=(10, 6))
    for i, (label, xy) in enumerate(series.items()):
        xy.sort()
        ax.plot(
            [x for x, _ in xy], [y for _, y in xy], label=label, markersize=3, **policy_style(i)
        )
    ax.set_xlabel("trace time (s, start of each window)")
    ax.set_ylabel("block hit ratio in the window; higher is better")
    ax.set_title(title or "Hit ratio over time")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")
    out = Path(path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


__all__ = ["curves_record", "plot_curves", "plot_windows", "write_curves_csv"]
