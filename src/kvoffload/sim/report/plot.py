"""Charts of a sweep, made to be read by a person: a miss-ratio curve per policy and a bar
chart per capacity, the bounds drawn in. Needs matplotlib (the ``[plot]`` extra).

Readability rules: every policy gets its own colour *and* marker/line style (18 policies on
a 10-colour cycle would otherwise repeat), legends sit outside the data, OPT and Belady stay
visible when they coincide (a wide pale band under a thin dashed line), and files are named
by the capacity asked for (``bars_5pct.png`` for ``5%``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvoffload.sim.bounds import Bounds
from kvoffload.sim.replay import ReplayResult

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
_LINESTYLES = ("-", "--", "-.", ":")


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


def policy_style(index: int) -> dict[str, Any]:
    """Colour, marker and line style of the ``index``-th policy.

    Colours repeat every 10 and markers every 9, so (colour, marker) is unique for 90
    policies; (marker, line style) alone is unique for 36, for readers who cannot tell
    the colours apart.
    """
    colours = [f"C{i}" for i in range(10)]
    return {
        "color": colours[index % 10],
        "marker": _MARKERS[index % len(_MARKERS)],
        "linestyle": _LINESTYLES[(index // len(_MARKERS)) % len(_LINESTYLES)],
    }


def capacity_file_name(label: str, prefix: str = "bars_", suffix: str = ".png") -> str:
    """A file name for a capacity as the user wrote it: ``5%`` -> ``bars_5pct.png``."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", label.strip().replace("%", "pct")).strip("_")
    return f"{prefix}{safe or 'capacity'}{suffix}"


def _metric(result: ReplayResult) -> float:
    return result.prefix_hit_ratio if result.mode == "prefix" else result.block_hit_ratio


def _bound_values(b: Bounds, mode: str) -> dict[str, float]:
    prefix = mode == "prefix"
    return {
        "OPT (bypass)": b.opt_bypass_prefix_hit_ratio if prefix else b.opt_bypass_hit_ratio,
        "Belady MIN": b.belady_prefix_hit_ratio if prefix else b.belady_hit_ratio,
        "infinite cache": b.infinite_prefix_hit_ratio if prefix else b.infinite_hit_ratio,
    }


# OPT: a wide pale band; Belady: a thin dashed line on top of it (so both show when equal).
_BOUND_STYLE: dict[str, dict[str, Any]] = {
    "OPT (bypass)": {"color": "0.55", "linewidth": 6, "alpha": 0.45, "linestyle": "-"},
    "Belady MIN": {"color": "black", "linewidth": 1.4, "linestyle": (0, (5, 3))},
    "infinite cache": {"color": "black", "linewidth": 1.2, "linestyle": ":"},
}


def _bound_label(name: str, values: list[dict[str, float]]) -> str:
    if name == "Belady MIN" and all(
        abs(v["Belady MIN"] - v["OPT (bypass)"]) < 5e-5 for v in values
    ):
        return "Belady MIN (= OPT here)"
    return name


def _labels_by_capacity(
    results: Sequence[ReplayResult], bounds: Sequence[Bounds]
) -> dict[int, str]:
    labels = {r.capacity_blocks: r.capacity_label or str(r.capacity_blocks) for r in results}
    for b in bounds:
        labels.setdefault(b.capacity_blocks, str(b.capacity_blocks))
    return labels


def plot_miss_ratio_curves(
    results: Sequence[ReplayResult],
    bounds: Sequence[Bounds],
    path: str | os.PathLike[str],
    title: str = "",
) -> Path:
    """Miss ratio (1 - usable hit ratio) against capacity, one line per policy."""
    plt = _pyplot()
    by_policy: dict[str, list[ReplayResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    fig, ax = plt.subplots(figsize=(10, 6))
    mode = results[0].mode if results else "prefix"
    ordered = sorted(bounds, key=lambda b: b.capacity_blocks)
    if ordered:
        xs = [b.capacity_blocks for b in ordered]
        values = [_bound_values(b, mode) for b in ordered]
        for name, style in _BOUND_STYLE.items():
            ys = [1 - v[name] for v in values]
            ax.plot(xs, ys, label=_bound_label(name, values), zorder=1, **style)
    for i, (policy, rows) in enumerate(by_policy.items()):
        rows = sorted(rows, key=lambda r: r.capacity_blocks)
        ax.plot(
            [r.capacity_blocks for r in rows],
            [1 - _metric(r) for r in rows],
            label=policy,
            markersize=5,
            linewidth=1.3,
            zorder=2,
            **policy_style(i),
        )
    labels = _labels_by_capacity(results, bounds)
    if len(labels) > 2:
        ax.set_xscale("log")
    ax.set_xticks(sorted(labels), [f"{labels[c]}\n{c:,}" for c in sorted(labels)])
    ax.minorticks_off()
    ax.set_xlabel("capacity (as asked, and in blocks)")
    what = "usable prefix" if mode == "prefix" else "block"
    ax.set_ylabel(f"miss ratio (1 - {what} hit ratio); lower is better")
    ax.set_title(title or "Miss-ratio curves")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")
    out = Path(path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_capacity_bars(
    results: Sequence[ReplayResult],
    bounds: Sequence[Bounds],
    directory: str | os.PathLike[str],
    title: str = "",
) -> list[Path]:
    """One chart per capacity: a horizontal bar per policy, bounds as vertical lines.

    Files are ``bars_<capacity as asked>.png`` (``%`` spelled ``pct``).
    """
    plt = _pyplot()
    bounds_at = {b.capacity_blocks: b for b in bounds}
    by_capacity: dict[int, list[ReplayResult]] = {}
    for r in results:
        by_capacity.setdefault(r.capacity_blocks, []).append(r)
    used: set[str] = set()
    paths = []
    for capacity, rows in by_capacity.items():
        fig, ax = plt.subplots(figsize=(9, 1.2 + 0.32 * len(rows)))
        values = [_metric(r) for r in rows]
        best = max(values)
        ys = list(range(len(rows)))[::-1]  # first policy on top
        colours = ["tab:orange" if v == best else "tab:blue" for v in values]
        ax.barh(ys, values, color=colours, height=0.7, zorder=2)
        ax.set_yticks(ys, [r.policy for r in rows])
        for y, v in zip(ys, values, strict=True):
            ax.text(v, y, f" {v:.4f}", va="center", fontsize="x-small", zorder=3)
        b = bounds_at.get(capacity)
        if b is not None:
            bound_values = _bound_values(b, rows[0].mode)
            for name, style in _BOUND_STYLE.items():
                value = bound_values[name]
                label = f"{_bound_label(name, [bound_values])} {value:.4f}"
                ax.axvline(value, label=label, zorder=1 if name == "OPT (bypass)" else 4, **style)
        ax.bar([0], [0], color="tab:orange", label="best policy here")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")
        label = rows[0].capacity_label or str(capacity)
        ax.set_title(f"{title + ': ' if title else ''}capacity {label} ({capacity:,} blocks)")
        what = "usable prefix hit ratio" if rows[0].mode == "prefix" else "block hit ratio"
        ax.set_xlabel(f"{what}; higher is better")
        ax.set_xlim(0, max([*values, *(bound_values.values() if b else [])]) * 1.12 or 1)
        ax.grid(True, axis="x", alpha=0.3)
        name = capacity_file_name(label)
        if name in used:
            name = capacity_file_name(f"{label}_{capacity}")
        used.add(name)
        out = Path(directory) / name
        fig.savefig(out, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(out)
    return paths


def plot_tiers(
    results: Sequence[ReplayResult], out: str | os.PathLike[str], title: str = ""
) -> Path:
    """Multi-tier results: per result, the hit ratio stacked by tier, and the time saved by tier.

    One row per (policy, tier list); the left panel stacks each tier's share of block accesses,
    the right one each tier's modelled prefill seconds saved (negative: slower than recompute).
    """
    plt = _pyplot()
    rows = [r for r in results if r.tiers is not None]
    if not rows:
        raise ValueError("plot_tiers needs results of a multi-tier replay (--tiers)")
    labels = [f"{r.policy} @ {r.capacity_label}" for r in rows]
    tier_names: list[str] = []
    for r in rows:
        assert r.tiers is not None
        tier_names.extend(t["tier"] for t in r.tiers["per_tier"] if t["tier"] not in tier_names)
    fig, (hits_ax, saved_ax) = plt.subplots(1, 2, figsize=(11, 1.6 + 0.45 * len(rows)), sharey=True)
    ys = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for index, name in enumerate(tier_names):
        hits, saved = [], []
        for r in rows:
            assert r.tiers is not None
            tier = next((t for t in r.tiers["per_tier"] if t["tier"] == name), None)
            hits.append(tier["hit_ratio"] if tier else 0.0)
            saved.append(tier["saved_s"] if tier else 0.0)
        colour = f"C{index % 10}"
        hits_ax.barh(ys, hits, left=left, color=colour, height=0.7, label=name, zorder=2)
        left = [a + b for a, b in zip(left, hits, strict=True)]
        offset = (index - (len(tier_names) - 1) / 2) * 0.7 / len(tier_names)
        saved_ax.barh(
            [y + offset for y in ys], saved, height=0.7 / len(tier_names), color=colour, zorder=2
        )
    for y, total in zip(ys, left, strict=True):
        hits_ax.text(total, y, f" {total:.3f}", va="center", fontsize="x-small", zorder=3)
    hits_ax.set_yticks(ys, labels)
    hits_ax.set_xlabel("usable prefix hit ratio, by the tier that served it")
    hits_ax.set_xlim(0, max(left) * 1.15 or 1)
    saved_ax.axvline(0, color="black", linewidth=0.8)
    saved_ax.set_xlabel("prefill seconds saved against recomputation")
    for ax in (hits_ax, saved_ax):
        ax.grid(True, axis="x", alpha=0.3)
    hits_ax.legend(
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncol=len(tier_names),
        fontsize="small",
        frameon=False,
    )
    fig.suptitle(f"{title + ': ' if title else ''}multi-tier replay", y=1.02)
    path = Path(out)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


__all__ = [
    "capacity_file_name",
    "plot_capacity_bars",
    "plot_miss_ratio_curves",
    "plot_tiers",
    "policy_style",
]
