"""Warm restarts: a policy's state exported and restored mid-replay changes no decision."""

from __future__ import annotations

import json
from functools import lru_cache

import pytest

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies import BUILTIN_POLICIES, BlockStatus, CachePolicy, create_cache_policy
from kvoffload.policies.state import (
    FORMAT,
    export_policy_state,
    restore_policy_state,
    settle_restored,
)
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import make_context
from kvoffload.sim.workloads import WorkloadConfig, generate_workload
from kvoffload.testing.drive import int_key


@lru_cache(maxsize=1)
def _trace() -> Trace:
    return generate_workload(WorkloadConfig(seed=7, requests=240))


class _Driver:
    """Block-at-a-time accesses with request contexts; owns the slots (the manager's part)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.next_slot = 0
        self.free: list[BlockStatus] = []
        self.hits = 0

    def request(self, policy: CachePolicy, keys: list[OffloadKey], ctx: ReqContext) -> None:
        for key in dict.fromkeys(keys):
            one = [key]
            if policy.get(key) is not None:
                self.hits += 1
                policy.touch(one, ctx)
                continue
            policy.touch(one, ctx)
            if self.next_slot < self.capacity:
                status = BlockStatus(self.next_slot, -1)
                self.next_slot += 1
            else:
                victims = policy.evict(1, one)
                assert victims is not None
                status = victims[0][1]
                status.ref_cnt = -1
            policy.insert(key, status, ctx)
            status.ref_cnt = 0
            policy.mark_evictable(key)


def _replay(name: str, split: bool) -> int:
    trace = _trace()
    capacity = max(8, trace.num_unique_blocks // 20)
    policy = create_cache_policy(name, capacity)
    driver = _Driver(capacity)
    half = len(trace.requests) // 2
    for i, request in enumerate(trace.requests):
        if split and i == half:
            policy = restore_policy_state(export_policy_state(policy))
        keys = [int_key(b) for b in request.block_ids]
        ctx = make_context(request, keys, trace.block_tokens)
        driver.request(policy, keys, ctx)
        ctx.output_tokens = request.output_tokens
        policy.on_request_finished(ctx)
    return driver.hits


@pytest.mark.parametrize("name", [row[0] for row in BUILTIN_POLICIES])
def test_split_replay_with_restore_gives_the_same_hits(name: str) -> None:
    whole = _replay(name, split=False)
    assert whole > 0
    assert _replay(name, split=True) == whole


def test_restored_policy_is_a_fresh_object_with_equal_decisions() -> None:
    policy = create_cache_policy("arc", 4)
    statuses = [BlockStatus(i, 0) for i in range(4)]
    for i, status in enumerate(statuses):
        policy.insert(int_key(i), status)
    policy.touch([int_key(0)])
    copy = restore_policy_state(export_policy_state(policy))
    assert copy is not policy and type(copy) is type(policy)
    assert copy.get(int_key(0)) is not statuses[0]
    assert [k for k, _ in copy.evict(3, ()) or []] == [k for k, _ in policy.evict(3, ()) or []]


def _doc(policy: CachePolicy) -> dict[str, object]:
    return json.loads(export_policy_state(policy))  # type: ignore[no-any-return]


def test_a_class_outside_the_trusted_modules_is_refused_before_import() -> None:
    doc = _doc(create_cache_policy("lru", 2))
    doc["objects"][0]["o"] = "os:system"  # type: ignore[index]
    with pytest.raises(ValueError, match="outside the trusted modules"):
        restore_policy_state(json.dumps(doc))


def test_wrong_format_version_and_garbage_are_value_errors() -> None:
    doc = _doc(create_cache_policy("lru", 2))
    assert doc["format"] == FORMAT
    with pytest.raises(ValueError, match="version"):
        restore_policy_state(json.dumps({**doc, "version": 99}))
    with pytest.raises(ValueError, match="format"):
        restore_policy_state(json.dumps({**doc, "format": "pickle"}))
    with pytest.raises(ValueError, match="not JSON"):
        restore_policy_state(b"\x80\x04")
    with pytest.raises(TypeError):
        restore_policy_state(123)  # type: ignore[arg-type]


def test_settle_restored_drops_pending_and_unpins_loaded() -> None:
    policy = create_cache_policy("lru", 3)
    policy.insert(int_key(0), BlockStatus(0, -1))
    policy.insert(int_key(1), BlockStatus(1, 0))
    policy.mark_evictable(int_key(1))
    pinned = BlockStatus(2, 0)
    policy.insert(int_key(2), pinned)
    policy.mark_evictable(int_key(2))
    pinned.ref_cnt = 2
    policy.mark_non_evictable(int_key(2))
    restored = restore_policy_state(export_policy_state(policy))
    assert settle_restored(restored) == 1
    assert restored.get(int_key(0)) is None
    victims = restored.evict(2, ())
    assert victims is not None and {k for k, _ in victims} == {int_key(1), int_key(2)}


def test_a_logged_context_keeps_its_hints_and_drops_its_request_state() -> None:
    policy = create_cache_policy("auto", 64)
    ctx = ReqContext(req_id="r1", timestamp=5.0, kv_transfer_params={"engine": "x"})
    ctx.set_state(object())  # the live request's state: not the policy's to save
    policy.touch([int_key(1)], ctx)
    data = export_policy_state(policy)
    restored = restore_policy_state(data)
    [(keys, copy)] = [entry for entry in restored._log if entry[1] is not None]  # type: ignore[attr-defined]
    assert keys == (int_key(1),) and copy.req_id == "r1" and copy.timestamp == 5.0
    assert copy.kv_transfer_params is None and copy.get_state(object) is None
    doc = json.loads(data)
    for entry in doc["objects"]:
        if entry.get("o") == "kvoffload.context:ReqContext":
            entry["a"]["_state"] = None
    with pytest.raises(ValueError, match="may not carry _state"):
        restore_policy_state(json.dumps(doc))


def test_a_state_saved_before_selection_moved_restores() -> None:
    """``auto`` and its shadows moved from ``kvoffload.policies`` to ``kvoffload.selection``:
    a state that names the old modules restores to the same decisions."""
    policy = create_cache_policy("auto", 64)
    keys = [int_key(i) for i in range(80)]
    for key in keys:
        policy.touch([key])
        if policy.get(key) is None:
            victims = policy.evict(1, ()) if len(policy.block_table or ()) >= 64 else []
            status = victims[0][1] if victims else BlockStatus(len(policy.block_table or ()))
            status.ref_cnt = -1
            policy.insert(key, status)
            status.ref_cnt = 0
            policy.mark_evictable(key)
    data = export_policy_state(policy).decode()
    assert '"kvoffload.selection.auto:AutoCachePolicy"' in data
    assert '"kvoffload.selection.shadow:' in data
    old = data.replace('"kvoffload.selection.', '"kvoffload.policies.')
    restored = restore_policy_state(old)
    assert type(restored) is type(policy)
    assert [k for k, _ in restored.evict(5, ()) or []] == [k for k, _ in policy.evict(5, ()) or []]
