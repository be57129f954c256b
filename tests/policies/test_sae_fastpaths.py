"""sae's batched fast paths decide exactly like single calls, also on calls no manager makes.

``insert_many`` and ``mark_evictable_many`` take shortcuts for the usual batch (one session,
pending blocks, busy keys); the manager-driven tests cover those. Here the batches are odd on
purpose (repeated keys, stored keys, ready blocks, keys of several sessions, unknown or idle
keys, lengths that do not match) and every observable is compared after each call.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from replay_helpers import one_at_a_time

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.sae import SAECachePolicy
from kvoffload.testing import int_key


def _observe(policy: CachePolicy, universe: list[OffloadKey]) -> list[object]:
    assert isinstance(policy, SAECachePolicy)
    seen: list[object] = [sorted(policy.stats().items())]
    for key in universe:
        status = policy.get(key)
        seen.append(
            (
                None if status is None else (status.block_id, status.ref_cnt),
                policy.session_info(key),
                policy.ghost_score(key).hex(),
            )
        )
    return seen


def _drive(policy: CachePolicy, seed: int) -> list[object]:
    """Random direct calls (the same for any policy given the same seed); what they showed."""
    rng = random.Random(seed)
    universe = [int_key(i) for i in range(rng.randint(6, 40))]
    contexts = [
        ReqContext(req_id=str(i), session_id=rng.choice([None, None, "a"]), prefix_hit_blocks=i)
        for i in range(4)
    ]
    statuses: dict[OffloadKey, BlockStatus] = {}  # what the policy was given, as the manager
    log: list[object] = []
    for _ in range(120):
        roll = rng.random()
        ctx = rng.choice([*contexts, None])
        if roll < 0.25:
            policy.touch([rng.choice(universe) for _ in range(rng.randint(0, 8))], ctx)
        elif roll < 0.5:
            keys = [rng.choice(universe) for _ in range(rng.randint(0, 8))]
            blocks = [BlockStatus(rng.randrange(99), rng.choice([-1, -1, 0])) for _ in keys]
            if rng.random() < 0.05:
                blocks.append(BlockStatus(0, -1))  # a length mismatch: raises, nothing stored
            try:
                policy.insert_many(keys, blocks, ctx)
            except ValueError:
                log.append("mismatch")
            statuses.update(zip(keys, blocks, strict=False))
        elif roll < 0.75:
            stored = [k for k in universe if policy.get(k) is not None]
            keys = [rng.choice(stored or universe) for _ in range(rng.randint(0, 8))]
            if rng.random() < 0.3:
                keys.append(rng.choice(universe))  # maybe unknown, or another session's
            for key in keys:
                if policy.get(key) is not None:
                    statuses[key].ref_cnt = 0
            policy.mark_evictable_many(keys)
        elif roll < 0.82:
            key = rng.choice(universe)
            if policy.get(key) is not None and statuses[key].ref_cnt == 0:
                statuses[key].ref_cnt = 1
                policy.mark_non_evictable(key)
        elif roll < 0.86:
            policy.remove(rng.choice(universe))
        elif roll < 0.97:
            protected = {k for k in universe if rng.random() < 0.2}
            victims = policy.evict(rng.randint(0, 6), protected)
            log.append(None if victims is None else [k for k, _ in victims])
        else:
            policy.on_request_finished(rng.choice(contexts))
        log.append(_observe(policy, universe))
    return log


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"decay_interval": 3, "decay_factor": 0.5, "ghost_capacity": 4},
        {"decay_interval": 2, "decay_factor": 1e-20},  # ghost scores rescaled
        {"ghost_capacity": 0},
    ],
)
def test_odd_batches_decide_like_single_calls(params: dict[str, Any]) -> None:
    for seed in range(40):
        capacity = 1 + seed % 12
        batched = _drive(SAECachePolicy(capacity, **params), seed)
        single = _drive(one_at_a_time(SAECachePolicy)(capacity, **params), seed)
        assert batched == single, seed
