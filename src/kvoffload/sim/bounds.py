"""Offline limits of any policy on a trace: infinite cache, Belady MIN, OPT with bypass.

All three see the flattened block sequence (every request's blocks, head first) with one
access per block, the model libCacheSim uses:

* **infinite cache**: only compulsory misses (first accesses) miss.
* **Belady MIN (demand)**: a missed block is always admitted; when full, the resident block
  whose next use is furthest away (or never) is evicted. Equals libCacheSim's ``Belady``.
* **OPT with bypass**: as MIN, but a missed block whose next use is further away than every
  resident block's is not admitted at all: the true optimum for unit-size blocks, and so an
  upper bound for every online policy *including* admission filters.

Each is O(n log n): one backward pass for next-use positions, then a max-heap keyed by next
use with lazy deletion (stale heap entries are skipped when they surface).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.sim.records import Trace


def next_use_positions(seq: Sequence[int]) -> list[int]:
    """For each position, where the same id is accessed next; ``len(seq)`` means never."""
    n = len(seq)
    nxt = [n] * n
    last_seen: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        block = seq[i]
        nxt[i] = last_seen.get(block, n)
        last_seen[block] = i
    return nxt


def infinite_cache_hits(seq: Sequence[int]) -> int:
    """Hits of a cache that never evicts: every access but the first of each id."""
    return len(seq) - len(set(seq))


def belady_hit_flags(
    seq: Sequence[int],
    capacity: int,
    bypass: bool = False,
    next_use: Sequence[int] | None = None,
) -> bytearray:
    """Per-access hit flags (1 = hit) of Belady MIN, or of OPT when ``bypass`` is true.

    ``next_use`` may pass precomputed :func:`next_use_positions` to share them between runs.
    """
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0 blocks, got {capacity}")
    n = len(seq)
    flags = bytearray(n)
    if capacity == 0 or n == 0:
        return flags
    nxt = next_use_positions(seq) if next_use is None else next_use
    # resident id -> its current next use; heap of (-next_use, id), possibly stale.
    resident: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    for i in range(n):
        block = seq[i]
        upcoming = nxt[i]
        if block in resident:
            flags[i] = 1
            resident[block] = upcoming
            push(heap, (-upcoming, block))
            continue
        if len(resident) >= capacity:
            while True:  # surface the live entry with the furthest next use
                neg_use, victim = heap[0]
                if resident.get(victim) == -neg_use:
                    break
                pop(heap)
            if bypass and upcoming >= -neg_use:
                continue  # the missed block is needed last: do not admit it
            pop(heap)
            del resident[victim]
        resident[block] = upcoming
        push(heap, (-upcoming, block))
        if len(heap) > 4 * capacity + 64:  # keep the heap bounded: drop stale entries
            heap = [(neg, b) for neg, b in heap if resident.get(b) == -neg]
            heapq.heapify(heap)
    return flags


def belady_hits(
    seq: Sequence[int], capacity: int, bypass: bool = False, next_use: Sequence[int] | None = None
) -> int:
    """Hit count of Belady MIN (``bypass=False``) or OPT with bypass."""
    return sum(belady_hit_flags(seq, capacity, bypass, next_use))


def max_live_blocks(seq: Sequence[int]) -> int:
    """Most blocks that are at once "seen before and used again": the smallest capacity at
    which OPT with bypass has no capacity misses."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, block in enumerate(seq):
        first.setdefault(block, i)
        last[block] = i
    delta = [0] * (len(seq) + 1)
    for block, start in first.items():
        end = last[block]
        if end > start:
            delta[start] += 1
            delta[end] -= 1
    live = best = 0
    for d in delta:
        live += d
        best = max(best, live)
    return best


@dataclass(frozen=True)
class Bounds:
    """The limits at one capacity, as ratios of the trace's block accesses.

    ``*_prefix_hit_ratio`` counts only the leading run of hits of each request (what a prefix
    cache can use); ``infinite_token_hit_ratio`` weighs hits by the tokens in each block.
    """

    capacity_blocks: int
    block_accesses: int
    infinite_hit_ratio: float
    infinite_prefix_hit_ratio: float
    infinite_token_hit_ratio: float
    belady_hit_ratio: float
    belady_prefix_hit_ratio: float
    opt_bypass_hit_ratio: float
    opt_bypass_prefix_hit_ratio: float
    max_live_blocks: int

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready fields."""
        return dict(self.__dict__)


def prefix_hits(trace: Trace, flags: Sequence[int]) -> int:
    """Hits in each request's leading run of hits, for per-access ``flags`` in trace order."""
    total = pos = 0
    for request in trace.requests:
        n = len(request.block_ids)
        run = 0
        while run < n and flags[pos + run]:
            run += 1
        total += run
        pos += n
    return total


class TraceBounds:
    """Computes :class:`Bounds` for one trace at many capacities, sharing the passes."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.seq = trace.flat_block_ids()
        self.next_use = next_use_positions(self.seq)
        self._infinite_hits = infinite_cache_hits(self.seq)
        seen: set[int] = set()
        repeats = bytearray(len(self.seq))
        for i, block in enumerate(self.seq):
            if block in seen:
                repeats[i] = 1
            else:
                seen.add(block)
        self._infinite_prefix_hits = prefix_hits(trace, repeats)
        self._max_live = max_live_blocks(self.seq)
        self._infinite_token_ratio = self._token_hit_ratio_of_infinite_cache()

    def _token_hit_ratio_of_infinite_cache(self) -> float:
        seen: set[int] = set()
        hit_tokens = total = 0
        for block, tokens in zip(self.seq, self.trace.iter_block_tokens(), strict=True):
            total += tokens
            if block in seen:
                hit_tokens += tokens
            else:
                seen.add(block)
        return hit_tokens / total if total else 0.0

    def at(self, capacity: int) -> Bounds:
        """The bounds at ``capacity`` blocks."""
        n = len(self.seq)
        ratio = (lambda hits: hits / n) if n else (lambda hits: 0.0)
        belady = belady_hit_flags(self.seq, capacity, False, self.next_use)
        opt = belady_hit_flags(self.seq, capacity, True, self.next_use)
        return Bounds(
            capacity_blocks=capacity,
            block_accesses=n,
            infinite_hit_ratio=ratio(self._infinite_hits),
            infinite_prefix_hit_ratio=ratio(self._infinite_prefix_hits),
            infinite_token_hit_ratio=self._infinite_token_ratio,
            belady_hit_ratio=ratio(sum(belady)),
            belady_prefix_hit_ratio=ratio(prefix_hits(self.trace, belady)),
            opt_bypass_hit_ratio=ratio(sum(opt)),
            opt_bypass_prefix_hit_ratio=ratio(prefix_hits(self.trace, opt)),
            max_live_blocks=self._max_live,
        )


__all__ = [
    "Bounds",
    "TraceBounds",
    "belady_hit_flags",
    "belady_hits",
    "infinite_cache_hits",
    "max_live_blocks",
    "next_use_positions",
    "prefix_hits",
]
