"""``switch_policy``: a live manager changes policy without dropping a block or a pin."""

from __future__ import annotations

import logging

import pytest

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies import CachePolicyFactory, create_cache_policy

NAMES = CachePolicyFactory.registered_names()
CAPACITY = 12


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def _has_table(name: str) -> bool:
    return create_cache_policy(name, 4, None, {}).block_table is not None


#: Every built-in with a block table as the source, each with three targets (rotating through
#: the list, so every built-in is a target of three sources too).
PAIRS = [
    (src, NAMES[(i + step) % len(NAMES)])
    for i, src in enumerate(NAMES)
    if _has_table(src)
    for step in (1, 5, 11)
]


def _busy_manager(policy: str) -> tuple[CPUOffloadingManager, dict[str, ReqContext]]:
    """8 blocks stored (some used twice), 2 of them pinned (one twice); 2 pending; 2 free."""
    m = CPUOffloadingManager(CAPACITY, cache_policy=policy)
    for i in range(8):
        c = ReqContext(req_id=f"s{i}")
        out = m.prepare_store([k(i)], c)
        assert out is not None
        m.complete_store(out.keys_to_store, c)
    for i in (1, 3, 5):  # a second use, so frequency-keeping policies have counts
        c = ReqContext(req_id=f"t{i}")
        m.touch([k(i)], c)
        m.on_request_finished(c)
    load_ctx = ReqContext(req_id="load")
    m.prepare_load([k(2), k(6), k(6)], load_ctx)  # k(2) pinned once, k(6) twice
    store_ctx = ReqContext(req_id="store")
    out = m.prepare_store([k(100), k(101)], store_ctx)
    assert out is not None and out.keys_to_store == [k(100), k(101)]
    return m, {"load": load_ctx, "store": store_ctx}


def _snapshot(m: CPUOffloadingManager) -> dict[OffloadKey, tuple[int, int]]:
    table = m.policy.block_table
    assert table is not None
    return {key: (s.block_id, s.ref_cnt) for key, s in table.items()}


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_switch_keeps_every_block_and_pin(source: str, target: str) -> None:
    m, ctxs = _busy_manager(source)
    before = _snapshot(m)
    stats = m.get_stats()
    report = m.switch_policy(target)
    assert type(m.policy) is type(create_cache_policy(target, 1, None, {}))
    assert (report.evictable, report.pinned, report.pending) == (6, 2, 2)
    after = m.get_stats()
    for name in ("stored_blocks", "pinned_blocks", "pending_blocks", "evictable_blocks"):
        assert getattr(after, name) == getattr(stats, name), name
    assert after.policy_switches == 1
    for key, (slot, ref_cnt) in before.items():
        status = m.policy.get(key)
        assert status is not None, f"{key!r} was dropped"
        assert (status.block_id, status.ref_cnt) == (slot, ref_cnt)
    assert m._ledger.get(k(0)) is m.policy.get(k(0))  # the hot path reads the new policy
    assert m.lookup(k(100)) is LookupResult.HIT_PENDING

    # The next evictions take only the 6 ready, unpinned blocks, never a pinned or pending one.
    protected = {k(2), k(6), k(100), k(101)}
    c = ReqContext(req_id="fill")
    out = m.prepare_store([k(200 + i) for i in range(8)], c)
    assert out is not None, "the new policy refused to evict its ready blocks"
    assert set(out.evicted_keys) == set(before) - protected
    m.complete_store(out.keys_to_store, c)
    c2 = ReqContext(req_id="refused")
    assert m.prepare_store([k(300 + i) for i in range(9)], c2) is None  # 8 evictable
    # Completions of the jobs started before the switch reach the new policy.
    m.complete_store([k(100), k(101)], ctxs["store"])
    m.complete_load([k(2), k(6), k(6)], ctxs["load"])
    final = m.get_stats()
    assert (final.pinned_blocks, final.pending_blocks, final.evictable_blocks) == (0, 0, 12)
    c3 = ReqContext(req_id="after")
    out = m.prepare_store([k(400 + i) for i in range(12)], c3)
    assert out is not None and set(out.evicted_keys) >= protected


def test_switch_moves_blocks_in_the_old_eviction_order() -> None:
    m = CPUOffloadingManager(6, cache_policy="lru")
    for i in range(6):
        c = ReqContext(req_id=f"s{i}")
        out = m.prepare_store([k(i)], c)
        assert out is not None
        m.complete_store(out.keys_to_store, c)
    for i in (4, 0, 2):  # LRU order now: 1 3 5 4 0 2
        m.touch([k(i)], ReqContext(req_id=f"t{i}"))
    m.switch_policy("fifo")
    victims = []
    for i in range(6):
        c = ReqContext(req_id=f"n{i}")
        out = m.prepare_store([k(50 + i)], c)
        assert out is not None
        m.complete_store(out.keys_to_store, c)
        victims.extend(out.evicted_keys)
    assert victims == [k(i) for i in (1, 3, 5, 4, 0, 2)]


def test_switch_passes_params_logs_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    m, _ = _busy_manager("lru")
    with caplog.at_level(logging.INFO, logger="kvoffload.manager.cpu"):
        m.switch_policy("mq", lifetime=7)
        m.switch_policy("arc")
    assert m.get_stats().policy_switches == 2
    assert m.get_stats().as_dict()["policy_switches"] == 2
    lines = [r.getMessage() for r in caplog.records if "switched policy" in r.getMessage()]
    assert len(lines) == 2 and "MQCachePolicy" in lines[0] and "ARCCachePolicy" in lines[1]


def test_switch_to_an_instance_and_bad_arguments_change_nothing() -> None:
    m, _ = _busy_manager("lru")
    before = _snapshot(m)
    policy = m.policy
    with pytest.raises(ValueError, match="known"):
        m.switch_policy("no-such-policy")
    with pytest.raises(TypeError, match="cache_policy"):
        m.switch_policy(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="current policy"):
        m.switch_policy(policy)
    with pytest.raises(ValueError, match="fewer than"):
        m.switch_policy(create_cache_policy("lru", 5, None, {}))
    with pytest.raises(ValueError, match="params"):
        m.switch_policy(create_cache_policy("lru", CAPACITY, None, {}), capacity=3)
    assert m.policy is policy and _snapshot(m) == before
    assert m.get_stats().policy_switches == 0
    fresh = create_cache_policy("s3fifo", CAPACITY, None, {})
    m.switch_policy(fresh)
    assert m.policy is fresh and _snapshot(m) == before


def test_switch_after_shutdown_raises() -> None:
    m = CPUOffloadingManager(4)
    m.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        m.switch_policy("arc")


def test_a_thread_safe_manager_switches_under_its_lock() -> None:
    import threading

    m = CPUOffloadingManager(8, cache_policy="lru", thread_safe=True)
    done = threading.Event()

    def switch() -> None:
        m.switch_policy("arc")
        done.set()

    with m._lock:  # another call in progress
        worker = threading.Thread(target=switch)
        worker.start()
        assert not done.wait(0.2), "switch_policy ran while another call held the lock"
        assert type(m.policy).__name__ == "LRUCachePolicy"
    worker.join(5)
    assert done.is_set() and type(m.policy).__name__ == "ARCCachePolicy"


def test_the_moves_run_on_the_requests_clock() -> None:
    """A policy that keeps time by ``ctx.timestamp`` (kvaware) sees the moves at the latest
    request's time; without a timestamp it would tick once per moved block and run ahead
    (at 10% of the shared trace that cost a switch to kvaware 37% of its later hits)."""
    from kvoffload.policies.lru import LRUCachePolicy

    seen: list[float | None] = []

    class Recording(LRUCachePolicy):
        def insert(
            self, key: OffloadKey, block: object, req_context: ReqContext | None = None
        ) -> None:
            seen.append(None if req_context is None else req_context.timestamp)
            super().insert(key, block, req_context)  # type: ignore[arg-type]

    m = CPUOffloadingManager(8)
    for i, stamp in enumerate((10.0, 12.5, 11.0)):
        c = ReqContext(req_id=f"r{i}", timestamp=stamp)
        out = m.prepare_store([k(i)], c)
        assert out is not None
        m.complete_store(out.keys_to_store, c)
    m.switch_policy(Recording(8))
    assert seen == [11.0, 11.0, 11.0]  # the latest request's time, for every moved block
    seen.clear()
    m.switch_policy(Recording(8), req_context=ReqContext(req_id="x", timestamp=99.0))
    assert seen == [99.0, 99.0, 99.0]
