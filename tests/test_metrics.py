from __future__ import annotations

import pytest

from kvoffload import CPUOffloadingManager, ReqContext, make_offload_key

prometheus_client = pytest.importorskip("prometheus_client")


def test_prometheus_exposition_reads_live_stats() -> None:
    from kvoffload.metrics import register_manager_metrics

    registry = prometheus_client.CollectorRegistry()
    manager = CPUOffloadingManager(4, cache_policy="arc")
    register_manager_metrics(manager, registry, labels={"tier": "cpu"})
    ctx = ReqContext(req_id="r")
    keys = [make_offload_key(bytes([i]) * 8, 0) for i in range(3)]
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    manager.lookup(keys[0], ctx)
    manager.lookup(make_offload_key(b"x" * 8, 0), ctx)
    text = prometheus_client.generate_latest(registry).decode()
    assert 'kvoffload_lookups_total{tier="cpu"} 2.0' in text
    assert 'kvoffload_misses_total{tier="cpu"} 1.0' in text
    assert 'kvoffload_fill_ratio{tier="cpu"} 0.75' in text
    assert 'kvoffload_policy_t1_size{tier="cpu"} 3.0' in text
