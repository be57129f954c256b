"""Turning results into what people read (aligned rich tables) and what scripts read (JSON, CSV).

Tables group rows by capacity and put the bounds (Belady MIN, OPT with bypass, infinite
cache) under each group, so every policy is seen next to the best possible.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from typing import IO, Any

try:
    from rich.console import Console
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError(
        "the kvoffload command needs rich: pip install 'kvoffload[cli]'"
    ) from exc

from kvoffload.sim.bounds import Bounds
from kvoffload.sim.replay import ReplayResult


def _ratio(value: float) -> str:
    return f"{value:.4f}"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _share_of_opt(result: ReplayResult, bounds: Bounds | None) -> str:
    """The policy's usable hits as a share of OPT's (prefix mode) or its block hits'."""
    if bounds is None:
        return "-"
    if result.mode == "prefix":
        mine, best = result.prefix_hit_ratio, bounds.opt_bypass_prefix_hit_ratio
    else:
        mine, best = result.block_hit_ratio, bounds.opt_bypass_hit_ratio
    return f"{100 * mine / best:.0f}%" if best > 0 else "-"


def results_table(
    results: Sequence[ReplayResult], bounds: Sequence[Bounds] = (), title: str | None = None
) -> Table:
    """Policies by capacity, best policy per capacity in bold, bounds rows under each group."""
    by_capacity: dict[int, list[ReplayResult]] = {}
    for result in results:
        by_capacity.setdefault(result.capacity_blocks, []).append(result)
    bounds_at = {b.capacity_blocks: b for b in bounds}
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("capacity", justify="right")
    table.add_column("policy")
    for name in (
        "block hit",
        "prefix hit",
        "token hit",
        "of OPT",
        "evictions",
        "store fails",
        "blocks/s",
    ):
        table.add_column(name, justify="right")
    for capacity, group in by_capacity.items():
        best = max(r.prefix_hit_ratio if r.mode == "prefix" else r.block_hit_ratio for r in group)
        cap = f"{group[0].capacity_label or capacity} ({capacity:,} blk)"
        for i, r in enumerate(group):
            score = r.prefix_hit_ratio if r.mode == "prefix" else r.block_hit_ratio
            style = "bold" if len(group) > 1 and math.isclose(score, best) else None
            table.add_row(
                cap if i == 0 else "",
                r.policy,
                _ratio(r.block_hit_ratio),
                _ratio(r.prefix_hit_ratio),
                _ratio(r.token_hit_ratio),
                _share_of_opt(r, bounds_at.get(capacity)),
                _count(r.evictions),
                _count(r.store_failures),
                _count(r.blocks_per_s),
                style=style,
            )
        b = bounds_at.get(capacity)
        if b is not None:
            infinite_tokens = _ratio(b.infinite_token_hit_ratio)
            for label, block, prefix, tokens in (
                ("Belady MIN", b.belady_hit_ratio, b.belady_prefix_hit_ratio, ""),
                ("OPT (bypass)", b.opt_bypass_hit_ratio, b.opt_bypass_prefix_hit_ratio, ""),
                (
                    "infinite cache",
                    b.infinite_hit_ratio,
                    b.infinite_prefix_hit_ratio,
                    infinite_tokens,
                ),
            ):
                row = ("", label, _ratio(block), _ratio(prefix), tokens, "", "", "", "")
                table.add_row(*row, style="italic dim")
        table.add_section()
    return table


def bounds_table(
    bounds: Sequence[Bounds], labels: Sequence[str] = (), title: str | None = None
) -> Table:
    """One row per capacity: infinite cache, Belady MIN and OPT with bypass."""
    table = Table(title=title, title_justify="left", header_style="bold")
    for name, justify in (
        ("capacity", "right"),
        ("blocks", "right"),
        ("infinite", "right"),
        ("infinite (tokens)", "right"),
        ("Belady MIN", "right"),
        ("OPT (bypass)", "right"),
        ("max live", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
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


def key_value_table(rows: Iterable[tuple[str, object]], title: str | None = None) -> Table:
    """A two-column table (for trace and workload summaries)."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    return table


def stdout_console() -> Console:
    """Console for tables on stdout; wide when piped, so columns never wrap."""
    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console = Console(soft_wrap=False, width=200)
    return console


def dump_json(obj: Any, out: IO[str]) -> None:
    """One JSON object, indented, NaN-free."""
    json.dump(obj, out, indent=2, allow_nan=False)
    out.write("\n")


_CSV_SKIP = {"manager", "hit_length"}


def result_row(result: ReplayResult) -> dict[str, Any]:
    """A flat row of a result for CSV (hit-length summary flattened, manager stats left out)."""
    record = result.to_dict()
    row = {k: v for k, v in record.items() if k not in _CSV_SKIP}
    for key, value in record["hit_length"].items():
        if key != "histogram":
            row[f"hit_length_{key}"] = value
    return row


def write_results_csv(
    results: Sequence[ReplayResult], bounds: Sequence[Bounds], out: IO[str]
) -> None:
    """One CSV row per replay, with the bounds at its capacity in extra columns."""
    bounds_at = {b.capacity_blocks: b.to_dict() for b in bounds}
    rows = []
    for result in results:
        row = result_row(result)
        for key, value in bounds_at.get(result.capacity_blocks, {}).items():
            if key not in row:
                row[key] = value
        rows.append(row)
    if not rows:
        return
    fieldnames: list[str] = []
    for row in rows:
        fieldnames.extend(k for k in row if k not in fieldnames)
    writer = csv.DictWriter(out, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)


__all__ = [
    "bounds_table",
    "dump_json",
    "key_value_table",
    "result_row",
    "results_table",
    "stdout_console",
    "write_results_csv",
]
