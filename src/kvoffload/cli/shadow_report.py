"""``simulate --shadow``: each candidate's shadow estimate next to its full replay."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvoffload.sim.replay import ReplayResult


def shadow_rows(results: Sequence[ReplayResult], candidates: Sequence[str]) -> list[dict[str, Any]]:
    """One row per capacity and candidate.

    The estimate is read from the shadows of the first replay at that capacity (every replay
    feeds its shadows the same key stream); the actual figures are the candidate's own full
    replay at that capacity, when it was replayed (``None`` otherwise).
    """
    by_capacity: dict[str, list[ReplayResult]] = {}
    for result in results:
        label = result.capacity_label or str(result.capacity_blocks)
        by_capacity.setdefault(label, []).append(result)
    rows: list[dict[str, Any]] = []
    for label, group in by_capacity.items():
        stats = group[0].manager_stats
        own = {result.policy: result for result in group}
        for name in candidates:
            estimate = stats.get(f"policy_shadow_{name}_hit_ratio")
            actual = own.get(name)
            block = actual.block_hit_ratio if actual is not None else None
            rows.append(
                {
                    "capacity": label,
                    "capacity_blocks": group[0].capacity_blocks,
                    "candidate": name,
                    "estimated_hit_ratio": estimate,
                    "actual_block_hit_ratio": block,
                    "actual_prefix_hit_ratio": (
                        actual.prefix_hit_ratio if actual is not None else None
                    ),
                    "error": (
                        estimate - block if estimate is not None and block is not None else None
                    ),
                    "shadow_rate": stats.get("policy_shadow_rate"),
                    "shadow_capacity": stats.get("policy_shadow_capacity"),
                    "shadow_accesses": stats.get("policy_shadow_accesses"),
                    "estimated_from": group[0].policy,
                }
            )
    return rows


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def shadow_table(rows: Sequence[dict[str, Any]]) -> Any:
    """The rows as a rich table (needs the ``[cli]`` extra, like every table)."""
    from rich.table import Table

    table = Table(title="shadow estimates (sampled miniatures) vs full replays")
    for column in (
        "capacity",
        "candidate",
        "estimated",
        "actual block",
        "actual prefix",
        "error",
        "rate",
        "sampled",
    ):
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for row in rows:
        error = row["error"]
        table.add_row(
            row["capacity"],
            row["candidate"],
            _fmt(row["estimated_hit_ratio"]),
            _fmt(row["actual_block_hit_ratio"]),
            _fmt(row["actual_prefix_hit_ratio"]),
            "-" if error is None else f"{error:+.4f}",
            "-" if row["shadow_rate"] is None else f"{row['shadow_rate']:.3g}",
            "-" if row["shadow_accesses"] is None else f"{int(row['shadow_accesses']):,}",
        )
    return table


__all__ = ["shadow_rows", "shadow_table"]
