"""Aligned tables for people (rich; the ``[cli]`` extra).

Results are grouped by capacity, with the bounds (Belady MIN, OPT with bypass, infinite
cache) under each group, the best policy of each group starred, and a legend that says what
every column means. Tables fit 80 columns; a narrower terminal gets a wider table (the
terminal wraps it) rather than numbers cut short with an ellipsis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

try:
    from rich import box
    from rich.console import Console, RenderableType
    from rich.measure import Measurement
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError(
        "tables need rich: pip install 'kvoffload[cli]' (or use --format json)"
    ) from exc

from kvoffload.sim.bounds import Bounds
from kvoffload.sim.replay import ReplayResult

BEST_MARK = "*"


def _ratio(value: float) -> str:
    return f"{value:.4f}"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def score(result: ReplayResult) -> float:
    """What a policy is ranked by: usable prefix hits (prefix mode) or block hits."""
    return result.prefix_hit_ratio if result.mode == "prefix" else result.block_hit_ratio


def _share_of_opt(result: ReplayResult, bounds: Bounds | None) -> str:
    if bounds is None:
        return "-"
    best = (
        bounds.opt_bypass_prefix_hit_ratio
        if result.mode == "prefix"
        else bounds.opt_bypass_hit_ratio
    )
    return f"{100 * score(result) / best:.0f}%" if best > 0 else "-"


def results_legend(mode: str, timing: bool = False, bounds: bool = True, auto: bool = False) -> str:
    """What the columns of :func:`results_table` mean, for printing under it."""
    ranked = "prefix hit" if mode == "prefix" else "block hit"
    lines = [
        "block hit: share of looked-up blocks found in the cache (any position); "
        "prefix hit: share in each request's leading run of hits, what an engine can "
        "actually load; token hit: that run weighed by its tokens.",
        f"{BEST_MARK} best policy at that capacity (by {ranked})."
        + (f" of OPT: {ranked} as a share of OPT (bypass)'s, the best possible." if bounds else ""),
    ]
    if bounds:
        lines.append(
            "Bounds: Belady MIN evicts the block reused furthest ahead; OPT (bypass) may also "
            "decline to store; infinite cache never evicts."
        )
    if auto:
        lines.append(
            "auto -> X: the candidate auto was running at the end of the replay (its hits are "
            "that candidate's, and those of the ones it switched from)."
        )
    if timing:
        lines.append(
            "blocks/s: block accesses replayed per second of wall time (varies run to run)."
        )
    return "\n".join(lines)


def results_table(
    results: Sequence[ReplayResult],
    bounds: Sequence[Bounds] = (),
    title: str | None = None,
    timing: bool = False,
    display: Callable[[ReplayResult], str] | None = None,
) -> Table:
    """Policies by capacity, the best of each capacity starred, bounds rows under each group.

    ``display`` names a result's row (default: its policy label).
    """
    # Keyed by label too: tier lists with the same CPU capacity are different columns.
    by_capacity: dict[tuple[int, str], list[ReplayResult]] = {}
    for result in results:
        by_capacity.setdefault((result.capacity_blocks, result.capacity_label), []).append(result)
    bounds_at = {b.capacity_blocks: b for b in bounds}
    table = Table(
        title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column("policy", overflow="fold")
    headers = ["block\nhit", "prefix\nhit", "token\nhit", "of\nOPT", "evictions", "store\nfails"]
    if timing:
        headers.append("blocks/s")
    for name in headers:
        table.add_column(name, justify="right", no_wrap=True)
    blank = [""] * len(headers)
    for (capacity, _), group in by_capacity.items():
        label = group[0].capacity_label or str(capacity)
        blocks = f"{capacity:,} block" + ("" if capacity == 1 else "s")
        heading = label if label == str(capacity) else f"{label} = {blocks}"
        table.add_row(f"capacity {heading}", *blank, style="bold")
        best = max(score(r) for r in group)
        b = bounds_at.get(capacity)
        for r in group:
            starred = len(group) > 1 and math.isclose(score(r), best)
            cells = [
                _ratio(r.block_hit_ratio),
                _ratio(r.prefix_hit_ratio),
                _ratio(r.token_hit_ratio),
                _share_of_opt(r, b),
                _count(r.evictions),
                _count(r.store_failures),
            ]
            if timing:
                cells.append(_count(r.blocks_per_s))
            shown = display(r) if display is not None else r.policy
            name = f"{shown} {BEST_MARK}" if starred else shown
            table.add_row(name, *cells, style="bold" if starred else None)
        if b is not None:
            for name, block, prefix, tokens in (
                ("Belady MIN", b.belady_hit_ratio, b.belady_prefix_hit_ratio, ""),
                ("OPT (bypass)", b.opt_bypass_hit_ratio, b.opt_bypass_prefix_hit_ratio, ""),
                (
                    "infinite cache",
                    b.infinite_hit_ratio,
                    b.infinite_prefix_hit_ratio,
                    _ratio(b.infinite_token_hit_ratio),
                ),
            ):
                row = [_ratio(block), _ratio(prefix), tokens, *blank[3:]]
                table.add_row(name, *row, style="italic dim")
        table.add_section()
    return table


def _bytes(value: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def _seconds(value: float) -> str:
    return f"{value:,.1f}"


def tiers_table(results: Sequence[ReplayResult], title: str | None = None) -> Table:
    """Per tier of each multi-tier result: hits, bytes moved, modelled prefill time saved."""
    table = Table(
        title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column("tier", overflow="fold")
    headers = ["hit", "hit\nblocks", "read", "written", "load\ns", "recompute\ns", "saved\ns"]
    for name in headers:
        table.add_column(name, justify="right", no_wrap=True)
    blank = [""] * len(headers)
    for r in results:
        if r.tiers is None:
            continue
        t = r.tiers
        table.add_row(f"{r.policy} @ {r.capacity_label}", *blank, style="bold")
        for tier in t["per_tier"]:
            table.add_row(
                f"{tier['tier']} ({tier['capacity']})",
                _ratio(tier["hit_ratio"]),
                _count(tier["hit_blocks"]),
                _bytes(tier["read_bytes"]),
                _bytes(tier["written_bytes"]),
                _seconds(tier["load_s"]),
                _seconds(tier["recompute_s"]),
                _seconds(tier["saved_s"]),
            )
        table.add_row(
            "all tiers",
            _ratio(t["hit_ratio"]),
            _count(t["hit_blocks"]),
            *blank[2:6],
            f"{_seconds(t['saved_s'])} ({100 * t['saved_share']:.1f}%)",
            style="italic",
        )
        table.add_section()
    return table


def tiers_legend(results: Sequence[ReplayResult]) -> str:
    """What the columns of :func:`tiers_table` mean, with the block size and prefill speed."""
    t = next(r.tiers for r in results if r.tiers is not None)
    return "\n".join(
        [
            "hit: share of block accesses served from that tier in a request's leading run of "
            "hits (the tiers add up to the prefix hit above); read: bytes out of the tier "
            "(cpu: loads to the GPU; secondaries: promotions into the CPU); written: bytes "
            "into it (cpu: stores plus promotions; secondaries: puts, per --tier-write-policy).",
            "load s: modelled time to load those blocks (latency once per request and tier + "
            "bytes / bandwidth, plus the CPU hop for secondaries); recompute s: their tokens "
            f"at {t['prefill_tokens_per_s']:,.0f} prefill tokens/s; saved = recompute - load "
            "(negative: that tier loads slower than prefill recomputes); all tiers: the share "
            "of the whole trace's prefill time saved.",
            f"Blocks of {_bytes(t['block_bytes'])} ({t['bytes_per_token']:,.0f} bytes/token; "
            "--bytes-per-token). Media defaults in docs/simulator.md.",
        ]
    )


def bounds_table(
    bounds: Sequence[Bounds], labels: Sequence[str] = (), title: str | None = None
) -> Table:
    """One row per capacity: infinite cache, Belady MIN and OPT with bypass."""
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for name in (
        "capacity",
        "blocks",
        "infinite",
        "infinite\n(tokens)",
        "Belady\nMIN",
        "OPT\n(bypass)",
        "max live",
    ):
        table.add_column(name, justify="right", no_wrap=True)
    for i, b in enumerate(bounds):
        table.add_row(
            labels[i] if i < len(labels) else str(b.capacity_blocks),
            _count(b.capacity_blocks),
            _ratio(b.infinite_hit_ratio),
            _ratio(b.infinite_token_hit_ratio),
            _ratio(b.belady_hit_ratio),
            _ratio(b.opt_bypass_hit_ratio),
            _count(b.max_live_blocks),
        )
    return table


BOUNDS_LEGEND = (
    "Block hit ratios. infinite: a cache that never evicts; Belady MIN evicts the block "
    "reused furthest ahead; OPT (bypass) may also decline to store; max live: most blocks "
    "waiting for a reuse at one time (a cache this big loses nothing)."
)


def policies_table(infos: Iterable[object]) -> Table:
    """``kvoffload policies``: name, description, where it comes from, what it loads."""
    table = Table(header_style="bold", box=box.SIMPLE_HEAD)
    for column in ("name", "description", "source", "target"):
        table.add_column(column, overflow="fold")
    for info in infos:
        table.add_row(*(str(getattr(info, k)) for k in ("name", "description", "source", "target")))
    return table


def key_value_table(rows: Iterable[tuple[str, object]], title: str | None = None) -> Table:
    """A two-column table (for trace and workload summaries)."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right", no_wrap=True)
    for key, value in rows:
        table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    return table


def stdout_console() -> Console:
    """Console for tables on stdout; wide when piped, so columns never wrap."""
    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console = Console(soft_wrap=False, width=200)
    return console


def print_renderables(console: Console, *items: RenderableType) -> None:
    """Print text (wrapped at the width) and tables (never narrower than their numbers)."""
    for item in items:
        if isinstance(item, str):
            # Piped, a line of text stays one line (a reader's pager or grep sees whole
            # sentences); on a terminal it wraps at the terminal's width.
            console.print(item, highlight=False, soft_wrap=not console.is_terminal)
            continue
        unbounded = console.options.update(width=10_000)
        needed = Measurement.get(console, unbounded, item).minimum
        if needed > console.width:
            # Cutting numbers with an ellipsis would be worse than a wrapped line.
            console.print(item, highlight=False, width=needed)
        else:
            console.print(item, highlight=False)


__all__ = [
    "BEST_MARK",
    "BOUNDS_LEGEND",
    "bounds_table",
    "key_value_table",
    "policies_table",
    "print_renderables",
    "results_legend",
    "results_table",
    "score",
    "stdout_console",
]
