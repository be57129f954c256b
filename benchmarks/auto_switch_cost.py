"""How long an ``auto`` switch holds the calling thread, and what ``max_history`` trades for it.

A switch runs inside the ``touch`` call that closes the deciding window: it replays the
history log into the new candidate (about ``history`` capacities of accesses, at most
``max_history``), then moves every resident block. So its time grows with the capacity and
the history, and an engine's scheduler waits for it. This replays a long generated workload
(large enough that the shadows run at their 1% sample) through ``auto`` with each
``max_history`` and prints every switch (its time, the blocks it moved, the replayed
accesses) and the prefix hit ratio, so the stall and what bounding it costs are seen side by
side in one run.

    python benchmarks/auto_switch_cost.py [--requests 60000] [--capacities 5,25]
        [--max-history none,262144,131072] [--move-blocks 200000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from kvoffload.keys import make_offload_key
from kvoffload.policies import CachePolicy, CachePolicyFactory, create_cache_policy
from kvoffload.policies.base import BlockStatus
from kvoffload.selection.auto import AutoCachePolicy
from kvoffload.selection.switching import switch_resident_set, warm_switch
from kvoffload.sim.replay import PolicySpec, replay
from kvoffload.sim.workloads import WorkloadConfig, generate_workload

BUILT: list[AutoCachePolicy] = []


class RecordedAuto(AutoCachePolicy):
    """``auto`` as it is, remembered when built, so its switches can be read after a replay."""

    def __init__(self, cache_capacity: int, **params: Any) -> None:
        super().__init__(cache_capacity, **params)
        BUILT.append(self)


def _limits(text: str) -> list[int | None]:
    out: list[int | None] = []
    for item in text.split(","):
        item = item.strip().lower()
        if item:
            out.append(None if item == "none" else int(item))
    return out


def _filled(name: str, blocks: int) -> CachePolicy:
    """Policy ``name`` holding ``blocks`` ready blocks, stored 32 to a request."""
    policy = create_cache_policy(name, blocks, None, {})
    keys = [make_offload_key(i.to_bytes(8, "big"), 0) for i in range(blocks)]
    for start in range(0, blocks, 32):
        batch = keys[start : start + 32]
        statuses = [BlockStatus(slot, -1) for slot in range(start, start + len(batch))]
        policy.insert_many(batch, statuses)
        for status in statuses:
            status.ref_cnt = 0
        policy.mark_evictable_many(batch)
    return policy


def _move_cost(blocks: int) -> None:
    for old, new in (("mq", "arc"), ("mq", "kvaware"), ("kvaware", "mq"), ("arc", "mq")):
        times = []
        for move in (lambda a, b: warm_switch(a, b, []), switch_resident_set):
            source, target = _filled(old, blocks), create_cache_policy(new, blocks, None, {})
            started = time.perf_counter()
            move(source, target)
            times.append((time.perf_counter() - started) / blocks * 1e6)
        print(
            f"move {blocks} resident blocks {old} -> {new}: warm_switch (empty log) "
            f"{times[0]:.1f} us a block, switch_resident_set {times[1]:.1f} us a block"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--capacities", default="5,25", help="percent of unique blocks")
    parser.add_argument("--max-history", default="none,262144,131072")
    parser.add_argument("--move-blocks", type=int, default=200000)
    args = parser.parse_args(argv)
    CachePolicyFactory.register_cache_policy("auto-recorded", __name__, "RecordedAuto")
    trace = generate_workload(WorkloadConfig(seed=args.seed, requests=args.requests))
    print(
        f"generated seed={args.seed}: {args.requests} requests, "
        f"{trace.block_accesses} block accesses, {trace.num_unique_blocks} unique blocks"
    )
    for percent in (float(p) for p in args.capacities.split(",") if p.strip()):
        capacity = max(1, int(trace.num_unique_blocks * percent / 100))
        for limit in _limits(args.max_history):
            spec = PolicySpec.of("auto-recorded", params={"max_history": limit})
            BUILT.clear()
            result = replay(trace, capacity, spec)
            switches = BUILT[-1].switches
            print(
                f"{percent:g}% ({capacity} blocks) max_history={limit}: "
                f"prefix hit ratio {result.prefix_hit_ratio:.4f}, {len(switches)} switches, "
                f"replay {result.elapsed_s:.1f} s"
            )
            for s in switches:
                per_block = s.seconds / max(s.moved, 1) * 1e6
                print(
                    f"    {s.old} -> {s.new} at {s.accesses} accesses: {s.seconds:.3f} s "
                    f"({s.moved} blocks moved, {s.replayed} entered by the replay; "
                    f"{per_block:.1f} us per moved block)"
                )
    if args.move_blocks > 0:
        _move_cost(args.move_blocks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
