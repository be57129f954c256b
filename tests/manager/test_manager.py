"""CPUOffloadingManager: vLLM's behaviour checklist (our own tests) and our stricter semantics."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.admission import StoreAfterNOffers
from kvoffload.events import BlockRemoved, BlockStored, OffloadingEvent, to_kv_cache_events
from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies import CachePolicyFactory
from kvoffload.policies.base import Victims
from kvoffload.policies.lru import LRUCachePolicy


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def keys(*ids: int) -> list[OffloadKey]:
    return [k(i) for i in ids]


def ctx(name: str = "r") -> ReqContext:
    c = ReqContext(req_id=name)
    return c


def store(m: CPUOffloadingManager, ids: list[int], name: str = "r") -> list[int]:
    c = ctx(name)
    out = m.prepare_store(keys(*ids), c)
    assert out is not None
    m.complete_store(out.keys_to_store, c)
    return out.store_spec.block_ids


def lookup_all(m: CPUOffloadingManager, ids: list[int]) -> list[LookupResult]:
    return [m.lookup(k(i), ctx()) for i in ids]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_store_then_lookup_then_events(policy: str) -> None:
    m = CPUOffloadingManager(4, cache_policy=policy, enable_events=True)
    c = ctx()
    out = m.prepare_store(keys(1, 2), c)
    assert out is not None
    assert out.keys_to_store == keys(1, 2)
    assert out.store_spec.block_ids == [0, 1]
    assert out.evicted_keys == []
    assert lookup_all(m, [1, 2]) == [LookupResult.HIT_PENDING] * 2
    assert m.take_events() == []
    m.complete_store(keys(1, 2), c)
    assert m.take_events() == [OffloadingEvent(tuple(keys(1, 2)))]
    assert lookup_all(m, [1, 2, 3]) == [LookupResult.HIT, LookupResult.HIT, LookupResult.MISS]


def test_filters_stored_keys_and_evicts_lru_with_fresh_slots_first() -> None:
    m = CPUOffloadingManager(4, enable_events=True)
    store(m, [1, 2])
    c = ctx()
    out = m.prepare_store(keys(2, 3, 4, 5), c)
    assert out is not None
    assert out.keys_to_store == keys(3, 4, 5)
    assert out.store_spec.block_ids == [2, 3, 0]  # fresh slots 2, 3, then 1's freed slot 0
    assert out.evicted_keys == keys(1)
    events = m.take_events()
    assert events[-1] == OffloadingEvent(tuple(keys(1)), removed=True)


def test_no_room_while_blocks_are_being_loaded_then_lifo_slot_reuse() -> None:
    m = CPUOffloadingManager(4)
    store(m, [2, 3, 4, 5])
    reader = ctx("reader")
    m.prepare_load(keys(2, 3), reader)
    # 2 and 3 pinned, 4 and 5 evictable: 3 new keys cannot fit.
    assert m.prepare_store(keys(6, 7, 8), ctx()) is None
    m.complete_load(keys(2, 3), reader)
    c = ctx()
    out = m.prepare_store(keys(6, 7, 8), c)
    assert out is not None
    # one batch completes tail first (head 2 most recent), the load of 2, 3 keeps that order
    assert out.evicted_keys == keys(5, 4, 3)
    # slots of 5, 4, 3 were 3, 2, 1 and are reused last-freed-first
    assert out.store_spec.block_ids == [1, 2, 3]


def test_touch_changes_lru_order() -> None:
    m = CPUOffloadingManager(4)
    store(m, [5, 6, 7, 8])
    m.touch(keys(5, 6, 7), ctx())
    out = m.prepare_store(keys(9), ctx())
    assert out is not None and out.evicted_keys == keys(8)


def test_failed_store_removes_only_pending_keys() -> None:
    m = CPUOffloadingManager(4)
    store(m, [7])
    c = ctx()
    out = m.prepare_store(keys(7, 9), c)
    assert out is not None and out.keys_to_store == keys(9)
    m.complete_store(keys(9), c, success=False)
    assert lookup_all(m, [7, 9]) == [LookupResult.HIT, LookupResult.MISS]
    stats = m.get_stats()
    assert stats.stored_blocks == 1 and stats.pending_blocks == 0 and stats.stores_failed == 1
    # fresh slots first, then the freed one
    assert store(m, [10, 11, 12]) == [2, 3, 1]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_an_offered_stored_key_is_never_the_victim(policy: str) -> None:
    m = CPUOffloadingManager(4, cache_policy=policy)
    store(m, [1])
    store(m, [2, 3, 4])
    # 1 is the least recent, but it is offered again in the same call.
    c = ctx()
    out = m.prepare_store(keys(1, 5), c)
    assert out is not None
    assert k(1) not in out.evicted_keys
    m.complete_store(out.keys_to_store, c)
    assert m.lookup(k(1)) == LookupResult.HIT


def test_prepare_load_slots_are_coindexed_with_keys_in_any_order() -> None:
    m = CPUOffloadingManager(8)
    slots = dict(zip([1, 2, 3, 4], store(m, [1, 2, 3, 4]), strict=True))
    for order in ([4, 1, 3, 2], [2, 4, 1, 3]):
        c = ctx()
        spec = m.prepare_load(keys(*order), c)
        assert spec.block_ids == [slots[i] for i in order]
        m.complete_load(keys(*order), c)


def test_evictable_count_through_load_double_load_evict_fail_and_reset() -> None:
    m = CPUOffloadingManager(3)
    store(m, [1, 2, 3])
    assert m.get_stats().evictable_blocks == 3
    a, b = ctx("a"), ctx("b")
    m.prepare_load(keys(1), a)
    m.prepare_load(keys(1), b)  # two concurrent loads pin block 1 once
    s = m.get_stats()
    assert (s.evictable_blocks, s.pinned_blocks) == (2, 1)
    m.complete_load(keys(1), a)
    assert m.get_stats().evictable_blocks == 2  # still pinned by b
    m.complete_load(keys(1), b)
    assert m.get_stats().evictable_blocks == 3
    c = ctx()
    out = m.prepare_store(keys(4), c)
    assert out is not None and m.get_stats().evictable_blocks == 2
    m.complete_store(keys(4), c, success=False)
    assert m.get_stats().evictable_blocks == 2
    m.reset_cache()
    s = m.get_stats()
    assert (s.evictable_blocks, s.stored_blocks, s.pending_blocks) == (0, 0, 0)


class CountingLRU(LRUCachePolicy):
    evict_calls = 0

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        type(self).evict_calls += 1
        return super().evict(n, protected)


def test_fast_fail_does_not_call_the_policy_or_change_state() -> None:
    CountingLRU.evict_calls = 0
    m = CPUOffloadingManager(2, cache_policy=CountingLRU(2))
    store(m, [1, 2])
    reader = ctx()
    m.prepare_load(keys(1, 2), reader)
    before = m.get_stats()
    assert m.prepare_store(keys(3), ctx()) is None
    after = m.get_stats()
    assert CountingLRU.evict_calls == 0
    assert after.failed_allocations == before.failed_allocations + 1
    assert (after.stored_blocks, after.evictable_blocks) == (before.stored_blocks, 0)


def test_pending_blocks_are_hit_pending_and_never_evicted() -> None:
    m = CPUOffloadingManager(2)
    c = ctx()
    assert m.prepare_store(keys(1, 2), c) is not None
    assert m.lookup(k(1)) == LookupResult.HIT_PENDING
    assert m.prepare_store(keys(3), ctx()) is None
    s = m.get_stats()
    assert s.pending_blocks == 2 and s.hits_pending == 1


def test_prepare_load_of_missing_or_pending_key_is_a_clear_error() -> None:
    m = CPUOffloadingManager(2)
    c = ctx()
    m.prepare_store(keys(1), c)
    with pytest.raises(ValueError, match="still being written"):
        m.prepare_load(keys(1), ctx())
    with pytest.raises(ValueError, match="not stored"):
        m.prepare_load(keys(2), ctx())


def test_duplicate_completion_is_ignored_and_counted() -> None:
    m = CPUOffloadingManager(2)
    c = ctx()
    m.prepare_store(keys(1), c)
    m.complete_store(keys(1), c)
    m.complete_store(keys(1), c)
    s = m.get_stats()
    assert s.duplicate_completions == 1 and s.evictable_blocks == 1


def test_unknown_completion_raises_and_changes_nothing() -> None:
    m = CPUOffloadingManager(2)
    c = ctx()
    m.prepare_store(keys(1), c)
    with pytest.raises(ValueError, match="no store in flight"):
        m.complete_store(keys(1, 9), c)
    assert m.lookup(k(1)) == LookupResult.HIT_PENDING  # 1 was not completed either
    with pytest.raises(ValueError, match="no load in flight"):
        m.complete_load(keys(1), c)


def test_completions_prepared_before_reset_are_ignored_and_give_their_slots_back() -> None:
    m = CPUOffloadingManager(2)
    old = ctx("old")
    out = m.prepare_store(keys(1), old)
    assert out is not None and out.store_spec.block_ids == [0]
    store(m, [5])
    reader = ctx("reader")
    m.prepare_load(keys(5), reader)
    m.reset_cache()
    new = ctx("new")
    # Slot 0 is still being written and slot 1 still read: neither may be handed out.
    assert m.prepare_store(keys(1), new) is None
    s = m.get_stats()
    assert (s.held_blocks, s.stored_blocks, s.pending_blocks, s.pinned_blocks) == (2, 0, 0, 0)
    m.complete_store(keys(1), old)  # stale: gives slot 0 back, makes nothing readable
    assert m.lookup(k(1)) == LookupResult.MISS
    out2 = m.prepare_store(keys(1), new)  # same key, new generation, the slot just released
    assert out2 is not None and out2.store_spec.block_ids == [0]
    assert m.prepare_store(keys(2), new) is None  # slot 1 is still being read
    m.complete_load(keys(5), reader)  # stale load completion: slot 1 comes back
    s = m.get_stats()
    assert s.stale_completions == 2 and s.generation == 1 and s.held_blocks == 0
    out3 = m.prepare_store(keys(2), new)
    assert out3 is not None and out3.store_spec.block_ids == [1]
    m.complete_store(keys(1, 2), new)
    assert m.lookup(k(1)) == LookupResult.HIT


class TouchRecorder(LRUCachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.touches: list[list[OffloadKey]] = []
        self.contexts: list[ReqContext | None] = []

    def touch(self, keys, req_context=None):  # type: ignore[no-untyped-def]
        keys = list(keys)
        self.touches.append(keys)
        self.contexts.append(req_context)
        super().touch(keys, req_context)


def test_each_request_touches_each_key_once_and_context_reaches_policy() -> None:
    policy = TouchRecorder(8)
    m = CPUOffloadingManager(8, cache_policy=policy)
    store(m, [1, 2])
    policy.touches.clear()
    policy.contexts.clear()
    c = ctx("x")
    m.on_new_request(c)
    m.prepare_load(keys(1, 2), c)
    m.touch(keys(1, 2), c)
    m.touch(keys(2), c)
    m.complete_load(keys(1, 2), c)
    m.prepare_store(keys(1, 2, 3), c)
    assert policy.touches == [keys(1, 2), keys(3)]
    assert all(rc is c for rc in policy.contexts)


def test_partial_store_keeps_the_longest_prefix_that_fits() -> None:
    m = CPUOffloadingManager(3, partial_store=True)
    store(m, [1])
    reader = ctx()
    m.prepare_load(keys(1), reader)
    out = m.prepare_store(keys(2, 3, 4, 5), ctx())
    assert out is not None
    assert out.keys_to_store == keys(2, 3)
    strict = CPUOffloadingManager(3)
    store(strict, [1])
    strict.prepare_load(keys(1), reader)
    assert strict.prepare_store(keys(2, 3, 4, 5), ctx()) is None


def test_store_threshold_counts_offers_at_store_time_not_lookup() -> None:
    m = CPUOffloadingManager(4, store_threshold=2, max_tracker_size=3)
    for _ in range(3):
        assert m.lookup(k(1)) == LookupResult.MISS  # lookups never count as offers
    c = ctx()
    out = m.prepare_store(keys(1, 2), c)
    assert out is not None and out.keys_to_store == []
    out = m.prepare_store(keys(1, 2), c)
    assert out is not None and out.keys_to_store == keys(1, 2)
    assert m.get_stats().admission_rejects == 2


def test_offer_tracker_is_bounded_lru() -> None:
    tracker = StoreAfterNOffers(2, max_tracker_size=3)
    assert tracker.admit(keys(1, 2, 3), None) == []
    assert tracker.admit(keys(4), None) == []  # 1 forgotten (least recently offered)
    assert len(tracker) == 3 and tracker.offers(k(1)) == 0
    assert tracker.admit(keys(1, 2), None) == keys(2)
    with pytest.raises(ValueError, match="max_tracker_size"):
        StoreAfterNOffers(2, 0)


def test_tracker_never_drops_keys_counted_in_the_same_call() -> None:
    tracker = StoreAfterNOffers(2, max_tracker_size=2)
    assert tracker.admit(keys(1, 2, 3, 4), None) == []
    assert sorted(tracker.offers(x) for x in keys(1, 2, 3, 4)) == [1, 1, 1, 1]


def test_skip_partial_tail_rejects_only_the_tail() -> None:
    m = CPUOffloadingManager(4, skip_partial_tail=True)
    c = ReqContext(req_id="t", partial_tail_key=k(3))
    out = m.prepare_store(keys(1, 2, 3), c)
    assert out is not None and out.keys_to_store == keys(1, 2)
    assert m.get_stats().admission_rejects == 1


class EvenKeysOnly:
    def admit(self, keys, ctx):  # type: ignore[no-untyped-def]
        return [key for key in keys if key[7] % 2 == 0]

    def reset(self) -> None:
        pass


def test_user_admission_filter() -> None:
    m = CPUOffloadingManager(4, admission=EvenKeysOnly())
    out = m.prepare_store(keys(1, 2, 3, 4), ctx())
    assert out is not None and out.keys_to_store == keys(2, 4)
    with pytest.raises(TypeError, match="not an admission filter"):
        CPUOffloadingManager(4, admission=[object()])  # type: ignore[list-item]


def test_stats_gauges_mean_what_they_say() -> None:
    m = CPUOffloadingManager(4, cache_policy="arc")
    assert m.get_stats().fill_ratio == 0
    c = ctx()
    m.prepare_store(keys(1, 2), c)
    s = m.get_stats()
    assert (s.fill_ratio, s.pending_ratio, s.pinned_ratio) == (0.5, 0.5, 0.0)
    m.complete_store(keys(1, 2), c)
    m.prepare_load(keys(1), c)
    s = m.get_stats()
    assert (s.fill_ratio, s.pending_ratio, s.pinned_ratio) == (0.5, 0.0, 0.25)
    assert s.policy["t1_size"] + s.policy["t2_size"] == 2
    assert m.lookup(k(9)) == LookupResult.MISS
    d = m.get_stats().as_dict()
    assert d["misses"] == 1 and d["lookups"] == 1 and "policy_target_t1_size" in d
    assert CPUOffloadingManager(0).get_stats().fill_ratio == 0


def test_events_convert_to_vllm_style_records() -> None:
    m = CPUOffloadingManager(1, enable_events=True)
    store(m, [1])
    store(m, [2])
    m.reset_cache()
    records = to_kv_cache_events(m.take_events(), block_size=16)
    assert isinstance(records[0], BlockStored) and records[0].block_hashes == [
        (1).to_bytes(8, "big")
    ]
    assert records[0].block_size == 16 and records[0].medium == "CPU"
    assert isinstance(records[1], BlockRemoved) and records[1].block_hashes == [
        (1).to_bytes(8, "big")
    ]
    assert type(records[-1]).__name__ == "AllBlocksCleared"


def test_bad_configuration_errors() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        CPUOffloadingManager(-1)
    with pytest.raises(ValueError, match="Unknown cache policy"):
        CPUOffloadingManager(4, cache_policy="nope")
    with pytest.raises(ValueError, match="Bad cache_policy_params"):
        CPUOffloadingManager(4, cache_policy_params={"x": 1})
    with pytest.raises(ValueError, match="store_threshold"):
        CPUOffloadingManager(4, store_threshold=-1)


def test_custom_registered_policy_end_to_end() -> None:
    with CachePolicyFactory.registry_snapshot():
        CachePolicyFactory.register_cache_policy("counting", __name__, "CountingLRU")
        m = CPUOffloadingManager(1, cache_policy="counting")
        assert type(m.policy).__name__ == "CountingLRU"
        store(m, [1])
        store(m, [2])
        assert m.get_stats().evictions == 1


def test_module_path_policy_through_the_manager() -> None:
    m = CPUOffloadingManager(2, cache_policy="CountingLRU", cache_policy_module_path=__name__)
    assert type(m.policy).__name__ == "CountingLRU"


def test_thread_safe_manager_under_concurrent_completions() -> None:
    import threading

    m = CPUOffloadingManager(64, thread_safe=True)
    errors: list[BaseException] = []

    def worker(base: int) -> None:
        try:
            for i in range(200):
                c = ctx(f"w{base}-{i}")
                out = m.prepare_store(keys(base * 10_000 + i), c)
                if out is not None:
                    m.complete_store(out.keys_to_store, c)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = m.get_stats()
    assert s.stored_blocks == 64 and s.evictable_blocks == 64 and s.stores_completed == 800


class HookedLRU(LRUCachePolicy):
    """Overrides the single-key hooks the manager may batch or skip for plain LRU."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.inserted: list[OffloadKey] = []
        self.marked: list[OffloadKey] = []
        self.touched: list[OffloadKey] = []

    def insert(self, key, block, req_context=None):  # type: ignore[no-untyped-def]
        self.inserted.append(key)
        super().insert(key, block, req_context)

    def mark_evictable(self, key: OffloadKey) -> None:
        self.marked.append(key)
        super().mark_evictable(key)

    def touch(self, keys, req_context=None):  # type: ignore[no-untyped-def]
        keys = list(keys)
        self.touched.extend(keys)
        super().touch(keys, req_context)


def test_subclass_hooks_are_honoured_by_batched_calls() -> None:
    policy = HookedLRU(4)
    m = CPUOffloadingManager(4, cache_policy=policy)
    store(m, [1, 2, 3])
    assert policy.inserted == keys(1, 2, 3)
    assert policy.marked == keys(3, 2, 1)  # tail first: the head ends most recent
    assert policy.touched == keys(1, 2, 3)  # plain LRU skips touching misses; this one doesn't


def test_plain_lru_skips_touching_pure_misses_but_arc_does_not() -> None:
    assert CPUOffloadingManager(2)._ledger.touches_misses is False
    assert CPUOffloadingManager(2, cache_policy="arc")._ledger.touches_misses is True
    assert CPUOffloadingManager(2, cache_policy=HookedLRU(2))._ledger.touches_misses is True


# ---------------------------------------------------------------- evict ahead (write-back)
def test_evict_ahead_takes_the_policys_victims_and_holds_their_slots_until_released() -> None:
    m = CPUOffloadingManager(3, enable_events=True)
    slots = {i: store(m, [i], name=f"r{i}")[0] for i in (1, 2, 3)}  # LRU order 1, 2, 3
    m.take_events()
    assert m.evict_ahead(2, protected=[k(1)]) == [(k(2), slots[2]), (k(3), slots[3])]
    assert lookup_all(m, [1, 2, 3]) == [LookupResult.HIT, LookupResult.MISS, LookupResult.MISS]
    stats = m.get_stats()
    assert stats.evictions == 2 and stats.held_blocks == 2 and stats.stored_blocks == 1
    assert m.free_blocks == 0 and m.has_pending_work()
    assert [e.removed for e in m.take_events()] == [True]
    writer = ctx("s")
    out = m.prepare_store(keys(4), writer)  # no free slot: the store evicts key 1 ...
    assert out is not None and out.evicted_keys == keys(1)
    assert out.store_spec.block_ids == [slots[1]]  # ... and takes its slot, never a held one
    m.complete_store(out.keys_to_store, writer)
    assert m.evict_ahead(0) == []
    m.release_evicted([slots[2]])
    assert m.free_blocks == 1 and m.get_stats().held_blocks == 1
    assert store(m, [5], name="t") == [slots[2]]
    with pytest.raises(ValueError, match="not held"):
        m.release_evicted([slots[2]])
    with pytest.raises(ValueError, match="n"):
        m.evict_ahead(-1)


def test_a_reset_never_frees_a_slot_evicted_ahead() -> None:
    m = CPUOffloadingManager(2)
    store(m, [1], name="a")
    store(m, [2], name="b")
    [(_, held)] = m.evict_ahead(1)
    m.reset_cache()
    assert m.get_stats().held_blocks == 1 and m.free_blocks == 1
    assert held not in store(m, [7], name="c")  # the reset kept it out of the free slots
    assert m.prepare_store(keys(8), ctx("d")) is not None  # evicts 7; the held slot stays
    m.release_evicted([held])
    assert m.free_blocks == 1 and not m.get_stats().held_blocks
