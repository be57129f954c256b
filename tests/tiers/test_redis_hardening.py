"""The Redis tier's isolation and hardening against real servers (the CI standalone server
with its ACL user, the CI cluster, throwaway servers): who may delete a record, what a put
that finds its name taken reports, injective names, SCAN patterns, bounded reads, and
secrets that never reach a repr or a log line."""

from __future__ import annotations

import logging
import struct
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("redis")

import redis

from kvoffload.spec import OffloadingConfig
from kvoffload.tiers import BytearraySlotMemory, Presence, TierResult
from kvoffload.tiers.config import parse_tier
from kvoffload.tiers.redis import RecordCodec, RedisTier

sys.path.insert(0, str(Path(__file__).parent))
from redis_servers import RedisProcess, ci_url

SLOT = 4096
PASSWORD = "kvoffload-test-secret"  # the CI standalone server's ACL password
SECRET = "fleet-secret-0123456789"


def fresh_keys(n: int) -> list[bytes]:
    tag = uuid.uuid4().bytes
    return [tag + i.to_bytes(4, "big") for i in range(n)]


def fresh_prefix() -> str:
    """A prefix no other test (or earlier run) wrote under."""
    return f"hard-{uuid.uuid4().hex[:12]}"


def wait(tier: RedisTier, timeout: float = 10.0) -> list[TierResult]:
    assert tier.drain(timeout), "jobs still in flight after the deadline"
    return tier.poll()


def put(tier: RedisTier, keys: list[bytes], fill: bytes = b"") -> TierResult:
    for i, key in enumerate(keys):
        tier.memory.slot_view(i)[:] = (fill or key) * (SLOT // len(fill or key)) + bytes(
            SLOT % len(fill or key)
        )
    tier.submit_put(keys, list(range(len(keys))))
    (result,) = wait(tier)
    return result


def get(tier: RedisTier, keys: list[bytes], first_slot: int = 0) -> TierResult:
    tier.submit_get(keys, list(range(first_slot, first_slot + len(keys))))
    (result,) = wait(tier)
    return result


@pytest.fixture(scope="module")
def cluster_url() -> str:
    return ci_url("KVOFFLOAD_REDIS_CLUSTER_URL")


@pytest.fixture(scope="module")
def standalone_url() -> str:
    url = ci_url("KVOFFLOAD_REDIS_URL")
    assert "@" in url, "the CI standalone URL carries an ACL user and password"
    return url


def _password_of(url: str) -> str:
    return url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]


def test_config_tier_config_codec_and_tier_reprs_mask_every_secret(
    standalone_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    password = _password_of(standalone_url)
    query_url = standalone_url.split("@", 1)[1]
    entry = {
        "type": "redis",
        "url": standalone_url,
        "secret": SECRET,
        "password": password,
    }
    config = OffloadingConfig.from_extra_config(
        {
            "cpu_bytes_to_use": 1 << 20,
            "secondary_tiers": [
                entry,
                {"type": "redis", "url": f"redis://{query_url}?password={password}"},
            ],
        }
    )
    tier_config = parse_tier(entry)
    codec = RecordCodec(namespace=b"ns", secret=SECRET.encode())
    tier = RedisTier(BytearraySlotMemory(SLOT, 1), standalone_url, namespace="t", secret=SECRET)
    try:
        shown = {
            "repr(config)": repr(config),
            "str(config)": str(config),
            "f-string": f"{config}",
            "repr(tier_config)": repr(tier_config),
            "repr(codec)": repr(codec),
            "repr(tier)": repr(tier),
        }
        with caplog.at_level(logging.INFO):
            logging.getLogger("kvoffload.test").info("starting with %s and %r", config, tier)
        shown["log"] = caplog.text
        for where, text in shown.items():
            assert password not in text, f"{where} prints the Redis password: {text}"
            assert SECRET not in text, f"{where} prints the signing secret: {text}"
        assert "***" in shown["repr(config)"] and "127.0.0.1" in shown["repr(config)"]
        assert "redis://***@127.0.0.1" in shown["repr(tier)"]
        with pytest.raises(TypeError) as info:  # a secret of a wrong type: named, not shown
            parse_tier({"type": "redis", "secret": 12345678901234567890})
        assert "secret" in str(info.value) and "12345678901234567890" not in str(info.value)
    finally:
        tier.close()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw-123@h:6379/0", "redis://***@h:6379/0"),
        ("rediss://:pw-123@h/0", "rediss://***@h/0"),
        ("redis://h/0?db=1&password=pw-123", "redis://h/0?db=1&password=***"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_urls_lose_their_credentials(url: str, shown: str) -> None:
    from kvoffload._checks import redact_url

    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (b"\xa0\xa1\xa2", "a0a1a2"),  # non-ASCII bytes, and the text of their hex
        ("a:b", "613a62"),  # a colon (written as hex), and that hex as text
        ("{x}", "x"),  # braces untagged, and a hash-tagged name
    ],
)
def test_two_namespaces_never_share_a_name(
    standalone_url: str, one: bytes | str, other: str
) -> None:
    prefix = fresh_prefix()
    tagged = other == "x"
    a = RedisTier(BytearraySlotMemory(SLOT, 8), standalone_url, prefix=prefix, namespace=one)
    b = RedisTier(
        BytearraySlotMemory(SLOT, 8),
        standalone_url,
        prefix=prefix,
        namespace=other,
        lookup="sync",
        hash_tag="namespace" if tagged else "none",
    )
    try:
        keys = fresh_keys(4)
        assert {a._name(k) for k in keys}.isdisjoint(b._name(k) for k in keys)
        assert put(a, keys).all_ok
        assert b.contains(keys) == [Presence.MISS] * 4  # the other tenant sees nothing
        assert get(b, keys, 4).reasons == dict.fromkeys(range(4), "missing")
        back = get(a, keys, 4)  # and deleted nothing: the owner reads every record back
        assert back.all_ok
        assert bytes(a.memory.slot_view(4)) == bytes(a.memory.slot_view(0))
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("mode", ["standalone", "cluster"])
def test_scan_lists_only_its_own_namespace_whatever_glob_characters_it_holds(
    mode: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(f"{mode}_url")
    prefix = fresh_prefix()
    namespaces = ["abc", "a?c", "*", "[ab]c", "a\\bc", "hex", "\xff\xfe", "ac", "bc"]
    tiers = {
        ns: RedisTier(
            BytearraySlotMemory(SLOT, 4),
            url,
            prefix=prefix,
            namespace=ns,
            cluster=mode == "cluster",
            hash_tag="none",
        )
        for ns in namespaces
    }
    try:
        own = {}
        for ns, tier in tiers.items():
            own[ns] = fresh_keys(2)
            assert put(tier, own[ns]).all_ok
        for ns, tier in tiers.items():
            listed = {block.key for block in tier.scan()}
            assert listed == set(own[ns]), f"scan of namespace {ns!r} listed another's keys"
    finally:
        for tier in tiers.values():
            tier.close()


HUGE = 256 << 20


def _output_bytes(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_net_output_bytes"])


@pytest.mark.parametrize("path", ["direct", "pipeline"])
def test_a_huge_value_under_a_records_name_is_refused_without_being_received(path: str) -> None:
    """256 MiB under a 4 KiB record's name: the server sends at most the record's size plus
    one byte of it, and the reader allocates no more; junk is deleted, a longer record of
    this namespace (another slot size: someone else's) is refused and left alone."""
    server = RedisProcess().start()
    try:
        admin = redis.Redis.from_url(server.url)
        client = None if path == "direct" else redis.Redis.from_url(server.url, protocol=3)
        memory = BytearraySlotMemory(SLOT, 4)
        tier = RedisTier(memory, server.url, namespace="t", client=client)
        assert (tier._direct is not None) == (path == "direct")
        junk, longer, good = fresh_keys(3)
        assert put(tier, [good]).all_ok
        admin.setrange(tier._name(junk), HUGE - 1, b"x")  # 256 MiB of zeros, built server-side
        header = struct.pack("<4sBBBBHHQ", b"KVOR", 1, 0, 1, 0, 1, len(longer), HUGE)
        admin.set(tier._name(longer), header + b"t" + longer)
        admin.setrange(tier._name(longer), HUGE - 1, b"x")
        record = tier.codec.header_bytes(junk) + SLOT
        tracemalloc.start()
        try:
            sent = _output_bytes(admin)
            result = get(tier, [junk, longer, good], 1)
            sent = _output_bytes(admin) - sent
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert sent < 3 * (record + 1) + 16 * 1024, f"the server sent {sent} bytes"
        assert peak < 4 * 2**20, f"the reader allocated {peak} bytes"
        assert result.ok == (False, False, True)
        assert result.reasons == {0: "corrupt", 1: "oversized"}
        assert admin.exists(tier._name(junk)) == 0  # junk for everyone: deleted
        assert admin.strlen(tier._name(longer)) == HUGE  # another reader's: kept
        assert tier.stats()["rejected_oversized"] == 1
        tier.close()
    finally:
        server.close()


def _tier(mode: str, request: pytest.FixtureRequest, **kwargs: Any) -> RedisTier:
    """A tier on the CI servers: the direct socket path, redis-py pipelines (RESP3), or the
    cluster."""
    url = request.getfixturevalue("cluster_url" if mode == "cluster" else "standalone_url")
    client = redis.Redis.from_url(url, protocol=3) if mode == "pipeline" else None
    tier = RedisTier(
        BytearraySlotMemory(SLOT, 8), url, cluster=mode == "cluster", client=client, **kwargs
    )
    assert (tier._direct is not None) == (mode == "direct")
    return tier


def _admin(tier: RedisTier) -> redis.Redis:
    return tier._client  # type: ignore[no-any-return]


MODES = ["direct", "pipeline", "cluster"]


@pytest.mark.parametrize("mode", MODES)
def test_readers_with_another_secret_or_none_leave_signed_records_alone(
    mode: str, request: pytest.FixtureRequest
) -> None:
    prefix = fresh_prefix()
    signer = _tier(mode, request, prefix=prefix, namespace="t", secret=SECRET, lookup="sync")
    stale = _tier(
        mode, request, prefix=prefix, namespace="t", secret="an-older-secret-0123", verdict_ttl_s=30
    )
    unsigned = _tier(mode, request, prefix=prefix, namespace="t")
    try:
        keys = fresh_keys(6)
        assert put(signer, keys).all_ok
        for reader in (stale, unsigned):  # a rotation's stale instance, one without a secret
            result = get(reader, keys)
            assert result.reasons == dict.fromkeys(range(6), "bad_signature")
            assert reader.stats().get("records_deleted_bad", 0) == 0
        assert all(_admin(signer).exists(signer._name(k)) for k in keys)
        time.sleep(0.1)  # past the negative verdict's 50 ms: still known unreadable, no EXISTS
        assert stale.contains(keys) == [Presence.MISS] * 6
        back = get(signer, keys)  # the fleet's records are all still there, and valid
        assert back.all_ok
        (plain,) = fresh_keys(1)  # and the other way round: an unsigned record is someone's
        assert put(unsigned, [plain]).all_ok
        assert get(signer, [plain]).reasons == {0: "bad_signature"}
        assert get(unsigned, [plain]).all_ok
    finally:
        for tier in (signer, stale, unsigned):
            tier.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_put_naming_a_stored_block_twice_finds_both_stored(
    mode: str, request: pytest.FixtureRequest
) -> None:
    tier = _tier(mode, request, prefix=fresh_prefix(), namespace="t")
    try:
        (key,) = fresh_keys(1)
        assert put(tier, [key]).all_ok
        result = put(tier, [key, key])  # both names taken: each read back, one answer each
        assert result.all_ok and tier.stats()["records_existing"] == 2
    finally:
        tier.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_put_that_finds_its_name_taken_by_what_it_cannot_read_fails(
    mode: str, request: pytest.FixtureRequest
) -> None:
    prefix = fresh_prefix()
    tier = _tier(
        mode, request, prefix=prefix, namespace="t", secret=SECRET, lookup="sync", verdict_ttl_s=30
    )
    other = _tier(mode, request, prefix=prefix, namespace="t", secret="an-older-secret-0123")
    peer = _tier(mode, request, prefix=prefix, namespace="t", secret=SECRET)
    unsigned = _tier(mode, request, prefix=prefix, namespace="t")
    try:
        as_list, other_secret, junk, no_secret, same_block = keys = fresh_keys(5)
        admin = _admin(tier)
        admin.rpush(tier._name(as_list), b"not a record")
        assert put(other, [other_secret]).all_ok
        admin.set(tier._name(junk), b"junk" * 100)
        assert put(unsigned, [no_secret]).all_ok
        assert put(peer, [same_block]).all_ok  # the same block, from another writer
        result = put(tier, keys)
        assert result.ok == (False, False, False, False, True)
        assert result.reasons == dict.fromkeys(range(4), "name_taken")
        stats = tier.stats()
        assert stats["put_failed_name_taken"] == 4 and stats["records_existing"] == 1
        assert tier.contains(keys) == [Presence.MISS] * 4 + [Presence.HIT]
        assert admin.type(tier._name(as_list)) in (b"list", "list")  # nothing was overwritten
        assert get(other, [other_secret]).all_ok
    finally:
        for t in (tier, other, peer, unsigned):
            t.close()


def test_an_acl_user_without_the_get_commands_is_a_clear_error_at_start() -> None:
    """Gets send GETRANGE and PEXPIRE: a user allowed only the old GETEX / GET is told at
    start, naming the commands, instead of failing every get later."""
    server = RedisProcess(
        None, "--user", "old", "on", ">old-password-0123", "~*", "+@all", "-getrange", "-pexpire"
    )
    try:
        server.start()
        url = f"redis://old:old-password-0123@127.0.0.1:{server.port}/0"
        with pytest.raises(PermissionError, match=r"getrange.*pexpire") as info:
            RedisTier(BytearraySlotMemory(SLOT, 1), url, namespace="t")
        assert "old-password-0123" not in str(info.value)
    finally:
        server.close()
