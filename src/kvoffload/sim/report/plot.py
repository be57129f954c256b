"""Charts of a sweep: a miss-ratio curve per policy and a bar chart per capacity, with the
bounds drawn in. Needs matplotlib (the ``[plot]`` extra); imported only when plotting."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvoffload.sim.bounds import Bounds
from kvoffload.sim.replay import ReplayResult


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "plots need matplotlib: pip install 'kvoffload[plot]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _metric(result: ReplayResult) -> float:
    return result.prefix_hit_ratio if result.mode == "prefix" else result.block_hit_ratio


def _bound_lines(b: Bounds, mode: str) -> list[tuple[str, float, str]]:
    prefix = mode == "prefix"
    return [
        ("OPT (bypass)", b.opt_bypass_prefix_hit_ratio if prefix else b.opt_bypass_hit_ratio, "--"),
        ("Belady MIN", b.belady_prefix_hit_ratio if prefix else b.belady_hit_ratio, ":"),
        ("infinite cache", b.infinite_prefix_hit_ratio if prefix else b.infinite_hit_ratio, "-."),
    ]


def plot_miss_ratio_curves(
    results: Sequence[ReplayResult],
    bounds: Sequence[Bounds],
    path: str | os.PathLike[str],
    title: str = "",
) -> Path:
    """Miss ratio (1 - usable hit ratio) against capacity, one line per policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    by_policy: dict[str, list[ReplayResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    for policy, rows in by_policy.items():
        rows = sorted(rows, key=lambda r: r.capacity_blocks)
        ax.plot(
            [r.capacity_blocks for r in rows],
            [1 - _metric(r) for r in rows],
            marker="o",
            label=policy,
        )
    mode = results[0].mode if results else "prefix"
    ordered = sorted(bounds, key=lambda b: b.capacity_blocks)
    if ordered:
        xs = [b.capacity_blocks for b in ordered]
        for i, (label, _, style) in enumerate(_bound_lines(ordered[0], mode)):
            ys = [1 - _bound_lines(b, mode)[i][1] for b in ordered]
            ax.plot(xs, ys, linestyle=style, color="black", alpha=0.7, label=label)
    if len({r.capacity_blocks for r in results} | {b.capacity_blocks for b in bounds}) > 2:
        ax.set_xscale("log")
    ax.set_xlabel("capacity (blocks)")
    ax.set_ylabel("miss ratio" + (" (usable prefix)" if mode == "prefix" else ""))
    ax.set_title(title or "Miss-ratio curves")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_capacity_bars(
    results: Sequence[ReplayResult],
    bounds: Sequence[Bounds],
    directory: str | os.PathLike[str],
    title: str = "",
) -> list[Path]:
    """One bar chart per capacity: each policy's hit ratio, bounds as horizontal lines."""
    plt = _pyplot()
    bounds_at = {b.capacity_blocks: b for b in bounds}
    by_capacity: dict[int, list[ReplayResult]] = {}
    for r in results:
        by_capacity.setdefault(r.capacity_blocks, []).append(r)
    paths = []
    for capacity, rows in by_capacity.items():
        fig, ax = plt.subplots(figsize=(max(5, 0.8 * len(rows) + 2), 4.5))
        names = [r.policy for r in rows]
        ax.bar(names, [_metric(r) for r in rows], color="tab:blue")
        b = bounds_at.get(capacity)
        if b is not None:
            for label, value, style in _bound_lines(b, rows[0].mode):
                ax.axhline(
                    value, linestyle=style, color="black", alpha=0.7, label=f"{label} {value:.3f}"
                )
            ax.legend(fontsize="small", loc="lower right")
        label = rows[0].capacity_label or str(capacity)
        ax.set_title(f"{title + ': ' if title else ''}capacity {label} ({capacity:,} blocks)")
        ax.set_ylabel("usable prefix hit ratio" if rows[0].mode == "prefix" else "block hit ratio")
        ax.tick_params(axis="x", labelrotation=30)
        fig.tight_layout()
        out = Path(directory) / f"bars_{capacity}.png"
        fig.savefig(out, dpi=120)
        plt.close(fig)
        paths.append(out)
    return paths


__all__ = ["plot_capacity_bars", "plot_miss_ratio_curves"]
