"""``sim.drive.access_blocks`` equals the per-key public call sequence, for every built-in policy.

Two managers see the same traffic: one through ``access_blocks``, one through ``lookup`` then
``prepare_load`` + ``complete_load`` (HIT) or ``prepare_store`` + ``complete_store`` (MISS),
written out here. Other requests keep blocks pinned or pending meanwhile, so the HIT_PENDING,
shared-pin and no-room paths run too. After every step the results, every counter and gauge,
and each stored key's slot and state must be equal.
"""

from __future__ import annotations

import random

import pytest

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import BlockAccesses
from kvoffload.policies import BUILTIN_POLICIES
from kvoffload.sim.drive import access_blocks
from kvoffload.testing.drive import int_key

POLICIES = [row[0] for row in BUILTIN_POLICIES]


def access_by_calls(
    m: CPUOffloadingManager, keys: list[OffloadKey], ctx: ReqContext
) -> BlockAccesses:
    results = []
    stored = evicted = failed = 0
    for key in keys:
        result = m.lookup(key, ctx)
        results.append(result)
        if result is LookupResult.HIT:
            m.prepare_load([key], ctx)
            m.complete_load([key], ctx)
        elif result is LookupResult.MISS:
            out = m.prepare_store([key], ctx)
            if out is None:
                failed += 1
            elif out.keys_to_store:
                m.complete_store(out.keys_to_store, ctx)
                stored += 1
                evicted += len(out.evicted_keys)
    return BlockAccesses(results, stored, evicted, failed)


def snapshot(m: CPUOffloadingManager, pool: list[OffloadKey]) -> tuple[object, ...]:
    stats = m.get_stats().as_dict()
    blocks = []
    for key in pool:
        status = m.policy.get(key)
        blocks.append(None if status is None else (status.block_id, status.ref_cnt))
    return tuple(sorted(stats.items())), tuple(blocks)


def context(n: int, keys: list[OffloadKey]) -> ReqContext:
    ctx = ReqContext(req_id=f"r{n}", session_id=f"s{n % 3}", priority=n % 4, num_blocks=len(keys))
    ctx.set_key_positions(keys, 16)
    ctx.prefix_hit_blocks = n % 3
    return ctx


def drive(policy: str, seed: int, **manager_kwargs: object) -> None:
    rng = random.Random(seed)
    pool = [int_key(i) for i in range(40)]
    capacity = rng.randint(1, 12)
    fast = CPUOffloadingManager(capacity, cache_policy=policy, **manager_kwargs)  # type: ignore[arg-type]
    slow = CPUOffloadingManager(capacity, cache_policy=policy, **manager_kwargs)  # type: ignore[arg-type]
    held: list[tuple[str, list[OffloadKey], ReqContext, ReqContext]] = []
    for n in range(120):
        roll = rng.random()
        if roll < 0.15 and held:  # finish another request's load or store
            kind, keys, ctx_fast, ctx_slow = held.pop(rng.randrange(len(held)))
            if kind == "load":
                fast.complete_load(keys, ctx_fast)
                slow.complete_load(keys, ctx_slow)
            else:
                ok = rng.random() < 0.8
                fast.complete_store(keys, ctx_fast, success=ok)
                slow.complete_store(keys, ctx_slow, success=ok)
        elif roll < 0.3:  # another request pins or starts writing blocks
            keys = rng.sample(pool, rng.randint(1, 3))
            ctx_fast, ctx_slow = context(n, keys), context(n, keys)
            ready = [k for k in keys if fast.lookup(k) is LookupResult.HIT]
            assert ready == [k for k in keys if slow.lookup(k) is LookupResult.HIT]
            if ready and rng.random() < 0.5:
                fast.prepare_load(ready, ctx_fast)
                slow.prepare_load(ready, ctx_slow)
                held.append(("load", ready, ctx_fast, ctx_slow))
            else:
                out_fast = fast.prepare_store(keys, ctx_fast)
                out_slow = slow.prepare_store(keys, ctx_slow)
                assert (out_fast is None) == (out_slow is None)
                if out_fast is not None and out_slow is not None:
                    assert out_fast.keys_to_store == out_slow.keys_to_store
                    if out_fast.keys_to_store:
                        held.append(("store", out_fast.keys_to_store, ctx_fast, ctx_slow))
        else:  # the request under test: each key an independent access
            keys = rng.sample(pool, rng.randint(1, 8))
            if rng.random() < 0.2:
                keys.append(keys[0])  # a repeat within the request
            ctx_fast, ctx_slow = context(n, keys), context(n, keys)
            fast.on_new_request(ctx_fast)
            slow.on_new_request(ctx_slow)
            got = access_blocks(fast, keys, ctx_fast)
            want = access_by_calls(slow, keys, ctx_slow)
            assert got == want, f"step {n}"
            fast.on_request_finished(ctx_fast)
            slow.on_request_finished(ctx_slow)
        assert snapshot(fast, pool) == snapshot(slow, pool), f"step {n}"


@pytest.mark.parametrize("policy", POLICIES)
def test_access_blocks_equals_per_key_calls(policy: str) -> None:
    for seed in range(24):
        drive(policy, seed)


@pytest.mark.parametrize("policy", ["lru", "arc", "kvaware"])
def test_access_blocks_with_admission_and_events(policy: str) -> None:
    for seed in range(4):
        drive(policy, seed, store_threshold=2, enable_events=True)


def test_access_blocks_reports_what_it_did() -> None:
    m = CPUOffloadingManager(2)
    ctx = ReqContext(req_id="r")
    a, b, c = int_key(1), int_key(2), int_key(3)
    out = access_blocks(m, [a, b, a, c], ctx)
    assert out.results == [
        LookupResult.MISS,
        LookupResult.MISS,
        LookupResult.HIT,
        LookupResult.MISS,
    ]
    assert (out.stored, out.evicted, out.failed) == (3, 1, 0)
    stats = m.get_stats()
    assert (stats.lookups, stats.hits, stats.loads, stats.stores_completed) == (4, 1, 1, 3)
    assert m.lookup(b) is LookupResult.MISS  # a's hit made b the least recent


def test_access_blocks_needs_the_request_context() -> None:
    m = CPUOffloadingManager(2)
    with pytest.raises(ValueError, match="ReqContext"):
        access_blocks(m, [int_key(1)], None)  # type: ignore[arg-type]
    assert m.get_stats().lookups == 0
