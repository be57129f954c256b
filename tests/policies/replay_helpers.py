"""Helpers for the policy tests: libCacheSim replay, random block sequences, protocol steps."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import CPUOffloadingManager, LookupResult
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.testing import drive_single_blocks, int_key
from kvoffload.testing import libcachesim as testing_libcachesim

TRACE_FRACTIONS = (0.01, 0.05, 0.10, 0.25)


def import_libcachesim() -> ModuleType:
    """libCacheSim 0.3.5, or skip the calling test when it is not installed."""
    module: ModuleType = pytest.importorskip("libcachesim")
    return module


def libcachesim_hits(cache: Any, block_ids: list[int]) -> int:
    """Replay ``block_ids`` through a libCacheSim cache of unit-size objects; count hits."""
    import_libcachesim()
    return testing_libcachesim.libcachesim_hits(cache, block_ids)


def libcachesim_hits_in_fresh_thread(make_cache: Callable[[], Any], block_ids: list[int]) -> int:
    """Same, in a new thread: libCacheSim's RNG is thread-local and seeded at thread start."""
    import_libcachesim()
    return testing_libcachesim.libcachesim_hits_in_fresh_thread(make_cache, block_ids)


def assert_same_hits_on_random_sequences(
    make_ours: Callable[[int], CachePolicy],
    theirs: Callable[[int, list[int]], int],
    seed: int,
    count: int = 150,
    capacity_range: tuple[int, int] = (1, 24),
) -> None:
    """Our policy, driven one block at a time, hits exactly as often as ``theirs`` on each
    of ``random_sequences(seed, count, capacity_range)``."""
    for capacity, ids in random_sequences(seed, count, capacity_range):
        ours = drive_single_blocks(make_ours(capacity), ids)
        assert ours == theirs(capacity, ids), (capacity, ids)


def assert_same_hits_on_trace(
    make_ours: Callable[[int], CachePolicy],
    theirs: Callable[[int, list[int]], int],
    flat_trace: list[int],
    fraction: float,
) -> None:
    """The same on the shared trace at ``fraction`` of its unique blocks."""
    capacity = int(len(set(flat_trace)) * fraction)
    assert drive_single_blocks(make_ours(capacity), flat_trace) == theirs(capacity, flat_trace)


def random_sequences(
    seed: int, count: int, capacity_range: tuple[int, int]
) -> Iterator[tuple[int, list[int]]]:
    """``(capacity, block ids)`` pairs: uniform, skewed (Pareto) and looping-with-noise patterns.

    Key ranges vary from smaller than the capacity to several times it, so runs cover
    warm-up, steady state, scans larger than the cache and ghost hits.
    """
    rng = random.Random(seed)
    for _ in range(count):
        capacity = rng.randint(*capacity_range)
        universe = rng.randint(1, 5 * capacity + 10)
        length = rng.randint(1, 600)
        pattern = rng.randrange(3)
        if pattern == 0:
            ids = [rng.randrange(universe) for _ in range(length)]
        elif pattern == 1:
            ids = [int(rng.paretovariate(1.1)) % universe for _ in range(length)]
        else:
            ids = [
                i % universe if rng.random() < 0.8 else rng.randrange(universe)
                for i in range(length)
            ]
        yield capacity, ids


def store_ready(policy: CachePolicy, block_id: int, slot: int | None = None) -> BlockStatus:
    """Insert block ``block_id`` as the manager does (pending) and complete its write."""
    key = int_key(block_id)
    status = BlockStatus(block_id if slot is None else slot, -1)
    policy.insert(key, status)
    status.ref_cnt = 0
    policy.mark_evictable(key)
    return status


def pin(policy: CachePolicy, block_id: int) -> None:
    """Start a load of a ready block: ref_cnt 0 -> 1."""
    status = policy.get(int_key(block_id))
    if status is None or status.ref_cnt != 0:
        raise ValueError(f"block {block_id} is not stored and unpinned")
    status.ref_cnt = 1
    policy.mark_non_evictable(int_key(block_id))


def unpin(policy: CachePolicy, block_id: int) -> None:
    """Finish the load started by :func:`pin`: ref_cnt 1 -> 0."""
    status = policy.get(int_key(block_id))
    if status is None or status.ref_cnt != 1:
        raise ValueError(f"block {block_id} is not pinned once")
    status.ref_cnt = 0
    policy.mark_evictable(int_key(block_id))


def victim_ids(victims: list[tuple[OffloadKey, BlockStatus]] | None) -> list[int] | None:
    """Victim keys back to block ids (``None`` stays ``None``)."""
    if victims is None:
        return None
    return [int.from_bytes(key[:8], "big", signed=True) for key, _ in victims]


# --------------------------------------------------- batched calls vs single calls
def manager_decisions(policy: CachePolicy, capacity: int, seed: int = 5) -> list[object]:
    """Every decision of a manager over overlapping requests (loads pinned across other
    stores, some failed writes): it hands the policy batched inserts and completions."""
    rng = random.Random(seed)
    manager = CPUOffloadingManager(capacity, cache_policy=policy)
    log: list[object] = []
    inflight: list[tuple[ReqContext, list[OffloadKey], list[OffloadKey]]] = []
    for index in range(300):
        head = rng.randrange(30)
        keys = [int_key(head * 1000 + i) for i in range(rng.randint(1, 24))]
        ctx = ReqContext(req_id=str(index))
        ctx.set_key_positions(keys, 16)
        manager.on_new_request(ctx)
        hits = 0
        while hits < len(keys) and manager.lookup(keys[hits], ctx) is LookupResult.HIT:
            hits += 1
        if hits:
            manager.prepare_load(keys[:hits], ctx)
        out = manager.prepare_store(keys[hits:], ctx) if hits < len(keys) else None
        stored = out.keys_to_store if out is not None else []
        log.append((hits, stored, out.evicted_keys if out is not None else None))
        inflight.append((ctx, keys[:hits], stored))
        while len(inflight) > 3 or (inflight and rng.random() < 0.4):
            done, loads, stores = inflight.pop(rng.randrange(len(inflight)))
            if loads:
                manager.complete_load(loads, done)
            if stores:
                manager.complete_store(stores, done, success=rng.random() > 0.1)
            manager.on_request_finished(done)
    log.append(sorted(manager.get_stats().as_dict().items()))
    return log


def one_at_a_time(policy_cls: type[CachePolicy]) -> type[CachePolicy]:
    """A subclass overriding insert and mark_evictable, so batched calls fall back to singles."""

    class OneAtATime(policy_cls):  # type: ignore[valid-type, misc]
        def insert(
            self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
        ) -> None:
            super().insert(key, block, req_context)

        def mark_evictable(self, key: OffloadKey) -> None:
            super().mark_evictable(key)

    return OneAtATime
