"""The one-line answers after a grid: which policy to use at each capacity, on this trace.

A table of policies x capacities answers "which policy?" only for a reader who scans it; these
lines say it: per capacity, the best policy, its gain over LRU, and a reminder that the answer
holds for the trace replayed. ``auto`` rows name the candidate it ran (``auto -> mq``), since
its hit ratio is that candidate's, give or take its switches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvoffload.policies import create_cache_policy
from kvoffload.selection.auto import AutoCachePolicy
from kvoffload.sim.replay import PolicySpec, ReplayResult

BASELINE = "lru"


def score(result: ReplayResult) -> float:
    """What a policy is ranked by: usable prefix hits (prefix mode) or block hits."""
    return result.prefix_hit_ratio if result.mode == "prefix" else result.block_hit_ratio


def auto_candidates(specs: Sequence[PolicySpec]) -> dict[str, tuple[str, ...]]:
    """Label -> candidate names, for every spec that builds an ``auto`` policy."""
    out: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        policy = create_cache_policy(spec.name, 1, spec.module_path, dict(spec.params))
        if isinstance(policy, AutoCachePolicy):
            out[spec.label] = policy.candidate_names
    return out


def ran(result: ReplayResult, candidates: Mapping[str, tuple[str, ...]]) -> str | None:
    """``mq`` or ``mq (2 switches)``: the candidate an ``auto`` replay ended on, else None."""
    names = candidates.get(result.policy)
    stats: Mapping[str, Any] = result.manager_stats
    index = stats.get("policy_active_index")
    if names is None or index is None or not 0 <= int(index) < len(names):
        return None
    switches = int(stats.get("policy_auto_switches", 0))
    plural = "" if switches == 1 else "es"
    return names[int(index)] + (f" after {switches} switch{plural}" if switches else "")


def display_name(result: ReplayResult, candidates: Mapping[str, tuple[str, ...]]) -> str:
    """The policy's name in a table: ``auto -> mq`` for an ``auto`` replay."""
    active = ran(result, candidates)
    return result.policy if active is None else f"{result.policy} -> {active}"


def answer_lines(
    results: Sequence[ReplayResult],
    candidates: Mapping[str, tuple[str, ...]],
    source: str,
) -> list[str]:
    """One line per capacity (best policy, its gain over LRU), then the reminder."""
    groups: dict[tuple[int, str], list[ReplayResult]] = {}
    for r in results:
        groups.setdefault((r.capacity_blocks, r.capacity_label), []).append(r)
    if not groups or all(len(g) < 2 for g in groups.values()):
        return []  # one policy per capacity: nothing to choose between
    ranked = "prefix hit" if results[0].mode == "prefix" else "block hit"
    lines = []
    for (capacity, label), group in groups.items():
        best = max(group, key=score)
        ties = [
            display_name(r, candidates)
            for r in group
            if r is not best and math.isclose(score(r), score(best))
        ]
        heading = (
            f"{label} ({capacity:,} blocks)"
            if label and label != str(capacity)
            else (f"{capacity:,} blocks")
        )
        name = display_name(best, candidates)
        text = f"At {heading}: use {name}, {ranked} {score(best):.4f}"
        if ties:
            text += f" (tied with {', '.join(ties)})"
        base = next((r for r in group if r.policy == BASELINE), None)
        if base is None:
            text += f"; {BASELINE} was not in this run."
        elif base is best or math.isclose(score(base), score(best)):
            text += f"; no policy beats {BASELINE} here."
        else:
            gain = score(best) - score(base)
            relative = f", {100 * gain / score(base):+.1f}%" if score(base) > 0 else ""
            text += f", {gain:+.4f} over {BASELINE} ({score(base):.4f}{relative})."
        lines.append(text)
    lines.append(
        f"These answers hold for {source}; another workload can rank the policies "
        "differently: replay your own trace (kvoffload simulate TRACE) before choosing, or "
        "run auto, which picks among its candidates online."
    )
    return lines


__all__ = ["BASELINE", "answer_lines", "auto_candidates", "display_name", "ran", "score"]
