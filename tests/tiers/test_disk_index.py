"""The disk index's batched reservation: the same records, slots and policy state as one
reservation per key, for every built-in policy."""

from __future__ import annotations

import random

import pytest

from kvoffload.policies import available_cache_policies, create_cache_policy
from kvoffload.tiers.disk.index import DiskIndex

RECORD = 4096 + 512


def _key(i: int) -> bytes:
    return i.to_bytes(8, "little")


def _evict_all(index: DiskIndex) -> list[tuple[bytes, int]]:
    """Every record, in the order the policy evicts them one at a time (key, arena slot)."""
    order = []
    while len(index):
        # room for one more record under a limit of what is held now: exactly one victim
        victims = index.make_room(RECORD, index.used_bytes + index.reserved_bytes, ())
        assert victims, "a ready, unpinned record could not be evicted"
        order += [(key, entry.slot) for key, entry in victims]
    return order


def _drive(index: DiskIndex, batched: bool, seed: int) -> list[tuple[bytes, int]]:
    """Random jobs of new records (written, some failing, published tail first), reads of
    old ones and evictions; the eviction order the policy ends with."""
    rng = random.Random(seed)
    next_key = 0
    limit = RECORD * index.max_slots
    for _ in range(40):
        n = rng.randint(1, 6)
        keys = [_key(next_key + j) for j in range(n)]
        next_key += n
        index.make_room(RECORD * n, limit, keys)
        if batched:
            entries = index.begin_writes(keys, RECORD)
        else:
            entries = [e for e in (index.begin_write(k, RECORD) for k in keys) if e is not None]
        written = []
        for key, _entry in zip(keys, entries, strict=False):
            ok = rng.random() > 0.15
            index.end_write(key, ok, 1)
            if ok:
                written.append(key)
        index.publish(written[::-1])
        ready = [k for k, e in index.items() if e.status.ref_cnt == 0]
        reads = rng.sample(ready, min(len(ready), rng.randint(0, 3)))
        for key in reads:
            index.begin_read(key)
        if reads:
            index.access(reads[::-1])
        for key in reads:
            index.end_read(key, corrupt=False)
    return _evict_all(index)


@pytest.mark.parametrize("policy", sorted(available_cache_policies()))
def test_one_reservation_for_a_batch_equals_one_per_key(policy: str) -> None:
    for seed in range(3):
        orders = [
            _drive(DiskIndex(create_cache_policy(policy, 12), 12), batched, seed)
            for batched in (True, False)
        ]
        assert orders[0] == orders[1]
        assert len(orders[0]) > 0


def test_a_batch_past_the_free_slots_reserves_its_first_keys_only() -> None:
    index = DiskIndex(create_cache_policy("lru", 4), 4)
    entries = index.begin_writes([_key(i) for i in range(6)], RECORD)
    assert [e.slot for e in entries] == [0, 1, 2, 3]
    assert [_key(i) in index for i in range(6)] == [True] * 4 + [False] * 2
    assert index.reserved_bytes == 4 * RECORD
    assert index.policy.block_table is not None
    assert set(index.policy.block_table) == {_key(i) for i in range(4)}
    assert index.begin_write(_key(9), RECORD) is None
