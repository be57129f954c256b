"""The Redis tier's isolation and hardening against real servers (the CI standalone server
with its ACL user, the CI cluster, throwaway servers): who may delete a record, what a put
that finds its name taken reports, injective names, SCAN patterns, bounded reads, and
secrets that never reach a repr or a log line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

pytest.importorskip("redis")

from kvoffload.spec import OffloadingConfig
from kvoffload.tiers import BytearraySlotMemory
from kvoffload.tiers.config import parse_tier
from kvoffload.tiers.redis import RecordCodec, RedisTier

sys.path.insert(0, str(Path(__file__).parent))
from redis_servers import ci_url

SLOT = 4096
PASSWORD = "kvoffload-test-secret"  # the CI standalone server's ACL password
SECRET = "fleet-secret-0123456789"


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
