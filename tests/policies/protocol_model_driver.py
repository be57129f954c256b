"""Drive a policy and a step-by-step reference model with the same random protocol history.

The history follows the manager's protocol (:mod:`kvoffload.policies.base`): stores touch
their keys, make room with ``evict(need, protected)`` and insert pending blocks; writes
complete or fail; loads pin and unpin ready blocks; hits touch stored blocks (pending and
pinned ones included); stray evictions come with random protected sets. Every eviction's
victims (or ``None``) must be identical, in order, for the policy and the model.

A model is a plain object with the methods of :class:`ReferenceModel`; it sees keys as ints.
"""

from __future__ import annotations

import random
from typing import Protocol

from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.testing import int_key


class ReferenceModel(Protocol):
    def touch(self, block_id: int) -> None: ...
    def insert(self, block_id: int) -> None: ...  # pending (being written)
    def complete(self, block_id: int) -> None: ...  # the write finished: evictable
    def remove(self, block_id: int) -> None: ...  # the write failed
    def pin(self, block_id: int) -> None: ...  # ref_cnt 0 -> 1
    def unpin(self, block_id: int) -> None: ...  # ref_cnt 1 -> 0
    def evict(self, n: int, protected: set[int]) -> list[int] | None: ...


def _block_id(key: bytes) -> int:
    return int.from_bytes(key[:8], "big", signed=True)


def run_against_model(
    policy: CachePolicy, model: ReferenceModel, seed: int, steps: int = 400
) -> int:
    """Replay one random history into both; return how many evictions were compared."""
    rng = random.Random(seed)
    capacity = policy.cache_capacity
    status: dict[int, BlockStatus] = {}
    evicted: list[int] = []
    next_id = 0
    compared = 0

    def evict(n: int, protected: set[int], step: int) -> list[int] | None:
        nonlocal compared
        got = policy.evict(n, {int_key(i) for i in protected})
        ours = None if got is None else [_block_id(key) for key, _ in got]
        expected = model.evict(n, protected)
        assert ours == expected, f"seed={seed} step={step}: evict({n}) {ours} != {expected}"
        compared += 1
        for block_id in ours or []:
            del status[block_id]
            evicted.append(block_id)
        return ours

    for step in range(steps):
        roll = rng.random()
        stored = list(status)
        if roll < 0.35:  # store 1-3 blocks, some of them recently evicted (ghost hits)
            keys: list[int] = []
            for _ in range(rng.randint(1, max(1, min(3, capacity)))):
                if evicted and rng.random() < 0.4:
                    block_id = evicted.pop(rng.randrange(len(evicted)))
                else:
                    block_id, next_id = next_id, next_id + 1
                if block_id not in status and block_id not in keys:
                    keys.append(block_id)
            policy.touch([int_key(i) for i in keys])
            for block_id in reversed(keys):
                model.touch(block_id)
            protected = set(keys) | set(rng.sample(stored, min(len(stored), rng.randint(0, 2))))
            need = len(status) + len(keys) - capacity
            if need > 0 and evict(need, protected, step) is None:
                continue
            for block_id in keys:
                status[block_id] = BlockStatus(block_id, -1)
                policy.insert(int_key(block_id), status[block_id])
                model.insert(block_id)
        elif roll < 0.55:  # a write completes (or fails)
            pending = [i for i in stored if status[i].ref_cnt == -1]
            if pending:
                block_id = rng.choice(pending)
                if rng.random() < 0.85:
                    status[block_id].ref_cnt = 0
                    policy.mark_evictable(int_key(block_id))
                    model.complete(block_id)
                else:
                    del status[block_id]
                    policy.remove(int_key(block_id))
                    model.remove(block_id)
        elif roll < 0.70:  # a request hits 1-3 stored blocks
            if stored:
                hit = rng.sample(stored, rng.randint(1, min(3, len(stored))))
                policy.touch([int_key(i) for i in hit])
                for block_id in reversed(hit):
                    model.touch(block_id)
        elif roll < 0.78:  # a load starts
            ready = [i for i in stored if status[i].ref_cnt >= 0]
            if ready:
                block_id = rng.choice(ready)
                status[block_id].ref_cnt += 1
                if status[block_id].ref_cnt == 1:
                    policy.mark_non_evictable(int_key(block_id))
                    model.pin(block_id)
        elif roll < 0.88:  # a load ends
            pinned = [i for i in stored if status[i].ref_cnt > 0]
            if pinned:
                block_id = rng.choice(pinned)
                status[block_id].ref_cnt -= 1
                if status[block_id].ref_cnt == 0:
                    policy.mark_evictable(int_key(block_id))
                    model.unpin(block_id)
        else:  # a stray eviction, possibly impossible
            protected = set(rng.sample(stored, rng.randint(0, len(stored) // 2)))
            evict(rng.randint(0, 3), protected, step)
        if len(evicted) > 4 * capacity + 8:
            del evicted[0]
    return compared
