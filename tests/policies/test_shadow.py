"""Shadow evaluation: the miniatures are the real simulation when every key is sampled."""

from __future__ import annotations

import pytest

from kvoffload.context import ReqContext
from kvoffload.policies import CachePolicyFactory, create_cache_policy
from kvoffload.policies.lru import LRUCachePolicy
from kvoffload.selection.shadow import ShadowEvaluator, sample_hash, sampling_rate, scaled_params
from kvoffload.testing.drive import drive_single_blocks, int_key


def _stream() -> list[int]:
    ids = []
    for step in range(3000):
        ids.append(step % 37)
        ids.append(1000 + step)
        if step % 3 == 0:
            ids.append(5000 + step % 211)
    return ids


@pytest.mark.parametrize("name", ["lru", "arc", "mq", "s3fifo"])
def test_full_sample_equals_the_full_simulation(name: str) -> None:
    ids = _stream()
    shadow = ShadowEvaluator(64, [name], sample_rate=1.0)
    for block_id in ids:
        shadow.record([int_key(block_id)])
    expected = drive_single_blocks(create_cache_policy(name, 64), ids)
    estimate = shadow.estimates()[name]
    assert estimate.hits == expected
    assert estimate.accesses == len(ids)


def test_sampling_is_deterministic_and_close_to_the_rate() -> None:
    keys = [int_key(i) for i in range(200_000)]
    shadow = ShadowEvaluator(10_000, ["lru"], sample_rate=0.01)
    picked = shadow.sampled(keys)
    assert picked == shadow.sampled(keys)
    assert 0.009 < len(picked) / len(keys) < 0.011
    assert sample_hash(keys[0]) == sample_hash(int_key(0))
    assert shadow.shadow_capacity == 100


def test_min_shadow_blocks_raises_the_rate_for_small_caches() -> None:
    assert sampling_rate(1000, 0.01, 256) == pytest.approx(0.256)
    assert sampling_rate(100, 0.01, 256) == 1.0
    assert sampling_rate(100_000, 0.01, 256) == 0.01
    assert ShadowEvaluator(1000, ["lru"], 0.01, 256).shadow_capacity == 256


def test_miniatures_get_private_contexts() -> None:
    shadow = ShadowEvaluator(8, ["kvaware", "sae"], sample_rate=1.0)
    ctx = ReqContext(req_id="r", timestamp=1.0)
    shadow.record([int_key(1), int_key(2)], ctx)
    # The caller's context holds only the evaluator's own record: no policy state of its own.
    assert [cls.__name__ for cls in ctx._state] == ["_ShadowContexts"]
    ctx.output_tokens = 10
    shadow.request_finished(ctx)


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="sample_rate"):
        ShadowEvaluator(10, ["lru"], sample_rate=0.0)
    with pytest.raises(ValueError, match="at least one"):
        ShadowEvaluator(10, [])
    with pytest.raises(TypeError, match="candidate"):
        ShadowEvaluator(10, [3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="distinct"):
        ShadowEvaluator(10, ["lru", "lru"])


@pytest.mark.parametrize("policy", ["lru", "mq", "kvaware"])
def test_the_requests_protocol_matches_the_managers_hits_at_full_rate(policy: str) -> None:
    """Driven as the manager drives a policy, a full-rate shadow's hits are the replay's."""
    from kvoffload.sim.replay import make_context, replay
    from kvoffload.sim.workloads import WorkloadConfig, generate_workload

    trace = generate_workload(WorkloadConfig(seed=7, requests=400))
    capacity = trace.num_unique_blocks // 20
    exact = replay(trace, capacity, policy).block_hits
    got = {}
    for protocol in ("requests", "blocks"):
        shadow = ShadowEvaluator(capacity, [policy], sample_rate=1.0, protocol=protocol)
        for request in trace.requests:
            keys = [int_key(b) for b in request.block_ids]
            ctx = make_context(request, keys, trace.block_tokens)
            shadow.record(list(dict.fromkeys(keys)), ctx)
            ctx.output_tokens = request.output_tokens
            shadow.request_finished(ctx)
        got[protocol] = shadow.estimates()[policy].hits
    assert abs(got["requests"] - exact) <= 0.001 * trace.block_accesses, (got, exact)
    if policy == "lru":  # one key at a time its own blocks push each other out: fewer hits
        assert exact - got["blocks"] > 0.005 * trace.block_accesses
    with pytest.raises(ValueError, match="protocol"):
        ShadowEvaluator(10, ["lru"], protocol="keys")


def test_the_estimate_corrects_for_a_hot_key_the_sample_happened_to_draw() -> None:
    """A hot key, accessed in every call, that the 1% sample happened to draw makes up two
    thirds of the sample, so hits over sampled accesses reads about 0.83 where the stream's
    hit ratio is about 0.51 (each cold key is used twice: one miss, one hit). The regression
    on the known expected sample size (module docstring) brings it back to within the draw's
    noise on the cold keys (about 1,000 of them sampled: a spread of about 0.02); with every
    key sampled there is nothing to correct."""
    shadow = ShadowEvaluator(300_000, ["lru"], sample_rate=0.01)
    full = ShadowEvaluator(300_000, ["lru"], sample_rate=1.0)
    hot = next(int_key(i) for i in range(10_000) if shadow.sampled([int_key(i)]))

    def feed(*evaluators: ShadowEvaluator) -> None:
        for start in range(0, 100_000, 50):
            batch = [int_key(1_000_000 + i) for i in range(start, start + 50)] + [hot]
            for _ in range(2):  # each cold key twice, in two calls: a miss, then a hit
                for evaluator in evaluators:
                    evaluator.record(batch)

    feed(shadow, full)
    exact = full.hit_ratios()["lru"]
    estimate = shadow.estimates()["lru"]
    assert 0.50 < exact < 0.52
    assert estimate.sample_hit_ratio > 0.75  # the hot key's share of the sample
    assert abs(estimate.hit_ratio - exact) < 0.04, (estimate, exact)
    assert shadow.sample_hit_ratios()["lru"] == estimate.sample_hit_ratio
    exact_estimate = full.estimates()["lru"]
    assert exact_estimate.hit_ratio == exact_estimate.sample_hit_ratio == exact
    shadow.clear()  # forgets the counts behind the correction too: the same stream, same answer
    assert shadow.hit_ratios()["lru"] == 0.0
    feed(shadow)
    assert shadow.estimates()["lru"] == estimate


class _CountingLRU(LRUCachePolicy):
    """An out-of-tree policy with a parameter counted in accesses, declared on its class."""

    access_count_params = ("horizon",)

    def __init__(self, cache_capacity: int, horizon: int = 5000, label: int = 7) -> None:
        super().__init__(cache_capacity)
        self.horizon = horizon
        self.label = label


def test_a_miniature_scales_the_parameters_its_class_counts_in_accesses() -> None:
    """The class says which parameters a miniature scales by the rate (not a table kept in
    ``shadow``), so a policy from outside the package gets the same treatment as MQ."""
    assert scaled_params("mq", {}, 10_000, 0.01) == {"lifetime": 100}
    assert scaled_params("kvaware", {}, 10_000, 0.01) == {"decay_window": 800}  # 8 x 10,000
    assert scaled_params("lru", {}, 10_000, 0.01) == {}
    assert scaled_params("mq", {"lifetime": 300}, 10_000, 1.0) == {"lifetime": 300}
    with CachePolicyFactory.registry_snapshot():
        CachePolicyFactory.register_cache_policy("counting-lru", __name__, "_CountingLRU")
        assert scaled_params("counting-lru", {"label": 3}, 10_000, 0.01) == {
            "label": 3,  # not counted in accesses: as given
            "horizon": 50,
        }


@pytest.mark.parametrize("name", ["lru", "arc"])
def test_a_request_open_across_clear_releases_nothing_into_the_new_miniatures(name: str) -> None:
    """Blocks a request held (loads pinned, stores pending) before ``clear`` went with it:
    the request's end releases nothing, and the miniatures start again as fresh ones."""
    shadow = ShadowEvaluator(8, [name], sample_rate=1.0)
    warm = ReqContext(req_id="warm")
    shadow.record([int_key(i) for i in range(4)], warm)
    shadow.request_finished(warm)
    ctx = ReqContext(req_id="open")
    shadow.record([int_key(i) for i in range(6)], ctx)  # 4 loads pinned, 2 stores pending
    shadow.clear()
    shadow.request_finished(ctx)
    fresh = ShadowEvaluator(8, [name], sample_rate=1.0)
    for evaluator in (shadow, fresh):
        for start in range(0, 40, 5):
            later = ReqContext(req_id=f"r{start}")
            evaluator.record([int_key(i % 13) for i in range(start, start + 5)], later)
            evaluator.request_finished(later)
    assert shadow.estimates()[name].hits == fresh.estimates()[name].hits
    assert shadow.estimates()[name].accesses == fresh.estimates()[name].accesses == 40
