"""The load-or-recompute rule against a brute-force search, and the cost estimates' behaviour."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.tiers.costs import (
    DEFAULT_PREFILL_TOKENS_PER_S,
    LinearCost,
    QueueWait,
    TierBenefit,
    TierCost,
    plan_load,
    prefill_cost,
    tier_read_cost,
)

BLOCK_TOKENS = 64
BLOCK_BYTES = 64 * 6144  # a 64-token block of a 6-layer, 2-KV-head, head_dim-64 fp32 model


def brute_force(hit_tiers, prompt_tokens, costs, prefill):
    """Every k's expected TTFT, written from the rule's definition, independently."""
    out = []
    for k in range(len(hit_tiers) + 1):
        per_tier = {}
        for t in hit_tiers[:k]:
            per_tier[t] = per_tier.get(t, 0) + 1
        load = max(
            [costs[t].read_seconds(n * BLOCK_BYTES) for t, n in per_tier.items() if t in costs],
            default=0.0,
        )
        out.append(load + prefill.predict(max(prompt_tokens - k * BLOCK_TOKENS, 1)))
    return out


tier_costs = st.fixed_dictionaries(
    {
        t: st.builds(
            TierCost,
            st.floats(0, 0.5),
            st.floats(1e-11, 1e-5),
            st.floats(0, 0.5),
        )
        for t in range(3)
    }
)


@settings(max_examples=300, deadline=None)
@given(
    hit_tiers=st.lists(st.integers(0, 3), max_size=24),
    extra_tokens=st.integers(0, 3000),
    costs=tier_costs,
    tokens_per_s=st.floats(100, 1e6),
    fixed=st.floats(0, 0.2),
)
def test_the_plan_is_the_brute_force_optimum(hit_tiers, extra_tokens, costs, tokens_per_s, fixed):
    prefill = LinearCost(fixed, 1.0 / tokens_per_s, prior_units=1024.0)
    prompt = len(hit_tiers) * BLOCK_TOKENS + extra_tokens + 1
    plan = plan_load(
        hit_tiers,
        block_tokens=BLOCK_TOKENS,
        block_bytes=BLOCK_BYTES,
        prompt_tokens=prompt,
        tier_costs=costs,
        prefill=prefill,
    )
    totals = brute_force(hit_tiers, prompt, costs, prefill)
    best = min(totals)
    assert math.isclose(plan.expected_s, best, rel_tol=1e-9, abs_tol=1e-12)
    # ties go to loading more: the largest k within rounding of the optimum
    assert plan.load_blocks == max(
        k for k, t in enumerate(totals) if math.isclose(t, best, rel_tol=1e-9, abs_tol=1e-12)
    )
    assert plan.expected_s <= plan.load_all_s + 1e-12
    assert plan.expected_s <= plan.recompute_s + 1e-12
    assert math.isclose(plan.recompute_s, totals[0], rel_tol=1e-12)
    assert math.isclose(plan.load_all_s, totals[-1], rel_tol=1e-12)
    assert sum(plan.blocks_by_tier.values()) == plan.load_blocks
    assert sum(plan.recomputed_by_tier.values()) == len(hit_tiers) - plan.load_blocks
    assert 0.0 <= plan.deadline_s <= plan.recompute_s + 1e-12


def test_a_healthy_tier_loads_every_hit_block():
    plan = plan_load(
        [0] * 4 + [1] * 28,
        block_tokens=BLOCK_TOKENS,
        block_bytes=BLOCK_BYTES,
        prompt_tokens=32 * BLOCK_TOKENS + 10,
        tier_costs={0: TierCost(1e-5, 1 / 5e9), 1: TierCost(2e-4, 1 / 2e9)},
        prefill=prefill_cost(),
    )
    assert plan.load_blocks == 32
    assert plan.recomputed_by_tier == {}


def test_a_tier_slower_than_prefill_is_not_waited_for():
    # CPU blocks first, then blocks on a tier at 1 MB/s: 393 KB per block is 0.39 s, while
    # prefilling its 64 tokens at 2,000 tokens/s takes 0.032 s.
    plan = plan_load(
        [0] * 3 + [1] * 5,
        block_tokens=BLOCK_TOKENS,
        block_bytes=BLOCK_BYTES,
        prompt_tokens=8 * BLOCK_TOKENS + 1,
        tier_costs={0: TierCost(1e-5, 1 / 5e9), 1: TierCost(1e-3, 1 / 1e6)},
        prefill=prefill_cost(),
    )
    assert plan.load_blocks == 3
    assert plan.blocks_by_tier == {0: 3}
    assert plan.recomputed_by_tier == {1: 5}


def test_a_long_queue_makes_even_a_fast_tier_lose():
    plan = plan_load(
        [1] * 8,
        block_tokens=BLOCK_TOKENS,
        block_bytes=BLOCK_BYTES,
        prompt_tokens=8 * BLOCK_TOKENS + 1,
        tier_costs={1: TierCost(1e-4, 1 / 5e9, queue_s=5.0)},
        prefill=prefill_cost(),
    )
    assert plan.load_blocks == 0
    assert plan.expected_s == plan.recompute_s
    assert plan.deadline_s == 0.0


def test_the_last_prompt_token_is_always_prefilled():
    prefill = LinearCost(0.05, 1e-3, prior_units=1024.0)
    plan = plan_load(
        [0] * 4,
        block_tokens=BLOCK_TOKENS,
        block_bytes=BLOCK_BYTES,
        prompt_tokens=4 * BLOCK_TOKENS,  # exactly four blocks: one token is still computed
        tier_costs={},
        prefill=prefill,
    )
    assert plan.load_blocks == 4
    assert math.isclose(plan.expected_s, prefill.predict(1))


def test_the_estimate_learns_a_tier_exactly_from_clean_jobs():
    est = tier_read_cost()
    for i in range(400):
        nbytes = (1 + i % 7) << 20
        est.observe(nbytes, 0.002 + nbytes / 5e8)
    assert math.isclose(est.fixed_s, 0.002, rel_tol=0.02)
    assert math.isclose(1 / est.per_unit_s, 5e8, rel_tol=0.02)


def test_one_outlier_moves_the_estimate_by_a_bounded_step_and_a_lasting_change_is_learned():
    est = tier_read_cost(fixed_s=1e-3, bytes_per_s=2e9)
    for _ in range(200):
        est.observe(4 << 20, 1e-3 + (4 << 20) / 2e9)
    before = est.predict(4 << 20)
    est.observe(4 << 20, 1000.0)  # one job stalled for 16 minutes
    after = est.predict(4 << 20)
    assert after < before * 1.2
    # the tier really gets 10x slower: believed within a few half-lives
    for _ in range(160):
        est.observe(4 << 20, 10 * before)
    assert math.isclose(est.predict(4 << 20), 10 * before, rel_tol=0.1)


def test_the_prior_holds_before_any_observation():
    est = prefill_cost()
    assert math.isclose(1 / est.per_unit_s, DEFAULT_PREFILL_TOKENS_PER_S)
    assert est.predict(0) == 0.0
    assert est.observations == 0
    est.observe(0, 5.0)  # nothing to learn from an empty job
    est.observe(10, float("nan"))
    assert est.observations == 0


def test_jobs_of_one_size_keep_a_defined_line():
    est = prefill_cost()
    for _ in range(1000):
        est.observe(512, 0.5)
    assert math.isclose(est.predict(512), 0.5, rel_tol=0.01)
    assert est.per_unit_s > 0


def test_queue_wait_is_a_bounded_running_mean():
    q = QueueWait(0.0)
    for _ in range(100):
        q.observe(0.01)
    assert math.isclose(q.seconds, 0.01, rel_tol=0.02)
    q.observe(100.0)
    assert q.seconds < 0.01 * 4
    q.observe(-1.0)
    assert q.observations == 101


def test_benefit_is_marginal_prefill_seconds_minus_load_seconds():
    prefill = LinearCost(0.1, 1 / 1000, prior_units=1024.0)
    b = TierBenefit()
    b.record_load(512, 0.05, prefill)
    b.record_load(0, 9.0, prefill)  # nothing served, nothing counted
    assert b.tokens_served == 512
    assert math.isclose(b.prefill_seconds_saved, 0.512)
    assert math.isclose(b.net_seconds, 0.462)
    assert b.as_dict()["net_seconds_saved"] == b.net_seconds


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"block_tokens": 0}, ValueError),
        ({"block_tokens": 1.5}, TypeError),
        ({"prompt_tokens": 0}, ValueError),
        ({"block_bytes": -1}, ValueError),
    ],
)
def test_bad_plan_inputs_are_named(kwargs, error):
    args = {
        "block_tokens": 16,
        "block_bytes": 1024,
        "prompt_tokens": 100,
        "tier_costs": {},
        "prefill": prefill_cost(),
    }
    args.update(kwargs)
    name = next(iter(kwargs))
    with pytest.raises(error, match=name):
        plan_load([0], **args)


def test_bad_estimate_inputs_are_named():
    with pytest.raises(ValueError, match="bytes_per_s"):
        tier_read_cost(bytes_per_s=0)
    with pytest.raises(ValueError, match="clip"):
        LinearCost(0.0, 1.0, prior_units=1.0, clip=1.0)
    with pytest.raises(TypeError, match="fixed_s"):
        LinearCost("1", 1.0, prior_units=1.0)


def test_the_prior_yields_to_the_first_observation():
    # A tier far slower than the 1 ms / 1 GB/s prior: its first read is believed at once
    # (unclipped, the prior halved), not one clipped step of 4x at a time.
    est = tier_read_cost()
    est.observe(3 << 20, 0.69)
    assert est.predict(3 << 20) > 0.6
    assert est.predict(3 << 20) < 0.69 * 1.01


def test_a_floor_above_the_estimate_holds_every_prediction_until_a_completion_restarts_it():
    est = tier_read_cost(fixed_s=1e-3, bytes_per_s=2e9)
    for _ in range(200):  # a learned, fast tier
        est.observe(4 << 20, 1e-3 + (4 << 20) / 2e9)
    assert not est.observe_floor(4 << 20, 1e-4)  # below the estimate: nothing learned
    assert est.floor_s == 0.0
    assert est.observe_floor(4 << 20, 0.4)  # a read has run 0.4 s and is not done
    assert est.predict(4 << 20) >= 0.4
    assert est.predict(1) >= 0.4  # a smaller read of the same tier is not assumed quicker
    assert est.as_dict()["floor_s"] == 0.4
    assert est.observations == 200  # a floor is not a completed job
    est.observe(4 << 20, 0.7)  # it completes: the line restarts from it, unclipped
    assert est.floor_s == 0.0
    assert 0.6 < est.predict(4 << 20) <= 0.7
    est.observe(4 << 20, 0.7)
    assert math.isclose(est.predict(4 << 20), 0.7, rel_tol=0.05)


def test_the_tier_cost_never_expects_a_read_quicker_than_its_floor():
    cost = TierCost(1e-3, 1e-9, queue_s=0.01, floor_s=0.5)
    assert math.isclose(cost.read_seconds(1 << 20), 0.51)
    assert cost.read_seconds(0) == 0.0


def test_prefill_slope_comes_from_a_cold_prompt_and_warm_suffixes_not_the_prior():
    # One full prefill and many short warm ones: the marginal cost per token is the
    # difference over the tokens between them (what a load of those tokens saves), with the
    # forward's fixed cost apart; the 2,000 tokens/s prior does not pull it.
    est = prefill_cost()
    est.observe(832, 0.35)
    for _ in range(24):
        est.observe(64, 0.03)
    assert math.isclose(est.per_unit_s * 768, 0.32, rel_tol=0.03)
    assert est.fixed_s > 0
