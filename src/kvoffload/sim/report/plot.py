"""Charts of a sweep, made to be read by a person: hit-ratio curves and a bar chart per
capacity, the bounds drawn in. Needs matplotlib (the ``[plot]`` extra).

Readability rules: the y axis is the hit ratio the tables show; the curves show the few best
policies, LRU (the baseline) and the bounds by default, each in a style no other line has
(all policies on request, each with its own colour *and* marker/line style, since 19 policies
on a 10-colour cycle would otherwise repeat); bars are sorted best first on an axis that spans
the policies' values, so a difference of a few thousandths shows; legends sit outside the
data; OPT and Belady stay visible when they coincide (a wide pale band under a thin dashed
line); files are named by the capacity asked for (``bars_5pct.png`` for ``5%``).
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

#: Policies a default curve shows besides the baseline.
TOP_POLICIES = 4
#: The baseline every chart keeps in view.
BASELINE = "lru"
# The few best: solid lines, colours and markers no other line uses; the baseline: red, dashed.
_TOP_STYLES = tuple(
    {"color": colour, "marker": marker, "linestyle": "-"}
    for colour, marker in zip(
        ("C0", "C1", "C2", "C4", "C5", "C6", "C8", "C9"),
        ("o", "s", "^", "D", "v", "P", "<", ">"),
        strict=True,
    )
)
_BASELINE_STYLE = {"color": "C3", "marker": "x", "linestyle": "--", "linewidth": 2.0}


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


def _ranked_policies(results: Sequence[ReplayResult]) -> list[str]:
    """Policy labels, best first by mean hit ratio over the capacities each ran at."""
    totals: dict[str, list[float]] = {}
    for r in results:
        totals.setdefault(r.policy, []).append(_metric(r))
    return sorted(totals, key=lambda p: -sum(totals[p]) / len(totals[p]))


def curve_policies(results: Sequence[ReplayResult], top: int | None = TOP_POLICIES) -> list[str]:
    """The policies a hit-ratio curve draws, best first: the ``top`` best, then the baseline.

    ``top=None``: every policy.
    """
    ranked = _ranked_policies(results)
    if top is None:
        return ranked
    shown = ranked[:top]
    if BASELINE in ranked and BASELINE not in shown:
        shown.append(BASELINE)
    return shown


def bar_axis(values: Sequence[float], baseline: float | None = None) -> tuple[float, float]:
    """The hit-ratio range a bar chart spans: every policy within half of the best's value,
    and the baseline.

    A policy far below the others (``sae`` at a tenth of them) would otherwise squash every
    difference that matters into a few pixels; bars below the start get their value written
    at the axis' edge instead.
    """
    best = max(values)
    near = [v for v in values if v >= best / 2]
    low = min([*near, *([baseline] if baseline is not None else [])])
    span = (best - low) or (best * 0.1) or 0.1
    return max(0.0, low - 0.6 * span), best + 0.3 * span


def plot_hit_ratio_curves(
    results: Sequence[ReplayResult],
    bounds: Sequence[Bounds],
    path: str | os.PathLike[str],
    title: str = "",
    top: int | None = TOP_POLICIES,
) -> Path:
    """Hit ratio against capacity: the ``top`` best policies, LRU and the bounds.

    ``top=None`` draws every policy. The legend lists the policies best first.
    """
    plt = _pyplot()
    by_policy: dict[str, list[ReplayResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    ranked = _ranked_policies(results)
    shown = curve_policies(results, top)
    fig, ax = plt.subplots(figsize=(10, 6))
    mode = results[0].mode if results else "prefix"
    ordered = sorted(bounds, key=lambda b: b.capacity_blocks)
    if ordered:
        xs = [b.capacity_blocks for b in ordered]
        values = [_bound_values(b, mode) for b in ordered]
        for name, style in _BOUND_STYLE.items():
            ys = [v[name] for v in values]
            ax.plot(xs, ys, label=_bound_label(name, values), zorder=1, **style)
    top_index = 0
    drawn: dict[str, list[float]] = {}
    for rank, policy in enumerate(shown):
        rows = sorted(by_policy[policy], key=lambda r: r.capacity_blocks)
        ys = [_metric(r) for r in rows]
        # A policy with the very same curve as one drawn before (auto and the candidate it
        # ran) would hide under it: say so in the legend and draw it dotted, hollow, larger.
        twin = next((p for p, v in drawn.items() if v == ys), None)
        drawn[policy] = ys
        if top is None:
            style = policy_style(ranked.index(policy))
        elif policy == BASELINE:
            style = dict(_BASELINE_STYLE)
        else:
            style = dict(_TOP_STYLES[top_index % len(_TOP_STYLES)])
            top_index += 1
        style.setdefault("linewidth", 1.4)
        label = policy + (" (baseline)" if policy == BASELINE else "")
        extra: dict[str, Any] = {"markersize": 6}
        if twin is not None:
            label += f" (= {twin} here)"
            style["linestyle"] = ":"
            extra = {"markersize": 11, "markerfacecolor": "none", "markeredgewidth": 1.5}
        ax.plot(
            [r.capacity_blocks for r in rows],
            ys,
            label=label,
            zorder=3 if policy == BASELINE else 2.5 - rank / 100,
            **extra,
            **style,
        )
    labels = _labels_by_capacity(results, bounds)
    if len(labels) > 2:
        ax.set_xscale("log")
    ax.set_xticks(sorted(labels), [f"{labels[c]}\n{c:,}" for c in sorted(labels)])
    ax.minorticks_off()
    ax.set_xlabel("capacity (as asked, and in blocks)")
    what = "usable prefix" if mode == "prefix" else "block"
    ax.set_ylabel(f"{what} hit ratio; higher is better")
    ax.set_ylim(bottom=0)
    title = title or "Hit-ratio curves"
    if len(shown) < len(by_policy):
        title += f"\nthe best {top} of {len(by_policy)} policies" + (
            f" and {BASELINE}" if BASELINE in by_policy else ""
        )
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")
    out = Path(path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


#: The earlier name (the curve once showed miss ratios).
plot_miss_ratio_curves = plot_hit_ratio_curves


def plot_capacity_bars(
    results: Sequence[ReplayResult],
    bounds: Sequence[Bounds],
    directory: str | os.PathLike[str],
    title: str = "",
) -> list[Path]:
    """One chart per capacity: a horizontal bar per policy, best first, bounds as lines.

    The axis spans the policies' values (not zero to the infinite cache), so bars that differ
    by a few thousandths differ visibly; a bound off the axis keeps its value in the legend.
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
        rows = sorted(rows, key=_metric, reverse=True)
        fig, ax = plt.subplots(figsize=(9, 1.2 + 0.32 * len(rows)))
        values = [_metric(r) for r in rows]
        best = values[0]
        baseline = next((_metric(r) for r in rows if r.policy == BASELINE), None)
        xmin, xmax = bar_axis(values, baseline)
        ys = list(range(len(rows)))[::-1]  # best on top
        colours = [
            "tab:orange" if v == best else "tab:red" if r.policy == BASELINE else "tab:blue"
            for r, v in zip(rows, values, strict=True)
        ]
        # Bars start at the axis' left edge, which is not zero: the label below says so.
        widths = [max(0.0, v - xmin) for v in values]
        ax.barh(ys, widths, left=xmin, color=colours, height=0.7, zorder=2)
        ax.set_yticks(ys, [r.policy for r in rows])
        for y, v in zip(ys, values, strict=True):
            if v >= xmin:
                ax.text(v, y, f" {v:.4f}", va="center", fontsize="x-small", zorder=3)
            else:
                ax.text(xmin, y, f" {v:.4f} (below the axis)", va="center", fontsize="x-small")
        b = bounds_at.get(capacity)
        if b is not None:
            bound_values = _bound_values(b, rows[0].mode)
            for name, style in _BOUND_STYLE.items():
                value = bound_values[name]
                off = " (off the axis)" if not xmin <= value <= xmax else ""
                label = f"{_bound_label(name, [bound_values])} {value:.4f}{off}"
                ax.axvline(value, label=label, zorder=1 if name == "OPT (bypass)" else 4, **style)
        ax.bar([0], [0], color="tab:orange", label="best policy here")
        if any(r.policy == BASELINE for r in rows):
            ax.bar([0], [0], color="tab:red", label=f"{BASELINE} (baseline)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")
        label = rows[0].capacity_label or str(capacity)
        ax.set_title(f"{title + ': ' if title else ''}capacity {label} ({capacity:,} blocks)")
        what = "usable prefix hit ratio" if rows[0].mode == "prefix" else "block hit ratio"
        start = "" if xmin == 0 else f"; the axis starts at {xmin:.4f}, not 0"
        ax.set_xlabel(f"{what}; higher is better{start}")
        ax.set_xlim(xmin, xmax)
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
    "BASELINE",
    "TOP_POLICIES",
    "bar_axis",
    "capacity_file_name",
    "curve_policies",
    "plot_capacity_bars",
    "plot_hit_ratio_curves",
    "plot_miss_ratio_curves",
    "plot_tiers",
    "policy_style",
]
