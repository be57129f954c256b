"""The Redis tier's isolation and hardening against real servers (the CI standalone server
with its ACL user, the CI cluster, throwaway servers): who may delete a record, what a put
that finds its name taken reports, injective names, SCAN patterns, bounded reads, and
secrets that never reach a repr or a log line."""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("redis")

from kvoffload.spec import OffloadingConfig
from kvoffload.tiers import BytearraySlotMemory, Presence, TierResult
from kvoffload.tiers.config import parse_tier
from kvoffload.tiers.redis import RecordCodec, RedisTier

sys.path.insert(0, str(Path(__file__).parent))
from redis_servers import ci_url

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
