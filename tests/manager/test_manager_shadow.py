"""Shadow policies on a live manager: estimates fed by the key stream, in stats and metrics."""

from __future__ import annotations

import random

import pytest

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.sim.drive import access_blocks


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def _stream(n: int, seed: int = 7) -> list[int]:
    """A skewed stream with a drifting hot set (so LRU and ARC differ)."""
    rng = random.Random(seed)
    out = []
    for t in range(n):
        if rng.random() < 0.6:
            out.append(rng.randrange(40) + (t // 800) * 10)
        else:
            out.append(1000 + rng.randrange(400))
    return out


def _replay(m: CPUOffloadingManager, ids: list[int]) -> int:
    """One request per access (the miniatures' protocol); the number of hits."""
    hits = 0
    for n, i in enumerate(ids):
        ctx = ReqContext(req_id=f"r{n}")
        m.on_new_request(ctx)
        hits += access_blocks(m, [k(i)], ctx).results.count(LookupResult.HIT)
        m.on_request_finished(ctx)
    return hits


@pytest.mark.parametrize("live", ["lru", "arc"])  # lru skips misses' touches; arc does not
def test_full_rate_shadows_reproduce_each_candidate_exactly(live: str) -> None:
    ids = _stream(4000)
    m = CPUOffloadingManager(
        64,
        cache_policy=live,
        shadow_policies="lru,arc,s3fifo",
        shadow_sample_rate=1.0,
        shadow_min_blocks=0,
    )
    _replay(m, ids)
    gauges = m.get_stats().policy
    assert gauges["shadow_rate"] == 1.0 and gauges["shadow_accesses"] == len(ids)
    for name in ("lru", "arc", "s3fifo"):
        alone = CPUOffloadingManager(64, cache_policy=name)
        expected = _replay(alone, ids) / len(ids)
        assert gauges[f"shadow_{name}_hit_ratio"] == pytest.approx(expected, abs=1e-12), name
    assert gauges["shadow_lru_hit_ratio"] != gauges["shadow_arc_hit_ratio"]


def test_sampled_shadows_see_a_share_of_the_keys_and_survive_a_switch() -> None:
    ids = _stream(6000)
    m = CPUOffloadingManager(
        400,
        shadow_policies=["lru", ("mq", {"lifetime": 5000})],
        shadow_sample_rate=0.25,
        shadow_min_blocks=0,
    )
    _replay(m, ids[:3000])
    first = m.get_stats().policy["shadow_accesses"]
    assert 0.15 * 3000 < first < 0.35 * 3000
    m.switch_policy("arc")
    _replay(m, ids[3000:])
    gauges = m.get_stats().policy
    assert gauges["shadow_accesses"] > first
    assert "shadow_mq(lifetime=5000)_hit_ratio" in gauges
    assert m.shadows is not None and m.shadows.rate == 0.25


def test_without_shadows_no_shadow_gauges_and_bad_options_fail() -> None:
    m = CPUOffloadingManager(8)
    assert m.shadows is None
    assert not any(name.startswith("shadow_") for name in m.get_stats().policy)
    with pytest.raises(ValueError, match="sample_rate"):
        CPUOffloadingManager(8, shadow_policies="lru", shadow_sample_rate=0.0)
    with pytest.raises(ValueError, match="known"):
        CPUOffloadingManager(8, shadow_policies="lru,nope")


def test_shadow_gauges_reach_prometheus() -> None:
    from prometheus_client import CollectorRegistry

    from kvoffload.metrics import register_manager_metrics

    m = CPUOffloadingManager(
        64,
        shadow_policies=["lru", "arc", ("mq", {"lifetime": 50})],
        shadow_sample_rate=1.0,
        shadow_min_blocks=0,
    )
    _replay(m, _stream(2000))
    registry = CollectorRegistry()
    register_manager_metrics(m, registry=registry, labels={"tier": "cpu"})
    gauges = m.get_stats().policy
    for name in ("lru", "arc"):
        value = registry.get_sample_value(
            f"kvoffload_policy_shadow_{name}_hit_ratio", {"tier": "cpu"}
        )
        assert value == pytest.approx(gauges[f"shadow_{name}_hit_ratio"]) and value > 0
    mq = registry.get_sample_value(
        "kvoffload_policy_shadow_mq_lifetime_50_hit_ratio", {"tier": "cpu"}
    )
    assert mq == pytest.approx(gauges["shadow_mq(lifetime=50)_hit_ratio"])
    assert registry.get_sample_value("kvoffload_policy_switches_total", {"tier": "cpu"}) == 0


def test_auto_gauges_and_the_switch_counter_are_distinct_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from kvoffload.metrics import register_manager_metrics

    m = CPUOffloadingManager(64, cache_policy="auto")
    registry = CollectorRegistry()
    register_manager_metrics(m, registry=registry)
    lines = [
        line
        for line in generate_latest(registry).decode().splitlines()
        if "switches" in line and not line.startswith("#")
    ]
    assert sorted(name.split(" ")[0] for name in lines) == [
        "kvoffload_policy_auto_switches",
        "kvoffload_policy_switches_total",
    ]
