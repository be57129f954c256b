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


def _filled_manager(n_stored: int, policy: str = "lru") -> CPUOffloadingManager:
    manager = CPUOffloadingManager(4, cache_policy=policy)
    ctx = ReqContext(req_id="r")
    keys = [make_offload_key(bytes([i]) * 8, 0) for i in range(n_stored)]
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    manager.lookup(keys[0], ctx)
    return manager


def test_several_managers_share_one_registry_one_series_per_tier() -> None:
    from kvoffload.metrics import register_manager_metrics

    registry = prometheus_client.CollectorRegistry()
    register_manager_metrics(_filled_manager(1, "arc"), registry, labels={"tier": "a"})
    register_manager_metrics(_filled_manager(2), registry, labels={"tier": "b"})
    text = prometheus_client.generate_latest(registry).decode()
    assert 'kvoffload_stored_blocks{tier="a"} 1.0' in text
    assert 'kvoffload_stored_blocks{tier="b"} 2.0' in text
    assert 'kvoffload_lookups_total{tier="b"} 1.0' in text
    # One family per figure: a single TYPE line, however many managers share it.
    assert text.count("# TYPE kvoffload_stored_blocks gauge") == 1
    # A policy gauge only one member has is still exported for that member.
    assert 'kvoffload_policy_t1_size{tier="a"} 1.0' in text
    assert registry.get_sample_value("kvoffload_fill_ratio", {"tier": "b"}) == 0.5


def test_clashing_label_sets_are_value_errors_and_unregister_frees_the_series() -> None:
    from kvoffload.metrics import register_manager_metrics, unregister_manager_metrics

    registry = prometheus_client.CollectorRegistry()
    first = register_manager_metrics(_filled_manager(1), registry, labels={"tier": "a"})
    with pytest.raises(ValueError, match="already registered"):
        register_manager_metrics(_filled_manager(1), registry, labels={"tier": "a"})
    with pytest.raises(ValueError, match="one label set"):
        register_manager_metrics(_filled_manager(1), registry, labels={"engine": "x"})
    with pytest.raises(TypeError, match="labels"):
        register_manager_metrics(_filled_manager(1), registry, labels={"tier": 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="label name"):
        register_manager_metrics(_filled_manager(1), registry, labels={"__tier": "c"})
    # Another prefix is another set of families on the same registry.
    register_manager_metrics(_filled_manager(3), registry, prefix="other", labels={"tier": "a"})
    assert registry.get_sample_value("other_stored_blocks", {"tier": "a"}) == 3.0

    unregister_manager_metrics(first, registry)
    assert registry.get_sample_value("kvoffload_stored_blocks", {"tier": "a"}) is None
    with pytest.raises(ValueError, match="not registered"):
        unregister_manager_metrics(first, registry)
    # With the prefix free again, a new label set may start over.
    register_manager_metrics(_filled_manager(2), registry, labels={"engine": "x"})
    assert registry.get_sample_value("kvoffload_stored_blocks", {"engine": "x"}) == 2.0


def test_one_unlabelled_manager_alone_still_works_and_a_second_needs_labels() -> None:
    from kvoffload.metrics import register_manager_metrics

    registry = prometheus_client.CollectorRegistry()
    register_manager_metrics(_filled_manager(1), registry)
    assert registry.get_sample_value("kvoffload_stored_blocks") == 1.0
    with pytest.raises(ValueError, match=r'labels=\{"tier"'):
        register_manager_metrics(_filled_manager(1), registry)
