"""The tiering manager switches its CPU tier's policy live; the holds for puts stay pinned."""

from __future__ import annotations

from tier_helpers import build, key, store

from kvoffload.context import ReqContext


def test_switch_keeps_the_block_a_put_reads_pinned() -> None:
    manager, memory, (tier,) = build(cpu_blocks=2, tier_kwargs=[{"latency_polls": 2}])
    store(manager, memory, [key(1)], ReqContext(req_id="a"))
    assert manager.get_stats().pinned_blocks == 1  # the put to the tier reads the slot
    report = manager.switch_policy("arc")
    assert (report.pinned, report.moved) == (1, 1)
    assert type(manager.cpu.policy).__name__ == "ARCCachePolicy"
    assert manager.get_stats().policy_switches == 1
    # Still pinned under the new policy: a 2-block store does not fit.
    assert manager.prepare_store([key(2), key(3)], ReqContext(req_id="b")) is None
    for _ in range(3):
        manager.step()
    assert tier.stored_keys() == {key(1)}
    assert manager.get_stats().pinned_blocks == 0
    assert manager.prepare_store([key(2), key(3)], ReqContext(req_id="c")) is not None
