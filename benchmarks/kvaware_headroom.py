"""How far online prediction can go: kvaware next to oracle-assisted LRU and Belady.

Prefix-mode replay (``kvoffload.sim.replay``, with every request hint a policy may use) of a
Mooncake-format trace at a few capacities. Besides LRU, kvaware and Belady, it runs *offline*
variants of LRU that are told the future, to bound what any "which blocks will be reused"
predictor can buy on top of LRU:

* ``lru+oracle-ever``: evicts first the blocks that will never be used again (perfect
  admission), LRU otherwise;
* ``lru+oracle-<N>``: evicts first the blocks not used again within the next N requests.

The oracle rows use future knowledge; no deployable policy can do that.

    python benchmarks/kvaware_headroom.py --capacity 1%,5%,10%
"""

from __future__ import annotations

import argparse
import bisect
import math
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import Victims
from kvoffload.policies.lru import LRUCachePolicy
from kvoffload.sim.bounds import TraceBounds
from kvoffload.sim.capacity import parse_capacities
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import PolicySpec, replay
from kvoffload.sim.traces import load_trace
from kvoffload.testing.traces import shared_trace_path

DEFAULT_TRACE = shared_trace_path(Path(__file__).resolve().parents[1])  # or $KVOFFLOAD_TRACE
NEVER = 1e18  # a horizon beyond any trace: "not used again at all"


class FutureIndex:
    """For each block, the indexes of the requests that use it, and the request running now."""

    def __init__(self, trace: Trace) -> None:
        self.uses: dict[int, list[int]] = {}
        self.index_of = {r.req_id: i for i, r in enumerate(trace.requests)}
        for index, request in enumerate(trace.requests):
            for block_id in request.block_ids:
                self.uses.setdefault(block_id, []).append(index)
        self.now = 0

    def next_use(self, key: OffloadKey) -> float:
        uses = self.uses[int.from_bytes(key[:8], "big", signed=True)]
        i = bisect.bisect_right(uses, self.now)
        return uses[i] if i < len(uses) else math.inf


FUTURE: FutureIndex | None = None  # set by main() before the oracle replays


class OracleLRU(LRUCachePolicy):
    """LRU that evicts blocks not needed within ``horizon`` requests first (offline only).

    It learns which request is running from the manager's ``touch`` calls, which always come
    before a store's eviction.
    """

    def __init__(self, cache_capacity: int, *, horizon: float = NEVER) -> None:
        super().__init__(cache_capacity)
        if FUTURE is None:
            raise RuntimeError("OracleLRU needs FUTURE set to the trace's FutureIndex")
        self.future = FUTURE
        self.horizon = horizon

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        if req_context is not None:
            self.future.now = self.future.index_of[req_context.req_id]
        super().touch(keys, req_context)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        candidates = [k for k in self.eviction_order() if k not in protected]
        if len(candidates) < n:
            return None
        now, horizon = self.future.now, self.horizon
        dead = [k for k in candidates if self.future.next_use(k) - now > horizon]
        dead_set = set(dead)
        chosen = (dead + [k for k in candidates if k not in dead_set])[:n]
        victims: Victims = []
        for key in chosen:
            status = self.get(key)
            if status is None:
                raise RuntimeError(f"evictable key {key!r} is not stored")
            victims.append((key, status))
            self.remove(key)  # LRU keeps no history: removing is evicting
        return victims


def main(argv: Sequence[str] | None = None) -> int:
    global FUTURE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--capacity", default="1%,5%,10%")
    parser.add_argument("--horizons", default="200,800", help="oracle horizons, in requests")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        parser.error(f"trace {args.trace} not found (give --trace)")
    trace = load_trace(args.trace)
    capacities = parse_capacities(args.capacity, trace.num_unique_blocks, trace.block_tokens)
    FUTURE = FutureIndex(trace)
    bounds = TraceBounds(trace)
    oracle = f"{__name__}:OracleLRU"
    rows: list[tuple[str, PolicySpec]] = [
        ("lru", PolicySpec("lru")),
        ("kvaware", PolicySpec("kvaware")),
        ("lru+oracle-ever", PolicySpec.of(oracle, params={"horizon": NEVER})),
    ]
    for h in args.horizons.split(","):
        rows.append(
            (f"lru+oracle-{h.strip()}", PolicySpec.of(oracle, params={"horizon": float(h)}))
        )
    print(f"{args.trace.name}: prefix hit ratio, prefix-mode replay (oracle rows see the future)")
    header = f"{'policy':<18}" + "".join(f"{c.label:>12}" for c in capacities)
    print(header + "\n" + "-" * len(header))
    for name, spec in rows:
        cells = [replay(trace, c.blocks, spec).prefix_hit_ratio for c in capacities]
        print(f"{name:<18}" + "".join(f"{v:>12.4f}" for v in cells))
    belady = [bounds.at(c.blocks).belady_prefix_hit_ratio for c in capacities]
    print(f"{'Belady (MIN)':<18}" + "".join(f"{v:>12.4f}" for v in belady))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
