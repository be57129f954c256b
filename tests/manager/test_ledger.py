"""BlockLedger: the status edges, the mark hooks at the 0-edges, slots, make_room, accesses."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from kvoffload import CPUOffloadingManager, ReqContext
from kvoffload.keys import OffloadKey, int_key
from kvoffload.manager import LookupResult
from kvoffload.manager.ledger import BlockLedger
from kvoffload.policies.base import Victims
from kvoffload.policies.lru import LRUCachePolicy
from kvoffload.policies.switching import switch_resident_set


class Journal(LRUCachePolicy):
    """LRU that writes down every hook the ledger calls, in order."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.calls: list[tuple[str, object]] = []

    def insert(self, key, block, req_context=None):  # type: ignore[no-untyped-def]
        self.calls.append(("insert", key))
        super().insert(key, block, req_context)

    def mark_evictable(self, key: OffloadKey) -> None:
        self.calls.append(("evictable", key))
        super().mark_evictable(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self.calls.append(("non_evictable", key))
        super().mark_non_evictable(key)

    def touch(self, keys, req_context=None):  # type: ignore[no-untyped-def]
        keys = list(keys)
        self.calls.append(("touch", tuple(keys)))
        super().touch(keys, req_context)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        victims = super().evict(n, protected)
        self.calls.append(("evict", tuple(k for k, _ in victims or ())))
        return victims

    def remove(self, key: OffloadKey) -> None:
        self.calls.append(("remove", key))
        super().remove(key)


def k(i: int) -> OffloadKey:
    return int_key(i)


def test_slots_are_fresh_first_then_last_freed_first() -> None:
    ledger = BlockLedger(Journal(4), 4)
    statuses = ledger.reserve([k(1), k(2)], None)
    assert [s.block_id for s in statuses] == [0, 1] and ledger.num_free == 2
    ledger.fail([k(2), k(1)])  # slot 1 freed, then slot 0
    assert ledger.num_free == 4 and ledger.get(k(1)) is None
    assert [s.block_id for s in ledger.reserve([k(3), k(4), k(5)], None)] == [2, 3, 0]
    assert ledger.reserve([k(6)], None)[0].block_id == 1


def test_status_edges_call_the_mark_hooks_exactly_at_zero() -> None:
    policy = Journal(4)
    ledger = BlockLedger(policy, 4)
    (status,) = ledger.reserve([k(1)], None)
    assert status.ref_cnt == -1 and ledger.pool.num_pending == 1
    ledger.complete([k(1)])
    assert status.ref_cnt == 0 and ledger.num_evictable == 1
    ledger.pin([k(1)], [status])
    ledger.pin([k(1)], [status])  # a second pin: no hook
    assert status.ref_cnt == 2 and ledger.num_evictable == 0
    ledger.unpin([k(1)])  # not the last pin: no hook
    ledger.unpin([k(1)])
    assert status.ref_cnt == 0 and ledger.num_evictable == 1
    assert policy.calls == [
        ("insert", k(1)),
        ("evictable", k(1)),
        ("non_evictable", k(1)),
        ("evictable", k(1)),
    ]
    with pytest.raises(RuntimeError, match="not pinned"):
        ledger.unpin([k(1)])
    assert ledger.remove_ready(k(1)) and ledger.get(k(1)) is None and ledger.num_free == 4


def test_make_room_evicts_only_what_is_needed_and_never_a_protected_key() -> None:
    policy = Journal(3)
    ledger = BlockLedger(policy, 3)
    for i in (1, 2, 3):
        ledger.reserve([k(i)], None)
        ledger.complete([k(i)])
    assert ledger.make_room(0, ()) == []
    assert ledger.make_room(1, {k(1)}) == [k(2)]  # LRU's first victim is protected
    assert ledger.num_free == 1 and ledger.num_evictable == 2
    assert ledger.make_room(1, ()) == []  # room enough already: nothing evicted
    status = ledger.get(k(3))
    assert status is not None
    ledger.pin([k(3)], [status])
    assert ledger.make_room(3, ()) is None  # k(3) is pinned: nothing changes
    assert ledger.get(k(1)) is not None and ledger.num_free == 1


def test_access_touches_each_key_once_per_request() -> None:
    policy = Journal(4)
    ledger = BlockLedger(policy, 4)
    touched: set[OffloadKey] = set()
    assert ledger.access(touched, [k(1), k(2), k(1)], None) == [k(1), k(2)]
    assert ledger.access(touched, [k(2), k(3)], None) == [k(3)]
    assert ledger.access(None, [k(1)], None) == [k(1)]  # no request: every access counts
    assert [c for c in policy.calls if c[0] == "touch"] == [
        ("touch", (k(1), k(2))),
        ("touch", (k(3),)),
        ("touch", (k(1),)),
    ]


def test_access_each_is_one_block_accesses_in_order() -> None:
    policy = Journal(2)
    ledger = BlockLedger(policy, 2)
    touched: set[OffloadKey] = set()
    out = ledger.access_each([k(1), k(2), k(1), k(3)], None, touched)
    hit, miss = LookupResult.HIT, LookupResult.MISS
    assert out.results == [miss, miss, hit, miss]
    assert (out.hits, out.stored, out.evicted, out.failed, out.misses) == (1, 3, 1, 0, 3)
    assert ledger.get(k(2)) is None  # the LRU victim; k(1) was used since
    assert ledger.num_evictable == 2 and ledger.pool.num_pending == 0
    # A pinned block's hit is not pinned again, and a full cache of pins fails a miss.
    for key in (k(1), k(3)):
        status = ledger.get(key)
        assert status is not None
        ledger.pin([key], [status])
    out = ledger.access_each([k(4)], None, touched)
    assert out.failed == 1 and ledger.get(k(4)) is None


def test_the_cpu_managers_face_for_tiers_pins_without_loads_and_promotes_without_stores() -> None:
    m = CPUOffloadingManager(2, store_threshold=2)
    ctx = ReqContext(req_id="a")
    out = m.reserve_promotion([k(1)], ctx)  # no admission veto on a first sight
    assert out is not None and out.keys_to_store == [k(1)] and m.slot_of(k(1)) == 0
    with pytest.raises(ValueError, match="not stored and ready"):
        m.pin_copy([k(1)])  # still being copied in
    m.complete_promotion([k(1)])
    with pytest.raises(ValueError, match="no promotion in flight"):
        m.complete_promotion([k(1)])
    assert m.pin_copy([k(1)]) == [0]
    stats = m.get_stats()
    assert stats.pinned_blocks == 1 and stats.loads == 0 and stats.stores_prepared == 0
    m.unpin_copy([k(1)])
    assert m.get_stats().evictable_blocks == 1 and m.slot_of(k(2)) is None
    assert m.prepare_store([k(2)], ctx) is not None  # a store: admission rejects it
    assert m.get_stats().admission_rejects == 1 and m.stores_in_flight([k(2)], ctx) == []


def _busy_ledger() -> BlockLedger:
    """Ready blocks touched out of order, one pinned twice, one being written."""
    ledger = BlockLedger(Journal(6), 6)
    ledger.reserve([k(1), k(2), k(3), k(4), k(5)], None)
    ledger.complete([k(1), k(2), k(3), k(4)])
    ledger.access(None, [k(2), k(1)], None)
    status = ledger.get(k(3))
    assert status is not None
    ledger.pin([k(3), k(3)], [status, status])
    return ledger


def test_replace_policy_moves_the_blocks_as_switch_resident_set_does() -> None:
    ledger, bare = _busy_ledger(), _busy_ledger()
    counts = (ledger.pool.num_evictable, ledger.pool.num_pending, ledger.num_free)
    new, bare_new = Journal(6), Journal(6)
    ctx = ReqContext(req_id="switch", timestamp=5.0)
    report = ledger.replace_policy(new, ctx)
    assert report == switch_resident_set(bare.policy, bare_new, req_context=ctx)
    assert (report.evictable, report.pinned, report.pending) == (3, 1, 1)
    assert new.calls == bare_new.calls  # call for call, in the same order
    assert ledger.policy is new and ledger.get == new.block_table.get  # type: ignore[union-attr]
    assert (ledger.pool.num_evictable, ledger.pool.num_pending, ledger.num_free) == counts
    assert ledger.get(k(3)).ref_cnt == 2 and ledger.get(k(5)).ref_cnt == -1  # type: ignore[union-attr]
    ledger.complete([k(5)])
    ledger.unpin([k(3), k(3)])
    old_order = [key for key, _ in _busy_ledger().policy.evict(3, ()) or ()]
    assert len(old_order) == 3  # the ready blocks, in the old policy's eviction order:
    assert ledger.make_room(6, ()) == [*old_order, k(5), k(3)]  # then as released
    failing, full = _busy_ledger(), _busy_ledger().policy
    with pytest.raises(ValueError, match="empty policy"):
        failing.replace_policy(full, None)
    assert failing.policy is not full and len(failing.policy.block_table or ()) == 5
