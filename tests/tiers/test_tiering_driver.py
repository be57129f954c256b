"""A vLLM-style driver runs unchanged on a TieringManager and gets the tiers' extra hits."""

from __future__ import annotations

import random

from tier_helpers import SLOT, key, pattern

from kvoffload.context import ReqContext
from kvoffload.manager import CPUOffloadingManager, LookupResult, OffloadingManager
from kvoffload.tiers import BytearraySlotMemory, MemoryTier
from kvoffload.tiers.manager import SecondaryTier, TieringManager


def requests(seed: int = 7, count: int = 300) -> list[list[bytes]]:
    """Prefix-sharing requests: a few system prompts, each followed by a private suffix."""
    rng = random.Random(seed)
    out = []
    for r in range(count):
        shared = [key(1000 * rng.randrange(6) + i) for i in range(rng.randrange(2, 8))]
        private = [key(10**6 + 10 * r + i) for i in range(rng.randrange(1, 4))]
        out.append(shared + private)
    return out


def drive(manager: OffloadingManager, memory: BytearraySlotMemory, trace: list[list[bytes]]) -> int:
    """Per request: look up the prefix (waiting a step on HIT_PENDING), load it, store the rest."""
    hits = 0
    step = getattr(manager, "step", lambda: 0)
    for r, keys in enumerate(trace):
        ctx = ReqContext(req_id=f"r{r}")
        manager.on_new_request(ctx)
        for _ in range(4):  # an engine reschedules a request whose blocks are in flight
            p = 0
            result = LookupResult.MISS
            while p < len(keys):
                result = manager.lookup(keys[p], ctx)
                if result is not LookupResult.HIT:
                    break
                p += 1
            if result is not LookupResult.HIT_PENDING:
                break
            step()
        hits += p
        if p:
            spec = manager.prepare_load(keys[:p], ctx)
            for k, slot in zip(keys[:p], spec.block_ids, strict=True):
                assert bytes(memory.slot_view(slot)) == pattern(k)
        out = manager.prepare_store(keys[p:], ctx)
        if out is not None:
            for k, slot in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
                memory.slot_view(slot)[:] = pattern(k)
            manager.complete_store(out.keys_to_store, ctx)
        if p:
            manager.complete_load(keys[:p], ctx)
        manager.on_request_finished(ctx)
        step()
    return hits


def test_a_driver_gets_more_hits_with_tiers_and_every_hit_is_the_stored_bytes() -> None:
    trace = requests()
    cpu_blocks = 12
    alone = drive(CPUOffloadingManager(cpu_blocks), BytearraySlotMemory(SLOT, cpu_blocks), trace)

    memory = BytearraySlotMemory(SLOT, cpu_blocks)
    near = MemoryTier(memory, 24 * SLOT, "lru", name="near", latency_polls=1)
    far = MemoryTier(memory, 400 * SLOT, "arc", name="far")
    manager = TieringManager(
        CPUOffloadingManager(cpu_blocks),
        memory,
        [SecondaryTier(near, "write_through", fill=True), SecondaryTier(far, "write_back")],
    )
    tiered = drive(manager, memory, trace)
    stats = manager.get_stats()
    assert tiered > alone
    assert stats.tiers["near"]["promotions"] > 0 and stats.tiers["far"]["promotions"] > 0
    assert (
        stats.tiers["near"]["promotion_failures"] == stats.tiers["far"]["promotion_failures"] == 0
    )
    manager.shutdown()
