"""Switching a resident set between policies: nothing dropped, pins and writes protected."""

from __future__ import annotations

import pytest

from kvoffload.policies import BUILTIN_POLICIES, BlockStatus, CachePolicy, create_cache_policy
from kvoffload.policies.switching import switch_resident_set
from kvoffload.testing.drive import int_key


def _filled(name: str, n: int) -> tuple[CachePolicy, list[BlockStatus]]:
    policy = create_cache_policy(name, n)
    statuses = []
    for i in range(n):
        status = BlockStatus(i, -1)
        policy.touch([int_key(i)])
        policy.insert(int_key(i), status)
        status.ref_cnt = 0
        policy.mark_evictable(int_key(i))
        statuses.append(status)
    return policy, statuses


def test_lru_to_lru_keeps_the_recency_order_and_the_status_objects() -> None:
    old, statuses = _filled("lru", 6)
    old.touch([int_key(0)])  # 0 becomes most recent: order 1..5, 0
    new = create_cache_policy("lru", 6)
    report = switch_resident_set(old, new)
    assert report.moved == 6 and old.get(int_key(0)) is None
    assert new.get(int_key(3)) is statuses[3]
    victims = new.evict(6, ())
    assert victims is not None
    assert [k for k, _ in victims] == [int_key(i) for i in (1, 2, 3, 4, 5, 0)]


@pytest.mark.parametrize("target", ["mq", "arc", "kvaware", "sieve", "lfu"])
def test_pinned_and_pending_blocks_stay_protected(target: str) -> None:
    old, statuses = _filled("lru", 5)
    statuses[1].ref_cnt = 2
    old.mark_non_evictable(int_key(1))
    old.remove(int_key(4))
    pending = BlockStatus(4, -1)
    old.insert(int_key(4), pending)
    new = create_cache_policy(target, 5)
    report = switch_resident_set(old, new)
    assert (report.evictable, report.pinned, report.pending) == (3, 1, 1)
    assert statuses[1].ref_cnt == 2 and pending.ref_cnt == -1
    assert new.evict(4, ()) is None  # only 3 are evictable
    victims = new.evict(3, ())
    assert victims is not None and {k for k, _ in victims} == {int_key(i) for i in (0, 2, 3)}
    pending.ref_cnt = 0
    new.mark_evictable(int_key(4))  # the manager's completion reaches the new policy
    assert new.evict(1, ()) == [(int_key(4), pending)]


def test_frequencies_reach_a_frequency_target() -> None:
    old, _ = _filled("lru", 4)
    new = create_cache_policy("lfu", 4)
    switch_resident_set(old, new, frequencies={int_key(0): 5, int_key(1): 3})
    victims = new.evict(2, ())
    assert victims is not None and {k for k, _ in victims} == {int_key(2), int_key(3)}


def test_refusals_change_nothing() -> None:
    old, _ = _filled("lru", 4)
    with pytest.raises(ValueError, match="fewer than"):
        switch_resident_set(old, create_cache_policy("lru", 2))
    busy, _ = _filled("lru", 4)
    with pytest.raises(ValueError, match="empty"):
        switch_resident_set(old, busy)
    assert all(old.get(int_key(i)) is not None for i in range(4))
    with pytest.raises(ValueError, match="different"):
        switch_resident_set(old, old)


@pytest.mark.parametrize("name", [row[0] for row in BUILTIN_POLICIES])
def test_every_built_in_hands_over_its_whole_resident_set(name: str) -> None:
    old, statuses = _filled(name, 8)
    statuses[2].ref_cnt = 1
    old.mark_non_evictable(int_key(2))
    resident = [int_key(i) for i in range(8)] if old.block_table is None else None
    new = create_cache_policy("lru", 8)
    report = switch_resident_set(old, new, resident_keys=resident)
    assert (report.evictable, report.pinned, report.pending) == (7, 1, 0)
    assert all(new.get(int_key(i)) is statuses[i] for i in range(8))
    assert all(old.get(int_key(i)) is None for i in range(8))


def test_a_warm_switch_follows_the_logged_accesses_not_the_old_order() -> None:
    """LRU warmed on a log in which 0 and 2 were used last: they are its last victims."""
    from kvoffload.context import ReqContext
    from kvoffload.selection.switching import warm_switch

    old, statuses = _filled("fifo", 5)  # FIFO order 0..4; a cold switch keeps it
    ctx = ReqContext(req_id="r", timestamp=1.0)
    log = [([int_key(i) for i in (9, 1, 3, 4)], ctx), ([int_key(0), int_key(2)], ctx)]
    log.append((None, ctx))
    new = create_cache_policy("lru", 5)
    report = warm_switch(old, new, log)
    assert (report.moved, report.replayed) == (5, 5) and len(old) == 0
    assert new.get(int_key(9)) is None and all(s.ref_cnt == 0 for s in statuses)
    victims = new.evict(5, ())
    assert victims is not None
    assert [k for k, _ in victims] == [int_key(i) for i in (1, 3, 4, 0, 2)]
    assert [s for _, s in victims] == [statuses[i] for i in (1, 3, 4, 0, 2)]


def test_a_warm_switch_without_a_log_is_the_plain_switch() -> None:
    from kvoffload.selection.switching import warm_switch

    old, _ = _filled("fifo", 5)
    old.touch([int_key(0)])
    new = create_cache_policy("lru", 5)
    report = warm_switch(old, new, [])
    assert (report.moved, report.replayed) == (5, 0)
    victims = new.evict(5, ())
    assert victims is not None and [k for k, _ in victims] == [int_key(i) for i in range(5)]


@pytest.mark.parametrize("target", ["mq", "arc", "kvaware", "lru"])
def test_a_warm_switch_keeps_pins_and_pending_writes(target: str) -> None:
    from kvoffload.selection.switching import warm_switch

    old, statuses = _filled("lru", 4)
    statuses[1].ref_cnt = 2
    old.mark_non_evictable(int_key(1))
    old.remove(int_key(3))
    pending = BlockStatus(3, -1)
    old.insert(int_key(3), pending)
    log = [([int_key(i) for i in (0, 1, 3, 7, 8, 9, 10)], None)]
    new = create_cache_policy(target, 4)
    report = warm_switch(old, new, log)
    assert (report.evictable, report.pinned, report.pending) == (2, 1, 1)
    assert statuses[1].ref_cnt == 2 and pending.ref_cnt == -1
    assert all(new.get(int_key(i)) is None for i in (7, 8, 9, 10))
    assert new.get(int_key(2)) is statuses[2]
    victims = new.evict(2, ())
    assert victims is not None and {k for k, _ in victims} == {int_key(0), int_key(2)}
    assert new.evict(1, ()) is None  # 1 pinned, 3 being written
    pending.ref_cnt = 0
    new.mark_evictable(int_key(3))
    assert new.evict(1, ()) == [(int_key(3), pending)]


def test_a_warm_switch_refuses_a_target_that_is_not_empty() -> None:
    from kvoffload.selection.switching import warm_switch

    old, _ = _filled("lru", 3)
    new, _ = _filled("lru", 3)
    with pytest.raises(ValueError, match="empty"):
        warm_switch(old, new, [([int_key(0)], None)])
    assert len(old) == 3
