"""What the manager accepts as ``keys``: repeated keys, any iterable, only bytes keys."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies import CachePolicyFactory

POLICIES = CachePolicyFactory.registered_names()


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def state(m: CPUOffloadingManager) -> dict[str, object]:
    return m.get_stats().as_dict()


# ------------------------------------------------------------------ repeated keys
@pytest.mark.parametrize("policy", POLICIES)
def test_a_key_repeated_in_one_store_takes_one_slot(policy: str) -> None:
    m = CPUOffloadingManager(3, cache_policy=policy)
    c = ReqContext(req_id="r")
    out = m.prepare_store([k(7), k(8), k(7)], c)
    assert out is not None
    assert out.keys_to_store == [k(7), k(8)]  # deduplicated in order
    assert len(out.store_spec.block_ids) == 2
    m.complete_store(out.keys_to_store, c)
    s = m.get_stats()
    assert (s.stored_blocks, s.pending_blocks, s.stores_completed) == (2, 0, 2)
    assert m.lookup(k(7)) is LookupResult.HIT
    # Three fresh keys still fit a 3-slot cache (nothing leaked).
    c2 = ReqContext(req_id="r2")
    out2 = m.prepare_store([k(1), k(2), k(3)], c2)
    assert out2 is not None and len(out2.store_spec.block_ids) == 3
    m.complete_store(out2.keys_to_store, c2)
    assert m.get_stats().stored_blocks == 3 and not m.has_pending_work()


@pytest.mark.parametrize("policy", ["lru", "arc", "lfu"])
def test_a_key_repeated_in_one_load_is_one_pin_each(policy: str) -> None:
    m = CPUOffloadingManager(2, cache_policy=policy)
    c = ReqContext(req_id="w")
    out = m.prepare_store([k(1)], c)
    assert out is not None
    m.complete_store([k(1)], c)
    reader = ReqContext(req_id="r")
    spec = m.prepare_load([k(1), k(1)], reader)
    assert spec.block_ids == [out.store_spec.block_ids[0]] * 2
    m.complete_load([k(1)], reader)
    assert m.get_stats().pinned_blocks == 1  # one load still reads it
    m.complete_load([k(1)], reader)
    s = m.get_stats()
    assert (s.pinned_blocks, s.evictable_blocks) == (0, 1)


def test_a_repeated_completion_is_counted_not_applied_twice() -> None:
    m = CPUOffloadingManager(2)
    c = ReqContext(req_id="r")
    m.prepare_store([k(1), k(1)], c)
    m.complete_store([k(1), k(1)], c)
    s = m.get_stats()
    assert (s.stored_blocks, s.pending_blocks, s.evictable_blocks) == (1, 0, 1)
    assert s.duplicate_completions == 1


def test_repeats_within_a_touch_count_once() -> None:
    touched: list[list[OffloadKey]] = []
    m = CPUOffloadingManager(4, cache_policy="arc")
    original = m.policy.touch

    def spy(keys: Iterable[OffloadKey], ctx: ReqContext | None = None) -> None:
        keys = list(keys)
        touched.append(keys)
        original(keys, ctx)

    m.policy.touch = spy  # type: ignore[method-assign]
    m.touch([k(1), k(2), k(1)], ReqContext(req_id="r"))
    assert touched == [[k(1), k(2)]]


# ------------------------------------------------------------------ collections
CALLS: dict[str, Callable[[CPUOffloadingManager, object, ReqContext], object]] = {
    "prepare_store": lambda m, keys, c: m.prepare_store(keys, c),  # type: ignore[arg-type]
    "prepare_load": lambda m, keys, c: m.prepare_load(keys, c),  # type: ignore[arg-type]
    "complete_store": lambda m, keys, c: m.complete_store(keys, c),  # type: ignore[arg-type]
    "complete_load": lambda m, keys, c: m.complete_load(keys, c),  # type: ignore[arg-type]
    "touch": lambda m, keys, c: m.touch(keys, c),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("value", [k(5), "k5", bytearray(b"k5" * 8), 7, None])
def test_one_value_where_a_collection_is_due_is_a_type_error(call: str, value: object) -> None:
    m = CPUOffloadingManager(4)
    before = state(m)
    with pytest.raises(TypeError, match="keys must be"):
        CALLS[call](m, value, ReqContext(req_id="r"))
    assert state(m) == before


def test_any_iterable_of_keys_works_generators_included() -> None:
    m = CPUOffloadingManager(4)
    c = ReqContext(req_id="r")
    out = m.prepare_store((k(i) for i in range(3)), c)
    assert out is not None and out.keys_to_store == [k(0), k(1), k(2)]
    m.complete_store(iter(out.keys_to_store), c)
    assert [m.lookup(k(i)) for i in range(3)] == [LookupResult.HIT] * 3
    reader = ReqContext(req_id="reader")
    spec = m.prepare_load((k(i) for i in (2, 0)), reader)
    assert len(spec.block_ids) == 2
    assert m.get_stats().pinned_blocks == 2
    m.complete_load((k(i) for i in (2, 0)), reader)
    m.touch(k(i) for i in range(3))
    s = m.get_stats()
    assert (s.stored_blocks, s.pinned_blocks, s.evictable_blocks) == (3, 0, 3)


@pytest.mark.parametrize("bad", ["k5", 5, None, ("a", 1)])
def test_keys_that_are_not_bytes_never_enter_the_cache(bad: object) -> None:
    m = CPUOffloadingManager(4, cache_policy="arc")
    c = ReqContext(req_id="r")
    before = state(m)
    with pytest.raises(TypeError, match="must be bytes"):
        m.prepare_store([k(1), bad], c)  # type: ignore[list-item]
    assert state(m) == before
    with pytest.raises(TypeError, match="must be bytes"):
        m.touch([bad], c)  # type: ignore[list-item]
    # Error paths name the type instead of crashing on bytes-only formatting.
    for call in ("prepare_load", "complete_load", "complete_store"):
        with pytest.raises(TypeError, match="must be bytes"):
            CALLS[call](m, [bad], c)
    assert state(m) == before
    assert m.lookup(k(1)) is LookupResult.MISS


def test_unhashable_keys_are_a_type_error() -> None:
    m = CPUOffloadingManager(4)
    with pytest.raises(TypeError):
        m.prepare_store([[1, 2]], ReqContext(req_id="r"))  # type: ignore[list-item]
    assert m.get_stats().stores_prepared == 0
