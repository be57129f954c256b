"""Tiering managers on one Prometheus registry: per-tier series, live values, clashes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from tier_helpers import SLOT, build, key, store  # noqa: E402

from kvoffload.context import ReqContext  # noqa: E402
from kvoffload.manager import CPUOffloadingManager  # noqa: E402
from kvoffload.metrics import (  # noqa: E402
    register_tiering_metrics,
    unregister_tiering_metrics,
)
from kvoffload.tiers import BytearraySlotMemory  # noqa: E402
from kvoffload.tiers.disk.records import STAMP_BYTES  # noqa: E402
from kvoffload.tiers.disk.tier import DiskTier  # noqa: E402
from kvoffload.tiers.manager import SecondaryTier, TieringManager  # noqa: E402


def _value(registry: object, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)  # type: ignore[attr-defined, no-any-return]


def test_two_engines_with_several_tiers_share_one_registry() -> None:
    registry = prometheus_client.CollectorRegistry()
    specs = [{}, {"write_policy": "none"}]
    a, _, _ = build(cpu_blocks=4, tier_blocks=(16, 16), specs=specs)
    b, _, _ = build(cpu_blocks=4, tier_blocks=(16,))
    register_tiering_metrics(a, registry, labels={"engine": "a"})
    register_tiering_metrics(b, registry, labels={"engine": "b"})
    ctx = ReqContext(req_id="r")
    keys = [key(i) for i in range(3)]
    store(a, a.memory, keys, ctx)  # type: ignore[arg-type]
    a.step()
    a.step()
    a.reset_cache()  # the CPU forgets; t0 keeps them
    a.lookup_prefix(keys, ctx)  # promotes all three from t0
    for _ in range(3):
        a.step()
    text = prometheus_client.generate_latest(registry).decode()
    # One family, one TYPE line, a series per (engine, tier).
    assert text.count("# TYPE kvoffload_tier_write_bytes_total counter") == 1
    assert _value(registry, "kvoffload_tier_write_bytes_total", engine="a", tier="t0") == 3 * SLOT
    assert _value(registry, "kvoffload_tier_blocks_written_total", engine="a", tier="t1") == 0
    assert _value(registry, "kvoffload_tier_write_bytes_total", engine="b", tier="t0") == 0
    assert _value(registry, "kvoffload_tier_hits_total", engine="a", tier="t0") == 3
    assert _value(registry, "kvoffload_tier_promotions_total", engine="a", tier="t0") == 3
    assert _value(registry, "kvoffload_tier_read_bytes_total", engine="a", tier="t0") == 3 * SLOT
    assert _value(registry, "kvoffload_tier_used_bytes", engine="a", tier="t0") == 3 * SLOT
    assert _value(registry, "kvoffload_tier_capacity_bytes", engine="a", tier="t1") == 16 * SLOT
    assert _value(registry, "kvoffload_tier_breaker_state", engine="a", tier="t0") == 0
    assert _value(registry, "kvoffload_tier_healthy", engine="a", tier="t0") == 1
    assert _value(registry, "kvoffload_tiering_resets_total", engine="a") == 1
    # The CPU tier is in the manager families with tier="cpu".
    assert _value(registry, "kvoffload_stored_blocks", engine="a", tier="cpu") == 3
    assert _value(registry, "kvoffload_stored_blocks", engine="b", tier="cpu") == 0


def test_drops_by_reason_breaker_state_and_evictions() -> None:
    registry = prometheus_client.CollectorRegistry()
    manager, memory, (tier,) = build(
        cpu_blocks=4, tier_blocks=(2,), specs=[{"breaker_threshold": 1, "breaker_backoff_s": 60}]
    )
    register_tiering_metrics(manager, registry)
    ctx = ReqContext(req_id="r")
    for batch in ([key(0), key(1)], [key(2)]):  # a 2-block tier must evict one
        store(manager, memory, batch, ctx)
        for _ in range(3):
            manager.step()
    assert _value(registry, "kvoffload_tier_evictions_total", tier="t0") == 1
    tier.fail_all = "io_error"
    store(manager, memory, [key(3)], ctx)
    for _ in range(3):
        manager.step()
    assert _value(registry, "kvoffload_tier_breaker_state", tier="t0") == 2  # open
    assert _value(registry, "kvoffload_tier_breaker_trips_total", tier="t0") == 1
    assert (
        _value(registry, "kvoffload_tier_dropped_blocks_total", tier="t0", reason="failed_io_error")
        == 1
    )
    store(manager, memory, [key(4)], ctx)  # the breaker is open: the store is dropped
    assert (
        _value(registry, "kvoffload_tier_dropped_blocks_total", tier="t0", reason="breaker_open")
        == 1
    )


def test_a_disk_tiers_corrupt_records_are_counted(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(SLOT, 4)
    disk = DiskTier(memory, tmp_path, 64 * (SLOT + 256))
    manager = TieringManager(CPUOffloadingManager(4), memory, [SecondaryTier(disk)])
    registry = prometheus_client.CollectorRegistry()
    register_tiering_metrics(manager, registry, labels={"engine": "0"})
    ctx = ReqContext(req_id="r")
    store(manager, memory, [key(0)], ctx)
    disk.drain(5.0)
    manager.step()
    manager.shutdown()
    assert _value(registry, "kvoffload_tier_write_bytes_total", engine="0", tier="disk") == SLOT
    used = _value(registry, "kvoffload_tier_used_bytes", engine="0", tier="disk")
    assert used is not None and used >= SLOT
    # Flip one payload byte of every file on disk, then reopen: the record is dropped, counted.
    for root, _, files in os.walk(tmp_path):
        for name in files:
            path = Path(root) / name
            data = bytearray(path.read_bytes())
            if len(data) >= SLOT:
                data[-1 - STAMP_BYTES] ^= 0xFF  # the payload's last byte, before the stamp
                path.write_bytes(bytes(data))
    memory2 = BytearraySlotMemory(SLOT, 4)
    disk2 = DiskTier(memory2, tmp_path, 64 * (SLOT + 256), verify_on_scan=True)
    manager2 = TieringManager(CPUOffloadingManager(4), memory2, [SecondaryTier(disk2)])
    registry2 = prometheus_client.CollectorRegistry()
    register_tiering_metrics(manager2, registry2)
    assert _value(registry2, "kvoffload_tier_corrupt_records_total", tier="disk") == 1
    manager2.shutdown()


def test_clashes_are_value_errors_and_unregister_frees_the_names() -> None:
    registry = prometheus_client.CollectorRegistry()
    manager, _, _ = build()
    collectors = register_tiering_metrics(manager, registry, labels={"engine": "a"})
    with pytest.raises(ValueError, match="already registered"):
        register_tiering_metrics(manager, registry, labels={"engine": "a"})
    with pytest.raises(ValueError, match="'tier'"):
        register_tiering_metrics(manager, registry, labels={"tier": "x"})
    unregister_tiering_metrics(collectors, registry)
    assert _value(registry, "kvoffload_tier_lookups_total", engine="a", tier="t0") is None
    register_tiering_metrics(manager, registry)  # a new label set once the old one is gone
    assert _value(registry, "kvoffload_tier_lookups_total", tier="t0") == 0


def test_benefit_and_latency_histograms_are_exported_per_tier() -> None:
    from kvoffload.metrics import register_tiering_metrics

    registry = prometheus_client.CollectorRegistry()
    manager, memory, (_tier,) = build(cpu_blocks=2, block_tokens=16, prefill_tokens_per_s=1000.0)
    register_tiering_metrics(manager, registry)
    ctx = ReqContext(req_id="a", prompt_tokens=33)
    store(manager, memory, [key(1), key(2)], ctx)
    manager.step()
    manager.reset_cache()  # the blocks are in the tier only now
    manager.step()
    ctx = ReqContext(req_id="b", prompt_tokens=33)
    manager.lookup_prefix([key(1), key(2)], ctx)
    manager.step()
    manager.observe_cpu_load(2, 2 * SLOT, 0.002)
    text = prometheus_client.generate_latest(registry).decode()
    for kind in ("lookup", "load", "promotion", "store"):
        assert f"# TYPE kvoffload_tier_{kind}_latency_seconds histogram" in text
    assert 'kvoffload_tier_load_latency_seconds_bucket{le="0.0001",tier="t0"}' in text
    assert 'kvoffload_tier_load_latency_seconds_bucket{le="10.0",tier="t0"}' in text
    assert (
        registry.get_sample_value("kvoffload_tier_load_latency_seconds_count", {"tier": "t0"}) == 1
    )
    assert (
        registry.get_sample_value("kvoffload_tier_store_latency_seconds_count", {"tier": "t0"}) >= 1
    )
    assert (
        registry.get_sample_value("kvoffload_tier_load_latency_seconds_count", {"tier": "cpu"}) == 1
    )
    served = registry.get_sample_value("kvoffload_tier_tokens_served_total", {"tier": "t0"})
    assert served == 32
    saved = registry.get_sample_value("kvoffload_tier_prefill_seconds_saved_total", {"tier": "t0"})
    assert saved == pytest.approx(32 / 1000.0)
    assert registry.get_sample_value("kvoffload_tier_tokens_served_total", {"tier": "cpu"}) == 32
    assert registry.get_sample_value("kvoffload_tiering_decide") == 1


def test_a_tier_that_says_it_cannot_serve_reads_unhealthy() -> None:
    """``Tier.health()`` is exported: a tier failing every key reads 0 before any job fails."""
    registry = prometheus_client.CollectorRegistry()
    manager, _, tiers = build(cpu_blocks=4, tier_blocks=(16, 16))
    register_tiering_metrics(manager, registry, labels={"engine": "h"})
    tiers[1].fail_all = "io_error"
    assert _value(registry, "kvoffload_tier_healthy", engine="h", tier="t0") == 1
    assert _value(registry, "kvoffload_tier_healthy", engine="h", tier="t1") == 0
    assert _value(registry, "kvoffload_tier_breaker_state", engine="h", tier="t1") == 0
    tiers[1].fail_all = None
    assert _value(registry, "kvoffload_tier_healthy", engine="h", tier="t1") == 1
