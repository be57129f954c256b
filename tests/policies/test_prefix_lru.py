"""prefix-lru: conformance, leaf-first eviction, forced evictions, and no orphaned tails."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest
from replay_helpers import manager_decisions, one_at_a_time

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import CPUOffloadingManager, LookupResult
from kvoffload.policies import create_cache_policy
from kvoffload.policies.base import BlockStatus
from kvoffload.policies.lru import LRUCachePolicy
from kvoffload.policies.prefix_lru import PrefixLRUCachePolicy
from kvoffload.testing import PolicyConformanceSuite, int_key

BLOCK_TOKENS = 16


class TestPrefixLRUConformance(PolicyConformanceSuite):
    policy_cls = PrefixLRUCachePolicy


def test_registered_by_name() -> None:
    assert isinstance(create_cache_policy("prefix-lru", 4), PrefixLRUCachePolicy)


def _ctx(keys: list[OffloadKey], req_id: str = "r") -> ReqContext:
    ctx = ReqContext(req_id=req_id)
    ctx.set_key_positions([bytes(k) for k in keys], BLOCK_TOKENS)
    return ctx


def _store_one_at_a_time(policy: PrefixLRUCachePolicy | LRUCachePolicy, ids: list[int]) -> None:
    """One request storing its blocks head first, each touched, stored and completed alone."""
    keys = [int_key(i) for i in ids]
    ctx = _ctx(keys)
    for slot, key in enumerate(keys):
        policy.touch([key], ctx)
        policy.insert(key, BlockStatus(slot, -1), ctx)
        status = policy.get(key)
        assert status is not None
        status.ref_cnt = 0
        policy.mark_evictable(key)


def _evict_ids(
    policy: PrefixLRUCachePolicy | LRUCachePolicy, n: int, protected: Iterable[int] = ()
) -> list[int]:
    victims = policy.evict(n, {int_key(i) for i in protected})
    assert victims is not None
    return [int.from_bytes(key[:8], "big") for key, _ in victims]


def test_head_first_touches_still_evict_the_tail_first() -> None:
    lru, prefix = LRUCachePolicy(8), PrefixLRUCachePolicy(8)
    for policy in (lru, prefix):
        _store_one_at_a_time(policy, [0, 1, 2, 3])
    assert _evict_ids(lru, 1) == [0]  # LRU orphans blocks 1-3
    assert _evict_ids(prefix, 4) == [3, 2, 1, 0]


def test_blocks_of_one_touch_go_deepest_first() -> None:
    policy = PrefixLRUCachePolicy(8)
    keys = [int_key(i) for i in range(4)]
    ctx = _ctx(keys)
    policy.touch(keys, ctx)
    for slot, key in enumerate(keys):
        policy.insert(key, BlockStatus(slot, 0), ctx)
    policy.touch(keys, _ctx(keys, "again"))  # one request's access: the head ends most recent
    assert _evict_ids(policy, 4) == [3, 2, 1, 0]


def test_a_freed_parent_is_the_oldest_leaf() -> None:
    policy = PrefixLRUCachePolicy(8)
    _store_one_at_a_time(policy, [0, 1])  # 0 is older than 1, and its parent
    _store_one_at_a_time(policy, [7])  # a newer, unrelated leaf
    assert _evict_ids(policy, 1) == [1]
    _store_one_at_a_time(policy, [8])
    assert _evict_ids(policy, 1) == [0]  # older than 7 and 8, and a leaf now
    assert policy.stats()["forced_parent_evictions"] == 0


def test_pinned_tail_keeps_its_parents_until_nothing_else_is_left() -> None:
    policy = PrefixLRUCachePolicy(8)
    _store_one_at_a_time(policy, [0, 1, 2])
    _store_one_at_a_time(policy, [9])  # newest, but the only free leaf
    policy.mark_non_evictable(int_key(2))  # the tail is being loaded
    assert _evict_ids(policy, 1) == [9]
    assert policy.stats()["forced_parent_evictions"] == 0
    # Only the chain's inner blocks are left: the deepest goes first, and it is counted.
    assert _evict_ids(policy, 1) == [1]
    assert policy.stats()["forced_parent_evictions"] == 1
    assert _evict_ids(policy, 1) == [0]  # a leaf again: no longer forced
    assert policy.stats()["forced_parent_evictions"] == 1
    assert policy.evict(1, set()) is None  # only the pinned tail remains


def test_protected_tail_forces_its_parent_out_rather_than_failing() -> None:
    policy = PrefixLRUCachePolicy(4)
    _store_one_at_a_time(policy, [0, 1])
    assert _evict_ids(policy, 1, protected=[1]) == [0]
    assert policy.get(int_key(1)) is not None


def test_failed_child_store_frees_its_parent() -> None:
    policy = PrefixLRUCachePolicy(4)
    _store_one_at_a_time(policy, [0])
    keys = [int_key(0), int_key(1)]
    ctx = _ctx(keys, "next")
    policy.touch(keys, ctx)
    policy.insert(int_key(1), BlockStatus(1, -1), ctx)  # child of 0, being written
    _store_one_at_a_time(policy, [5])
    assert _evict_ids(policy, 1) == [5]  # 0 still has a cached child
    policy.remove(int_key(1))  # the write failed
    _store_one_at_a_time(policy, [6])
    assert _evict_ids(policy, 1) == [0]


def test_keys_out_of_position_order_are_not_linked() -> None:
    policy = PrefixLRUCachePolicy(4)
    keys = [int_key(0), int_key(1)]
    ctx = _ctx(keys)
    for slot, key in enumerate(reversed(keys)):  # tail first: 0 cannot be 1's child
        policy.touch([key], ctx)
        policy.insert(key, BlockStatus(slot, 0), ctx)
    assert _evict_ids(policy, 1) == [1]  # plain LRU order: nothing deferred
    assert policy.stats()["waiting_parents"] == 0


def test_each_instance_keeps_its_own_chain_in_a_shared_context() -> None:
    first, second = PrefixLRUCachePolicy(4), PrefixLRUCachePolicy(4)
    keys = [int_key(0), int_key(1)]
    ctx = _ctx(keys)
    for policy in (first, second):
        policy.touch(keys, ctx)
    for policy in (first, second):
        for slot, key in enumerate(keys):
            policy.insert(key, BlockStatus(slot, 0), ctx)
        assert _evict_ids(policy, 1) == [1]


# --------------------------------------------------------------- no orphaned tails, end to end
def _random_requests(rng: random.Random, count: int, max_depth: int) -> tuple[list, dict]:
    """Requests that walk a random prefix tree: revisit a prefix, maybe extend it."""
    parent: dict[int, int | None] = {}
    paths: list[list[int]] = []
    requests: list[list[int]] = []
    next_id = 0
    for _ in range(count):
        revisit = bool(paths) and rng.random() < 0.7
        path = list(rng.choice(paths)[: rng.randint(1, max_depth)]) if revisit else []
        for _ in range(rng.randint(0 if path else 1, 3)):
            if len(path) == max_depth:
                break
            parent[next_id] = path[-1] if path else None
            path.append(next_id)
            next_id += 1
        paths.append(path)
        requests.append(path)
    return requests, parent


def _replay_blocks_mode(manager: CPUOffloadingManager, ids: list[int], req_id: str) -> None:
    """vLLM-style per-block driving: each block looked up, loaded or stored on its own."""
    keys = [int_key(i) for i in ids]
    ctx = _ctx(keys, req_id)
    manager.on_new_request(ctx)
    for key in keys:
        if manager.lookup(key, ctx) is LookupResult.HIT:
            manager.prepare_load([key], ctx)
            manager.complete_load([key], ctx)
            continue
        out = manager.prepare_store([key], ctx)
        assert out is not None
        manager.complete_store(out.keys_to_store, ctx)
    manager.on_request_finished(ctx)


def _orphans(manager: CPUOffloadingManager, parent: dict[int, int | None]) -> list[int]:
    get = manager.policy.get
    return [
        i
        for i, p in parent.items()
        if p is not None and get(int_key(i)) is not None and get(int_key(p)) is None
    ]


@pytest.mark.parametrize("seed", range(12))
def test_no_tail_outlives_its_head_where_lru_orphans_tails(seed: int) -> None:
    rng = random.Random(seed)
    max_depth = rng.randint(3, 8)
    capacity = max_depth + 1 + rng.randint(0, 6)
    requests, parent = _random_requests(rng, 150, max_depth)
    prefix = CPUOffloadingManager(capacity, cache_policy="prefix-lru")
    lru = CPUOffloadingManager(capacity, cache_policy="lru")
    lru_orphans = 0
    for number, ids in enumerate(requests):
        _replay_blocks_mode(prefix, ids, f"req-{number}")
        _replay_blocks_mode(lru, ids, f"req-{number}")
        assert _orphans(prefix, parent) == [], f"request {number}"
        lru_orphans += len(_orphans(lru, parent))
    assert prefix.get_stats().evictions > 0
    assert lru_orphans > 0  # the scenario matters: LRU does leave tails behind here
    assert prefix.policy.stats()["forced_parent_evictions"] == 0


# ------------------------------------------------- random histories: only forced parent evictions
class _LinkModel:
    """The test's own view of stored blocks, their states and their parent links."""

    def __init__(self) -> None:
        self.state: dict[int, str] = {}  # "pending" | "ready" | "pinned"
        self.parent: dict[int, int] = {}  # live links only

    def children(self, block: int, among: set[int]) -> list[int]:
        return [c for c, p in self.parent.items() if p == block and c in among]

    def drop(self, block: int) -> None:
        del self.state[block]
        self.parent.pop(block, None)
        for child in [c for c, p in self.parent.items() if p == block]:
            del self.parent[child]


def _check_victims(model: _LinkModel, victims: list[int], protected: set[int]) -> int:
    """Each victim with a cached child must have had no free leaf to take instead."""
    remaining = set(model.state)
    forced = 0
    for victim in victims:
        assert model.state[victim] == "ready" and victim not in protected
        if model.children(victim, remaining):
            forced += 1
            free_leaves = [
                b
                for b in remaining
                if model.state[b] == "ready"
                and b not in protected
                and b not in victims
                and not model.children(b, remaining)
            ]
            assert free_leaves == [], (
                f"evicted parent {victim} while leaves {free_leaves} were free"
            )
        remaining.discard(victim)
        model.drop(victim)
    return forced


def _random_history(seed: int, steps: int = 250) -> int:
    """Drive the policy like the manager would, with pins; return forced evictions seen."""
    rng = random.Random(seed)
    capacity = rng.randint(2, 10)
    policy = PrefixLRUCachePolicy(capacity)
    model = _LinkModel()
    paths: list[list[int]] = [[]]
    next_id = 0
    forced = 0
    for step in range(steps):
        roll = rng.random()
        if roll < 0.35:  # a request: touch its whole chain, store what is missing
            path = list(rng.choice(paths))[: rng.randint(0, 6)]
            for _ in range(rng.randint(1, 3)):
                path.append(next_id)
                next_id += 1
            paths.append(path)
            keys = [int_key(i) for i in path]
            ctx = _ctx(keys, f"req-{step}")
            policy.touch(keys, ctx)
            missing = [i for i in path if i not in model.state]
            need = len(model.state) + len(missing) - capacity
            if need > 0:
                victims = policy.evict(need, set(keys))
                if victims is None:
                    continue
                ids = [int.from_bytes(k[:8], "big") for k, _ in victims]
                forced += _check_victims(model, ids, set(path))
            for i in missing:
                before = path[path.index(i) - 1] if path.index(i) > 0 else None
                policy.insert(int_key(i), BlockStatus(i, -1), ctx)
                model.state[i] = "pending"
                if before is not None and before in model.state:
                    model.parent[i] = before
        elif roll < 0.6:  # a write completes (or fails)
            pending = [b for b, s in model.state.items() if s == "pending"]
            if pending:
                block = rng.choice(pending)
                status = policy.get(int_key(block))
                assert status is not None
                if rng.random() < 0.9:
                    status.ref_cnt = 0
                    model.state[block] = "ready"
                    policy.mark_evictable(int_key(block))
                else:
                    policy.remove(int_key(block))
                    model.drop(block)
        elif roll < 0.75:  # a load pins a ready block, or the last load unpins one
            ready = [b for b, s in model.state.items() if s in ("ready", "pinned")]
            if ready:
                block = rng.choice(ready)
                status = policy.get(int_key(block))
                assert status is not None
                if model.state[block] == "ready":
                    status.ref_cnt, model.state[block] = 1, "pinned"
                    policy.mark_non_evictable(int_key(block))
                else:
                    status.ref_cnt, model.state[block] = 0, "ready"
                    policy.mark_evictable(int_key(block))
        else:  # a stray eviction with a random protected set
            protected = {b for b in model.state if rng.random() < 0.3}
            victims = policy.evict(rng.randint(1, 3), {int_key(b) for b in protected})
            if victims is not None:
                ids = [int.from_bytes(k[:8], "big") for k, _ in victims]
                forced += _check_victims(model, ids, protected)
    assert policy.stats()["forced_parent_evictions"] == forced
    return forced


def test_parents_go_before_a_cached_descendant_only_when_forced() -> None:
    forced = sum(_random_history(seed) for seed in range(40))
    assert forced > 0  # the forced branch was exercised, and every use of it was justified


# ------------------------------------------------------------------ batched calls
@pytest.mark.parametrize("capacity", [6, 40])
@pytest.mark.parametrize("params", [{}])
def test_batched_calls_decide_like_single_calls(capacity: int, params: dict[str, Any]) -> None:
    batched = manager_decisions(PrefixLRUCachePolicy(capacity, **params), capacity)
    assert batched == manager_decisions(
        one_at_a_time(PrefixLRUCachePolicy)(capacity, **params), capacity
    )
