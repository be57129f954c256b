"""Our tiers inside vLLM 0.33's own ``TieringOffloadingManager``, configured by keys alone.

Needs vLLM (``tools/setup_vllm_env.sh``; run by ``.ci/vllm``) and, for the Redis tier,
the CI servers (``.ci/redis_servers.sh``).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

try:
    from kvoffload.integrations import vllm_tiers
except ImportError as exc:
    pytest.skip(f"vLLM is not importable here: {exc}", allow_module_level=True)

import redis

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tiers"))
from redis_servers import RedisProcess, ci_url
from vllm_tier_driver import MODULE, VllmTieringDriver, tiering_spec


def keys_for(n: int, tag: bytes | None = None) -> list[bytes]:
    tag = tag or uuid.uuid4().bytes
    return [tag + i.to_bytes(16, "big") + b"\0\0\0\0" for i in range(n)]


@pytest.fixture(scope="module")
def redis_url() -> str:
    return ci_url("KVOFFLOAD_REDIS_URL")


def redis_tier_config(url: str, **extra: object) -> dict[str, object]:
    return {"type": "KVOffloadRedisTier", "module_path": MODULE, "url": url, **extra}


#: Tests that count exact hits give each existence check a deadline far above any stall of
#: this machine: at the default 50 ms a check answered late is a miss by design (tested in
#: ``test_unknown_answers_are_retry_then_miss_never_forever``), which cut a 6-block prefix
#: to 5 twice in CI runs.
PATIENT = {"lookup_deadline_ms": 5000.0}


def test_stores_cascade_to_redis_and_promote_back_byte_exact(redis_url: str) -> None:
    config = redis_tier_config(redis_url, **PATIENT)
    driver = VllmTieringDriver(tiering_spec([config], num_chunks=8))
    try:
        tier = driver.manager.secondary_tiers[0]
        assert isinstance(tier, vllm_tiers.KVOffloadRedisTier)
        first = keys_for(6)
        assert driver.request(first) == 0
        driver.settle()
        assert tier.tier.stats()["records_written"] == 6  # the cascade reached Redis
        for _ in range(3):  # other prompts push the first one out of the 8-chunk CPU tier
            driver.request(keys_for(6))
            driver.settle()
        hits = driver.request(first)  # promoted from Redis, then loaded from the CPU tier
        assert hits == 6, (driver.counts, tier.tier.stats())
        assert driver.counts.bad_bytes == 0
        assert driver.counts.loaded_bytes == 6 * driver.block_bytes
        assert tier.tier.stats()["hits"] == 6
        assert driver.counts.waits < 50  # HIT_PENDING for a few steps, not a loop
    finally:
        driver.close()


def test_two_vllm_managers_share_one_redis(redis_url: str) -> None:
    tag = uuid.uuid4().bytes
    shared = keys_for(10, tag)
    config = redis_tier_config(redis_url, **PATIENT)
    a = VllmTieringDriver(tiering_spec([config], 16, engine_id="a"))
    b = VllmTieringDriver(tiering_spec([config], 16, engine_id="b"))
    try:
        assert a.request(shared) == 0
        a.settle()
        hits = b.request(shared)  # b never computed these: all from a's stores
        assert hits == 10, (b.counts, b.our_tiers()[0].stats())
        assert b.counts.bad_bytes == 0
        assert b.counts.loaded_bytes == 10 * b.block_bytes
    finally:
        a.close()
        b.close()


def test_a_failed_load_is_a_miss_and_never_loops(redis_url: str) -> None:
    driver = VllmTieringDriver(tiering_spec([redis_tier_config(redis_url, lookup="sync")], 4))
    try:
        first = keys_for(3)
        driver.request(first)
        driver.settle()
        driver.request(keys_for(4))  # evict the first prompt from the CPU tier
        driver.settle()
        tier = driver.manager.secondary_tiers[0]
        client = redis.Redis.from_url(redis_url)
        client.delete(tier.tier._name(first[0]))  # gone between store and load
        waits_before = driver.counts.waits
        assert driver.request(first) == 0  # the prefix starts with a lost block: a miss
        assert driver.counts.waits - waits_before < 20
        assert driver.counts.bad_bytes == 0
        assert driver.request(first) >= 0  # and the next lookups still answer
    finally:
        driver.close()


def test_unknown_answers_are_retry_then_miss_never_forever() -> None:
    server = RedisProcess().start()
    try:
        cfg = redis_tier_config(server.url, lookup_deadline_ms=50)
        driver = VllmTieringDriver(tiering_spec([cfg], 4), max_wait_steps=10_000)
        try:
            redis.Redis.from_url(server.url).execute_command("CLIENT", "PAUSE", "600", "ALL")
            assert driver.request(keys_for(2)) == 0
            assert 0 < driver.counts.waits < 1000  # RETRY until the 50 ms deadline, then MISS
        finally:
            driver.close()
    finally:
        server.close()


def test_config_keys_are_checked_with_did_you_mean(redis_url: str) -> None:
    with pytest.raises(ValueError, match=r"unknown config key 'urll'; did you mean 'url'"):
        tiering_spec(
            [{"type": "KVOffloadRedisTier", "module_path": MODULE, "urll": redis_url}], 4
        ).get_manager()


def test_namespace_keeps_models_apart(redis_url: str) -> None:
    spec_a = tiering_spec([redis_tier_config(redis_url)], 4)
    spec_b = tiering_spec([redis_tier_config(redis_url)], 4)
    spec_b.config = type(spec_b.config)(**{**vars(spec_b.config), "kv_cache_layout": "HND"})
    ns_a = vllm_tiers.KVOffloadRedisTier.default_namespace(spec_a)
    ns_b = vllm_tiers.KVOffloadRedisTier.default_namespace(spec_b)
    assert ns_a != ns_b
