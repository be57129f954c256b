"""retention: conformance, parameters, priority order, expiry, user pins, a reference model."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
from replay_helpers import manager_decisions, one_at_a_time

from kvoffload.context import ReqContext
from kvoffload.manager import CPUOffloadingManager
from kvoffload.policies import create_cache_policy
from kvoffload.policies.base import BlockStatus
from kvoffload.policies.retention import RetentionCachePolicy
from kvoffload.testing import check_policy_conformance, int_key


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _id(key: bytes) -> int:
    return int.from_bytes(key[:8], "big")


def _ctx(priority: int | None = None, duration: float | None = None, **kw: object) -> ReqContext:
    return ReqContext(req_id="r", priority=priority, priority_duration_s=duration, **kw)  # type: ignore[arg-type]


def _store(
    policy: RetentionCachePolicy, block: int, ctx: ReqContext | None = None, ready: bool = True
) -> None:
    key = int_key(block)
    policy.touch([key], ctx)
    policy.insert(key, BlockStatus(block, -1), ctx)
    if ready:
        status = policy.get(key)
        assert status is not None
        status.ref_cnt = 0
        policy.mark_evictable(key)


def _evict(policy: RetentionCachePolicy, n: int, protected: set[int] | None = None) -> list[int]:
    victims = policy.evict(n, {int_key(b) for b in protected or set()})
    assert victims is not None
    return [_id(key) for key, _ in victims]


# ------------------------------------------------------------------ contract and parameters
def test_conformance_default_parameters() -> None:
    check_policy_conformance(RetentionCachePolicy)


def test_conformance_other_parameters() -> None:
    check_policy_conformance(RetentionCachePolicy, default_priority=100, clock=FakeClock(3.0))


def test_registered_by_name() -> None:
    policy = create_cache_policy("retention", 4, params={"default_priority": 50})
    assert isinstance(policy, RetentionCachePolicy)
    assert policy.default_priority == 50


@pytest.mark.parametrize("bad", [-1, 101])
def test_bad_default_priority_is_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="default_priority"):
        RetentionCachePolicy(4, default_priority=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [35.0, True, "35", None])
def test_default_priority_of_a_wrong_type_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="default_priority"):
        RetentionCachePolicy(4, default_priority=bad)  # type: ignore[arg-type]


def test_clock_must_be_callable() -> None:
    with pytest.raises(TypeError, match="clock"):
        RetentionCachePolicy(4, clock=3.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("priority", "duration", "message"),
    [
        (101, None, "priority"),
        (-5, None, "priority"),
        (True, None, "priority"),
        (50, -1.0, "priority_duration_s"),
        (50, math.nan, "priority_duration_s"),
        (50, "soon", "priority_duration_s"),
    ],
)
def test_bad_request_hints_are_type_or_value_errors(
    priority: object, duration: object, message: str
) -> None:
    policy = RetentionCachePolicy(4)
    ctx = _ctx(priority, duration)  # type: ignore[arg-type]
    error = TypeError if isinstance(priority, bool) or isinstance(duration, str) else ValueError
    with pytest.raises(error, match=message):
        policy.insert(int_key(1), BlockStatus(0, -1), ctx)
    with pytest.raises(error, match="request 'r'"):
        policy.touch([int_key(1)], ctx)


# ------------------------------------------------------------------ order
def test_lower_priority_goes_first_then_lru_within_a_level() -> None:
    policy = RetentionCachePolicy(8, clock=FakeClock())
    _store(policy, 1, _ctx(80))
    _store(policy, 2)  # default 35
    _store(policy, 3, _ctx(10))
    _store(policy, 4)
    _store(policy, 5, _ctx(10))
    policy.touch([int_key(2)])  # 2 is now more recent than 4
    assert _evict(policy, 5) == [3, 5, 4, 2, 1]


def test_one_touch_makes_the_head_most_recent() -> None:
    policy = RetentionCachePolicy(8, clock=FakeClock())
    keys = [int_key(i) for i in range(3)]
    policy.touch(keys)
    for i, key in enumerate(keys):
        policy.insert(key, BlockStatus(i, 0))
    policy.touch(keys)
    assert _evict(policy, 3) == [2, 1, 0]


def test_a_lower_priority_request_cannot_demote_a_block() -> None:
    policy = RetentionCachePolicy(8, clock=FakeClock())
    _store(policy, 1, _ctx(90))
    _store(policy, 2)
    policy.touch([int_key(1)], _ctx(5))
    assert policy.priority(int_key(1)) == 90
    policy.touch([int_key(2)], _ctx(60))  # a higher one raises it
    assert policy.priority(int_key(2)) == 60
    assert _evict(policy, 2) == [2, 1]


# ------------------------------------------------------------------ expiry
def test_priority_expires_back_to_the_default_below_used_default_blocks() -> None:
    clock = FakeClock(100.0)
    policy = RetentionCachePolicy(8, clock=clock)
    _store(policy, 1, _ctx(90, 10.0))
    _store(policy, 2, _ctx(90, 20.0))
    _store(policy, 3)  # default, stored last
    _store(policy, 4, _ctx(10))
    clock.now = 109.0
    assert policy.priority(int_key(1)) == 90
    assert _evict(policy, 2) == [4, 3]
    _store(policy, 5)
    clock.now = 125.0
    assert policy.priority(int_key(1)) == 35
    # Both expired: below the default blocks used since, earliest expiry first.
    assert _evict(policy, 3) == [1, 2, 5]
    assert policy.stats()["expirations"] == 2


def test_equal_priority_extends_and_a_used_expired_block_is_ordinary() -> None:
    clock = FakeClock(0.0)
    policy = RetentionCachePolicy(8, clock=clock)
    _store(policy, 1, _ctx(70, 10.0))
    _store(policy, 2, _ctx(70, 10.0))
    clock.now = 5.0
    policy.touch([int_key(1)], _ctx(70, 10.0))  # 1 now holds 70 until t=15
    clock.now = 12.0
    assert (policy.priority(int_key(1)), policy.priority(int_key(2))) == (70, 35)
    _store(policy, 3)
    policy.touch([int_key(2)])  # 2 is used at the default level: after 3 now
    assert _evict(policy, 3) == [3, 2, 1]


def test_no_duration_means_the_priority_holds_for_good() -> None:
    clock = FakeClock(0.0)
    policy = RetentionCachePolicy(8, clock=clock)
    _store(policy, 1, _ctx(70))
    _store(policy, 2)
    clock.now = 1e9
    assert _evict(policy, 1) == [2]


def test_request_timestamps_are_the_clock_when_given() -> None:
    def no_wall_clock() -> float:
        raise AssertionError("trace time must not mix with the clock")

    policy = RetentionCachePolicy(8, clock=no_wall_clock)
    _store(policy, 1, _ctx(90, 10.0, timestamp=1000.0))
    _store(policy, 2, _ctx(timestamp=1005.0))
    assert _evict(policy, 1) == [2]
    _store(policy, 3, _ctx(timestamp=1011.0))
    assert _evict(policy, 1) == [1]  # expired at t=1010


def test_expiry_works_through_the_manager() -> None:
    clock = FakeClock(0.0)
    policy = RetentionCachePolicy(2, clock=clock)
    manager = CPUOffloadingManager(2, cache_policy=policy)
    system, user, other = int_key(1), int_key(2), int_key(3)
    for key, ctx in ((system, _ctx(100, 60.0)), (user, _ctx())):
        out = manager.prepare_store([key], ctx)
        assert out is not None
        manager.complete_store([key], ctx)
    ctx = _ctx()
    out = manager.prepare_store([other], ctx)
    assert out is not None and out.evicted_keys == [user]
    manager.complete_store([other], ctx)
    clock.now = 61.0
    out = manager.prepare_store([int_key(4)], _ctx())
    assert out is not None and out.evicted_keys == [system]


def test_deadline_heap_stays_bounded_under_repeated_use() -> None:
    clock = FakeClock(0.0)
    policy = RetentionCachePolicy(4, clock=clock)
    for block in range(4):
        _store(policy, block, _ctx(80, 5.0))
    for step in range(5000):
        clock.now = step * 0.01
        policy.touch([int_key(step % 4)], _ctx(80, 5.0))
    assert policy.stats()["deadline_entries"] <= 2 * 4 + 64


# ------------------------------------------------------------------ user pins
def test_user_pins_are_never_evicted_and_are_counted() -> None:
    policy = RetentionCachePolicy(4, clock=FakeClock())
    for block in range(3):
        _store(policy, block, _ctx(0))
    assert policy.pin([int_key(0), int_key(1), int_key(9)]) == 2  # 9 is not stored
    assert policy.stats()["user_pinned"] == 2
    assert policy.is_pinned(int_key(0))
    assert _evict(policy, 1) == [2]
    assert policy.evict(1, set()) is None
    assert policy.unpin([int_key(1), int_key(2)]) == 1
    assert policy.stats()["user_pinned"] == 1
    assert _evict(policy, 1) == [1]
    assert policy.evict(1, set()) is None


def test_a_user_pin_survives_load_pins_and_dies_with_the_block() -> None:
    policy = RetentionCachePolicy(4, clock=FakeClock())
    _store(policy, 1)
    _store(policy, 2)
    policy.pin([int_key(1)])
    status = policy.get(int_key(1))
    assert status is not None
    status.ref_cnt = 1
    policy.mark_non_evictable(int_key(1))
    status.ref_cnt = 0
    policy.mark_evictable(int_key(1))  # the load finished: still user-pinned
    assert _evict(policy, 1) == [2]
    assert policy.evict(1, set()) is None
    policy.remove(int_key(1))
    assert policy.stats()["user_pinned"] == 0
    assert not policy.is_pinned(int_key(1))


# ------------------------------------------------------------------ a reference model
@dataclass
class _ModelBlock:
    level: int
    deadline: float | None
    deadline_id: int
    ready: bool = False
    pinned: bool = False  # manager pin (a load)
    user_pinned: bool = False
    stamp: int = 0
    expired: bool = False  # listed with the expired blocks (ordered by deadline, id)
    expired_order: tuple[float, int] = (0.0, 0)


class _RetentionModel:
    """Sort-based reference: a victim is the least (level, expired-first, age) block."""

    def __init__(self, default: int) -> None:
        self.default = default
        self.blocks: dict[int, _ModelBlock] = {}
        self.stamp = 0
        self.deadline_ids = 0

    def listed(self, b: _ModelBlock) -> bool:
        return b.ready and not b.pinned and not b.user_pinned

    def give(self, priority: int | None, duration: float | None, now: float) -> tuple:
        level = self.default if priority is None else priority
        if level == self.default or duration is None:
            return level, None
        return level, now + duration

    def new_deadline(self, b: _ModelBlock, deadline: float | None) -> None:
        b.deadline = deadline
        if deadline is not None:
            b.deadline_id = self.deadline_ids
            self.deadline_ids += 1

    def expire(self, b: _ModelBlock, now: float) -> None:
        if b.deadline is not None and b.deadline <= now:
            b.level, b.deadline = self.default, None

    def used(self, b: _ModelBlock, now: float) -> None:
        self.expire(b, now)
        b.expired = False
        self.stamp += 1
        b.stamp = self.stamp

    def insert(self, block: int, priority: int | None, duration: float | None, now: float) -> None:
        level, deadline = self.give(priority, duration, now)
        b = self.blocks[block] = _ModelBlock(level, None, -1)
        self.new_deadline(b, deadline)

    def touch(self, blocks: list[int], priority: int | None, duration: float | None, now: float):
        level, deadline = self.give(priority, duration, now)
        for block in reversed(blocks):
            b = self.blocks.get(block)
            if b is None:
                continue
            self.used(b, now)
            if level > b.level:
                b.level = level
                self.new_deadline(b, deadline)
            elif (
                level == b.level
                and b.deadline is not None
                and (deadline is None or deadline > b.deadline)
            ):
                self.new_deadline(b, deadline)

    def evict(self, n: int, protected: set[int], now: float) -> list[int] | None:
        for b in self.blocks.values():
            if b.deadline is not None and b.deadline <= now:
                if self.listed(b):
                    b.expired, b.expired_order = True, (b.deadline, b.deadline_id)
                b.level, b.deadline = self.default, None

        def rank(item: tuple[int, _ModelBlock]) -> tuple:
            b = item[1]
            if b.expired:
                return (self.default, 0, *b.expired_order)
            return (b.level, 1, b.stamp, 0)

        eligible = sorted(
            (
                item
                for item in self.blocks.items()
                if self.listed(item[1]) and item[0] not in protected
            ),
            key=rank,
        )
        if len(eligible) < n:
            return None
        chosen = [block for block, _ in eligible[:n]]
        for block in chosen:
            del self.blocks[block]
        return chosen


def _run_against_model(seed: int, steps: int = 300) -> int:
    rng = random.Random(seed)
    clock = FakeClock(0.0)
    default = rng.choice([0, 35, 50, 100])
    capacity = rng.randint(1, 10)
    policy = RetentionCachePolicy(capacity, default_priority=default, clock=clock)
    model = _RetentionModel(default)
    statuses: dict[int, BlockStatus] = {}
    next_id = 0
    compared = 0

    def hint() -> tuple[int | None, float | None]:
        priority = rng.choice([None, None, 0, 20, default, 60, 100])
        duration = rng.choice([None, 0.0, 1.0, 3.0, 7.5])
        return priority, duration

    def check_evict(n: int, protected: set[int]) -> list[int] | None:
        nonlocal compared
        victims = policy.evict(n, {int_key(b) for b in protected})
        ours = None if victims is None else [_id(key) for key, _ in victims]
        assert ours == model.evict(n, protected, clock.now), f"seed {seed}"
        compared += 1
        for block in ours or []:
            del statuses[block]
        return ours

    for _ in range(steps):
        clock.now += rng.choice([0.0, 0.0, 0.5, 2.0])
        roll = rng.random()
        stored = list(statuses)
        if roll < 0.3:  # a store of 1-3 new blocks
            blocks = list(range(next_id, next_id + rng.randint(1, 3)))
            next_id += len(blocks)
            priority, duration = hint()
            ctx = _ctx(priority, duration)
            policy.touch([int_key(b) for b in blocks], ctx)
            need = len(statuses) + len(blocks) - capacity
            if need > 0 and check_evict(need, set(blocks)) is None:
                continue
            for block in blocks:
                statuses[block] = BlockStatus(block, -1)
                policy.insert(int_key(block), statuses[block], ctx)
                model.insert(block, priority, duration, clock.now)
        elif roll < 0.5 and stored:  # a write completes
            pending = [b for b in stored if statuses[b].ref_cnt == -1]
            if pending:
                block = rng.choice(pending)
                statuses[block].ref_cnt = 0
                policy.mark_evictable(int_key(block))
                model.blocks[block].ready = True
                model.used(model.blocks[block], clock.now)
        elif roll < 0.65 and stored:  # hits by a request with its own priority
            blocks = rng.sample(stored, rng.randint(1, min(3, len(stored))))
            priority, duration = hint()
            policy.touch([int_key(b) for b in blocks], _ctx(priority, duration))
            model.touch(blocks, priority, duration, clock.now)
        elif roll < 0.75 and stored:  # a load pins or unpins
            block = rng.choice(stored)
            status, b = statuses[block], model.blocks[block]
            if status.ref_cnt == 0:
                status.ref_cnt, b.pinned = 1, True
                policy.mark_non_evictable(int_key(block))
            elif status.ref_cnt == 1:
                status.ref_cnt, b.pinned = 0, False
                policy.mark_evictable(int_key(block))
                model.used(b, clock.now)
        elif roll < 0.85 and stored:  # the user pins or unpins
            block = rng.choice(stored)
            b = model.blocks[block]
            if policy.is_pinned(int_key(block)):
                assert policy.unpin([int_key(block)]) == 1
                b.user_pinned = False
                model.used(b, clock.now)
            else:
                assert policy.pin([int_key(block)]) == 1
                b.user_pinned, b.expired = True, False
        elif stored:  # a stray eviction
            protected = {b for b in stored if rng.random() < 0.3}
            check_evict(rng.randint(1, 3), protected)
        for block in stored[:3]:
            if block in statuses:
                b = model.blocks[block]
                due = b.deadline is not None and b.deadline <= clock.now
                assert policy.priority(int_key(block)) == (model.default if due else b.level)
    return compared


def test_matches_a_sort_based_reference_model() -> None:
    compared = sum(_run_against_model(seed) for seed in range(60))
    assert compared > 1000


# ------------------------------------------------------------------ batched calls
def test_batched_manager_calls_decide_like_single_calls() -> None:
    single = one_at_a_time(RetentionCachePolicy)
    for capacity in (6, 40):
        batched = manager_decisions(RetentionCachePolicy(capacity, clock=FakeClock()), capacity)
        assert batched == manager_decisions(single(capacity, clock=FakeClock()), capacity)


def _batched_log(policy_cls: type[RetentionCachePolicy], seed: int) -> list[object]:
    """Stores with priorities and deadlines, completions (some repeated), pins, uses, evictions."""
    rng = random.Random(seed)
    clock = FakeClock()
    policy = policy_cls(12, clock=clock)
    statuses: dict[int, BlockStatus] = {}
    log: list[object] = []
    for step in range(400):
        clock.now += rng.random()
        roll = rng.random()
        ctx = _ctx(
            rng.choice([None, 0, 20, 35, 60, 100]),
            rng.choice([None, 0.0, 0.5, 3.0]),
            timestamp=clock.now if rng.random() < 0.3 else None,
        )
        if roll < 0.3:
            blocks = [b for b in rng.sample(range(40), rng.randint(1, 6)) if b not in statuses]
            fresh = [BlockStatus(b, rng.choice([-1, -1, 0])) for b in blocks]
            policy.insert_many([int_key(b) for b in blocks], fresh, ctx)
            statuses.update(zip(blocks, fresh, strict=True))
        elif roll < 0.55:
            blocks = [b for b, st in statuses.items() if st.ref_cnt != 0 and rng.random() < 0.7]
            blocks += [b for b, st in statuses.items() if st.ref_cnt == 0 and rng.random() < 0.1]
            if blocks and rng.random() < 0.2:
                blocks.append(blocks[0])
            for b in blocks:
                statuses[b].ref_cnt = 0
            policy.mark_evictable_many([int_key(b) for b in blocks])
        elif roll < 0.65 and statuses:
            keys = [int_key(b) for b in rng.sample(sorted(statuses), min(2, len(statuses)))]
            log.append(policy.pin(keys) if rng.random() < 0.5 else policy.unpin(keys))
        elif roll < 0.8:
            policy.touch([int_key(rng.randrange(40)) for _ in range(4)], ctx)
        else:
            protected = {rng.randrange(40) for _ in range(3)}
            victims = policy.evict(rng.randint(1, 3), {int_key(b) for b in protected})
            if victims is not None:
                for key, _ in victims:
                    del statuses[_id(key)]
            log.append(None if victims is None else [_id(key) for key, _ in victims])
        log.append((step, sorted(policy.stats().items())))
    return log


def test_batched_calls_with_priorities_decide_like_single_calls() -> None:
    single = one_at_a_time(RetentionCachePolicy)
    for seed in range(20):
        assert _batched_log(RetentionCachePolicy, seed) == _batched_log(single, seed)
