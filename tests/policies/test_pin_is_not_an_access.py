"""A pin is not an access: every built-in decides the same through a manager's per-block loads
and stores (blocks mode, whose hits pin and unpin) as when driven alone like libCacheSim."""

from __future__ import annotations

import random

import pytest

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import CPUOffloadingManager, LookupResult
from kvoffload.policies import BUILTIN_POLICIES, CachePolicyFactory
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.testing import int_key


def _requests(seed: int) -> list[tuple[list[OffloadKey], ReqContext]]:
    """Prefix-shaped requests (shared heads, fresh tails), no key twice in one request."""
    rng = random.Random(seed)
    heads = [[int_key(1000 * h + i) for i in range(rng.randint(1, 12))] for h in range(8)]
    out = []
    fresh = 10**6
    for r in range(300):
        keys = list(rng.choice(heads)) if rng.random() < 0.7 else []
        tail = rng.randint(1, 6)
        keys += [int_key(fresh + i) for i in range(tail)]
        fresh += tail
        out.append((keys, ReqContext(req_id=f"r{r}", timestamp=float(r))))
    return out


def _through_manager(
    name: str, capacity: int, requests: list[tuple[list[OffloadKey], ReqContext]]
) -> list[bool]:
    manager = CPUOffloadingManager(capacity, cache_policy=name)
    hits = []
    for keys, ctx in requests:
        manager.on_new_request(ctx)
        for key in keys:
            result = manager.lookup(key, ctx)
            hits.append(result is LookupResult.HIT)
            if result is LookupResult.HIT:
                manager.prepare_load([key], ctx)
                manager.complete_load([key], ctx)
            elif result is LookupResult.MISS:
                out = manager.prepare_store([key], ctx)
                if out is not None and out.keys_to_store:
                    manager.complete_store(out.keys_to_store, ctx)
        manager.on_request_finished(ctx)
    return hits


def _alone(policy: CachePolicy, requests: list[tuple[list[OffloadKey], ReqContext]]) -> list[bool]:
    """The policy driven alone (libCacheSim's model): no pins, one touch per access."""
    free = list(range(policy.cache_capacity - 1, -1, -1))
    hits = []
    for keys, ctx in requests:
        for key in keys:
            status = policy.get(key)
            hits.append(status is not None)
            if status is not None or policy.touches_misses:
                policy.touch([key], ctx)
            if status is not None:
                continue
            if not free:
                victims = policy.evict(1, {key})
                if not victims:
                    continue
                free.append(victims[0][1].block_id)
            block = BlockStatus(free.pop(), -1)
            policy.insert(key, block, ctx)
            block.ref_cnt = 0
            policy.mark_evictable(key)
        policy.on_request_finished(ctx)
    return hits


@pytest.mark.parametrize("name", [row[0] for row in BUILTIN_POLICIES])
def test_blocks_mode_through_the_manager_equals_the_policy_alone(name: str) -> None:
    for seed, capacity in ((0, 8), (1, 24), (2, 60)):
        managed = _through_manager(name, capacity, _requests(seed))
        alone = _alone(CachePolicyFactory.get_cache_policy_cls(name)(capacity), _requests(seed))
        assert managed == alone, (name, capacity)
        assert 0 < sum(alone) < len(alone)
