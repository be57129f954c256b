"""Shared builders for the tiering tests: a CPU tier over bytearray slots plus memory tiers."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from kvoffload.context import ReqContext
from kvoffload.manager import CPUOffloadingManager
from kvoffload.testing.drive import int_key
from kvoffload.tiers import BytearraySlotMemory, MemoryTier
from kvoffload.tiers.manager import SecondaryTier, TieringManager

SLOT = 32


def key(i: int) -> bytes:
    return int_key(i)


def pattern(k: bytes) -> bytes:
    """The bytes a test writes into a block's slot: derived from its key alone."""
    return hashlib.blake2b(k, digest_size=SLOT).digest()


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def build(
    cpu_blocks: int = 4,
    tier_blocks: Sequence[int] = (16,),
    specs: Sequence[dict[str, Any]] | None = None,
    tier_kwargs: Sequence[dict[str, Any]] | None = None,
    clock: FakeClock | None = None,
    **manager_kwargs: Any,
) -> tuple[TieringManager, BytearraySlotMemory, list[MemoryTier]]:
    clock = clock or FakeClock()
    memory = BytearraySlotMemory(SLOT, cpu_blocks)
    cpu = CPUOffloadingManager(cpu_blocks)
    tiers = []
    secondaries = []
    for i, blocks in enumerate(tier_blocks):
        extra = dict(tier_kwargs[i]) if tier_kwargs else {}
        extra.setdefault("clock", clock)
        tier = MemoryTier(memory, blocks * SLOT, name=f"t{i}", **extra)
        tiers.append(tier)
        secondaries.append(SecondaryTier(tier, **(specs[i] if specs else {})))
    manager = TieringManager(cpu, memory, secondaries, clock=clock, **manager_kwargs)
    return manager, memory, tiers


def store(
    manager: TieringManager, memory: BytearraySlotMemory, keys: Sequence[bytes], ctx: ReqContext
) -> list[bytes] | None:
    """A driver's store: prepare, write each key's pattern into its slot, complete."""
    out = manager.prepare_store(list(keys), ctx)
    if out is None:
        return None
    for k, slot in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
        memory.slot_view(slot)[:] = pattern(k)
    manager.complete_store(out.keys_to_store, ctx)
    return list(out.keys_to_store)


def read(
    manager: TieringManager, memory: BytearraySlotMemory, keys: Sequence[bytes], ctx: ReqContext
) -> list[bytes]:
    """A driver's load of HIT keys: the bytes their slots hold."""
    spec = manager.prepare_load(list(keys), ctx)
    data = [bytes(memory.slot_view(s)) for s in spec.block_ids]
    manager.complete_load(list(keys), ctx)
    return data


def seed(tier: MemoryTier, memory: BytearraySlotMemory, keys: Sequence[bytes], slot: int) -> None:
    """Put records straight into ``tier`` (through host slot ``slot``, one key at a time)."""
    for k in keys:
        memory.slot_view(slot)[:] = pattern(k)
        tier.submit_put([k], [slot])
        tier.drain(1.0)
        results = tier.poll()
        if not (results and results[0].all_ok):
            raise RuntimeError(f"seeding {k.hex()} failed: {results}")
