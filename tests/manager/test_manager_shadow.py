"""Shadow policies on a live manager: estimates fed by the key stream, in stats and metrics."""

from __future__ import annotations

import random

import pytest

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.manager.observers import AccessObserver
from kvoffload.policies.spec import PolicySpec
from kvoffload.selection import ShadowEvaluator
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


def _shadows(
    capacity: int, candidates: list[PolicySpec | str], rate: float
) -> list[AccessObserver]:
    return [ShadowEvaluator(capacity, candidates, sample_rate=rate, min_shadow_blocks=0)]


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
        observers=_shadows(64, ["lru", "arc", "s3fifo"], 1.0),
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
        observers=_shadows(400, ["lru", ("mq", {"lifetime": 5000})], 0.25),
    )
    _replay(m, ids[:3000])
    first = m.get_stats().policy["shadow_accesses"]
    assert 0.15 * 3000 < first < 0.35 * 3000
    m.switch_policy("arc")
    _replay(m, ids[3000:])
    gauges = m.get_stats().policy
    assert gauges["shadow_accesses"] > first
    assert "shadow_mq(lifetime=5000)_hit_ratio" in gauges
    [shadows] = m.observers
    assert isinstance(shadows, ShadowEvaluator) and shadows.rate == 0.25


def test_without_shadows_no_shadow_gauges_and_bad_observers_fail() -> None:
    m = CPUOffloadingManager(8)
    assert m.observers == ()
    assert not any(name.startswith("shadow_") for name in m.get_stats().policy)
    with pytest.raises(TypeError, match="observer needs record"):
        CPUOffloadingManager(8, observers=[object()])  # type: ignore[list-item]


class _Log:
    """An observer that is not a shadow: the manager calls it as any other."""

    def __init__(self) -> None:
        self.keys: list[OffloadKey] = []
        self.finished: list[str] = []

    def record(self, keys: list[OffloadKey], ctx: ReqContext | None = None) -> int:
        self.keys += keys
        return len(keys)

    def request_finished(self, ctx: ReqContext) -> None:
        self.finished.append(ctx.req_id)

    def stats(self) -> dict[str, float]:
        return {"log_keys": float(len(self.keys))}


@pytest.mark.parametrize("live", ["lru", "arc"])  # lru skips misses' touches; arc does not
def test_an_observer_sees_each_request_key_once_misses_included(live: str) -> None:
    log = _Log()
    m = CPUOffloadingManager(4, cache_policy=live, observers=[log])
    ctx = ReqContext(req_id="r0")
    m.on_new_request(ctx)
    out = m.prepare_store([k(1), k(2)], ctx)
    assert out is not None
    m.complete_store(out.keys_to_store, ctx)
    m.on_request_finished(ctx)
    ctx = ReqContext(req_id="r1")
    m.on_new_request(ctx)
    m.prepare_load([k(1)], ctx)
    m.complete_load([k(1)], ctx)
    m.prepare_store([k(1), k(3)], ctx)  # k(1) touched already: seen once this request
    m.on_request_finished(ctx)
    m.touch([k(2)])  # outside a request
    assert log.keys == [k(1), k(2), k(1), k(3), k(2)]
    assert log.finished == ["r0", "r1"]
    assert m.get_stats().policy["log_keys"] == 5.0


def test_shadow_gauges_reach_prometheus() -> None:
    from prometheus_client import CollectorRegistry

    from kvoffload.metrics import register_manager_metrics

    m = CPUOffloadingManager(
        64,
        observers=_shadows(64, ["lru", "arc", ("mq", {"lifetime": 50})], 1.0),
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
