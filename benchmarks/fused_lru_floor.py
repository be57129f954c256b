"""How fast can a pure-Python LRU offloading manager be? Our manager vs a fused lower bound.

The fused loop below does, inline in one function, what ``compare_vllm.py``'s replay asks of a
manager with LRU: lookups until the first miss, pin and unpin the hit prefix, filter stored
keys, evict the least recent unprotected blocks, hand out slots (fresh first, then freed),
mark new blocks pending, track the request's stores, build the store output, then complete
the stores (pending -> ready, tail first into the recency order). It has no method calls, no
policy boundary, no validation and no statistics, so no manager with this API written in
Python can be much faster. Both replays run interleaved in this process and give the same
hit count; the ratio says how much of our per-block cost is the manager/policy layering.

    python benchmarks/fused_lru_floor.py [--trace PATH] [--capacity 5%] [--runs 5]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice
from operator import attrgetter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_vllm import build_keys, load_ours, load_replay_trace, make_contexts, replay_parser
from compare_vllm import replay as replay_manager
from kvoffload.manager import CPULoadStoreSpec, PrepareStoreOutput
from kvoffload.policies.base import BlockStatus

_block_id = attrgetter("block_id")


def fused_replay(capacity: int, requests: list[list[bytes]]) -> tuple[int, int]:
    """The whole LRU manager protocol inlined; returns (prefix hits, elapsed ns)."""
    blocks: dict[bytes, BlockStatus] = {}
    order: OrderedDict[bytes, None] = OrderedDict()  # evictable keys, least recent first
    free: list[BlockStatus] = []
    allocated = hits = 0
    start = time.perf_counter_ns()
    for keys in requests:
        stores: set[bytes] = set()
        n = 0
        for key in keys:
            status = blocks.get(key)
            if status is None or status.ref_cnt < 0:
                break
            n += 1
        if n:
            hits += n
            loaded = keys[:n]
            for key in loaded:  # prepare_load: pin
                status = blocks[key]
                if status.ref_cnt == 0:
                    del order[key]
                status.ref_cnt += 1
            for key in reversed(loaded):  # complete_load: unpin, tail first
                status = blocks[key]
                status.ref_cnt -= 1
                if status.ref_cnt == 0:
                    order[key] = None
        rest = keys[n:]
        if not rest:
            continue
        if not blocks.keys().isdisjoint(rest):
            rest = [key for key in rest if key not in blocks]
        need = len(rest) - (capacity - allocated + len(free))
        evicted: list[bytes] = []
        if need > 0:
            if need > len(order):
                continue
            protected = set(keys)
            chosen = list(islice(order, need))
            if not protected.isdisjoint(chosen):
                chosen = [key for key in order if key not in protected][:need]
                if len(chosen) < need:
                    continue
            for key in chosen:
                del order[key]
            evicted = chosen
            free.extend(map(blocks.pop, chosen))
        fresh = min(capacity - allocated, len(rest))
        statuses = [BlockStatus(slot, -1) for slot in range(allocated, allocated + fresh)]
        allocated += fresh
        if len(rest) > fresh:
            reused = free[fresh - len(rest) :]
            del free[fresh - len(rest) :]
            reused.reverse()
            for status in reused:
                status.ref_cnt = -1
            statuses += reused
        blocks.update(zip(rest, statuses, strict=True))
        stores.update(rest)
        out = PrepareStoreOutput(rest, CPULoadStoreSpec(list(map(_block_id, statuses))), evicted)
        done = out.keys_to_store  # complete_store: ready, tail first
        stores.difference_update(done)
        completed = list(reversed(done))
        for status in map(blocks.__getitem__, completed):
            status.ref_cnt = 0
        for key in completed:
            order[key] = None
    return hits, time.perf_counter_ns() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = replay_parser(__doc__.split("\n\n")[0], runs=5)
    args = parser.parse_args(argv)
    trace, capacity = load_replay_trace(parser, args)
    lib = load_ours()
    requests = build_keys(lib, [r.block_ids for r in trace.requests])
    ours_ns: list[float] = []
    fused_ns: list[float] = []
    for _ in range(args.runs):
        contexts = make_contexts(lib, requests, trace.block_tokens, positions=False)
        ours_hits, ns = replay_manager(lib, "lru", capacity, requests, contexts)
        ours_ns.append(ns / trace.block_accesses)
        fused_hits, ns = fused_replay(capacity, requests)
        fused_ns.append(ns / trace.block_accesses)
        if fused_hits != ours_hits:
            raise SystemExit(f"hit counts differ: manager {ours_hits}, fused {fused_hits}")
    ours, fused = statistics.median(ours_ns), statistics.median(fused_ns)
    ratios = [o / f for o, f in zip(ours_ns, fused_ns, strict=True)]
    print(f"{trace.block_accesses} block accesses, capacity {capacity} blocks, {args.runs} runs")
    print(f"our manager + lru: {ours:8.0f} ns/block")
    print(f"fused lru floor:   {fused:8.0f} ns/block")
    print(f"manager / floor:   {statistics.median(ratios):8.2f}x (median of per-run ratios)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
