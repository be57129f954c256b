"""One error rule for the tiers' parameters (issue 13, item 7).

A wrong type is a ``TypeError`` and a wrong value a ``ValueError``, each naming the parameter;
a tier's manager key gives the same error class through a ``tiers`` config as through
:class:`SecondaryTier`. Cases marked "was ..." changed class when the checks moved to
:mod:`kvoffload._checks`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvoffload.manager import CPUOffloadingManager
from kvoffload.tiers import BytearraySlotMemory, MemoryTier
from kvoffload.tiers.base import MemoryviewSlotMemory
from kvoffload.tiers.config import parse_tier
from kvoffload.tiers.manager import SecondaryTier, TieringManager

SLOT = 32


def _memory(num_slots: int = 4) -> BytearraySlotMemory:
    return BytearraySlotMemory(SLOT, num_slots)


def _secondary(**settings: Any) -> SecondaryTier:
    return SecondaryTier(MemoryTier(_memory(), 4 * SLOT), **settings)


def _manager(**kwargs: Any) -> TieringManager:
    return TieringManager(CPUOffloadingManager(4), _memory(), **kwargs)


# (parameter, call taking the value, wrong-type value, wrong value or None)
CASES: list[tuple[str, Callable[[Any], object], Any, Any]] = [
    ("slot_bytes", lambda v: MemoryviewSlotMemory(memoryview(bytearray(64)), v), "8", 0),
    ("slot_bytes", lambda v: BytearraySlotMemory(v, 2), 8.0, 0),
    ("num_slots", lambda v: BytearraySlotMemory(SLOT, v), True, 0),
    ("capacity_bytes", lambda v: MemoryTier(_memory(), v), "64", -1),
    ("max_batch", lambda v: MemoryTier(_memory(), 64, max_batch=v), 1.0, -1),
    ("latency_polls", lambda v: MemoryTier(_memory(), 64, latency_polls=v), "1", -1),
    ("latency_s", lambda v: MemoryTier(_memory(), 64, latency_s=v), "0", -0.5),
    ("latency_s", lambda v: MemoryTier(_memory(), 64, latency_s=v), None, math.nan),  # was ok
    ("drain_timeout_s", lambda v: _manager(drain_timeout_s=v), "5", -1),
    ("write_back_wait_s", lambda v: _manager(write_back_wait_s=v), True, -0.1),
    ("max_negative", lambda v: _manager(max_negative=v), "8", -1),  # "8" was ValueError
    ("max_negative", lambda v: _manager(max_negative=v), 8.0, -1),  # 8.0 was ValueError
]

# SecondaryTier's settings: the same through the dataclass and through a tiers config.
SETTINGS: list[tuple[str, Any, Any]] = [
    ("store_threshold", "2", -1),
    ("max_inflight_bytes", 1.5, -1),
    ("lookup_retries", None, -1),
    ("write_back_reserve_blocks", "0", -2),
    ("breaker_threshold", 2.0, -1),
    ("breaker_backoff_s", "1", -1),
    ("breaker_max_backoff_s", [60], math.nan),  # nan was accepted
    ("fill", 1, None),  # 1 was accepted by the dataclass
    ("label", 3, None),
    ("write_policy", 3, "write_around"),  # 3 was ValueError
]


@pytest.mark.parametrize(("name", "call", "wrong_type", "wrong_value"), CASES)
def test_constructor_parameters(
    name: str, call: Callable[[Any], object], wrong_type: Any, wrong_value: Any
) -> None:
    if wrong_type is not None:
        with pytest.raises(TypeError, match=f"^{name} must be"):
            call(wrong_type)
    if wrong_value is not None:
        with pytest.raises(ValueError, match=f"^{name} must be"):
            call(wrong_value)


@pytest.mark.parametrize(("name", "wrong_type", "wrong_value"), SETTINGS)
def test_tier_settings_same_through_config_and_dataclass(
    name: str, wrong_type: Any, wrong_value: Any
) -> None:
    for value, error in ((wrong_type, TypeError), (wrong_value, ValueError)):
        if value is None:
            continue
        with pytest.raises(error, match=f"^{name} must be") as direct:
            _secondary(**{name: value})
        raw = {"type": "memory", "capacity_bytes": 4 * SLOT, name: value}
        with pytest.raises(error, match=r"^config 'tiers\[0\]") as config:
            parse_tier(raw)
        if error is TypeError and name.endswith("_bytes"):  # the config takes '2GiB' too
            assert f"{name}' must be bytes" in str(config.value)
        else:
            assert str(config.value) == f"config 'tiers[0]': {direct.value}"


def test_breaker_max_below_base_is_a_value_error_both_ways() -> None:
    settings = {"breaker_backoff_s": 2.0, "breaker_max_backoff_s": 1.0}
    with pytest.raises(ValueError, match="breaker_max_backoff_s"):
        _secondary(**settings)
    with pytest.raises(ValueError, match="breaker_max_backoff_s"):
        parse_tier({"type": "memory", "capacity_bytes": 4 * SLOT, **settings})


def test_unbounded_waits_still_take_inf() -> None:
    tier = _secondary(breaker_backoff_s=math.inf, breaker_max_backoff_s=math.inf)
    assert tier.breaker_max_backoff_s == math.inf
    assert _manager(drain_timeout_s=math.inf).drain_timeout_s == math.inf


def test_write_policy_member_and_string_are_both_accepted() -> None:
    assert _secondary(write_policy="write_back").write_policy.value == "write_back"
    member = _secondary().write_policy
    assert _secondary(write_policy=member).write_policy is member


redis = pytest.importorskip("redis")

from kvoffload.tiers.redis import RedisTier  # noqa: E402


def _redis(**kwargs: Any) -> RedisTier:
    # Every check runs before the client connects, so no server is needed here.
    return RedisTier(_memory(), "redis://127.0.0.1:1/0", **kwargs)


@pytest.mark.parametrize(
    ("name", "wrong_type", "wrong_value"),
    [
        ("ttl_ms", "1000", -1),  # "1000" was ValueError
        ("ttl_ms", 1000.0, -5),
        ("op_timeout_s", "2", 0),
        ("lookup_deadline_ms", None, -1.0),
        ("verdict_ttl_s", True, math.nan),  # nan was accepted
        ("negative_ttl_s", "x", 0.0),
        ("backoff_s", [1], -0.1),
        ("max_backoff_s", "5", 0),
        ("verdict_cache_entries", 1.0, 0),
        ("max_inflight_bytes", "1", 0),
        ("max_pipeline_bytes", 1.5, -1),
        ("workers", "4", 0),
        ("max_value_bytes", 2.0, 0),
        ("namespace", 3, b""),  # b"" was TypeError
        ("prefix", 3, "a:b"),  # 3 was ValueError
    ],
)
def test_redis_tier_parameters(name: str, wrong_type: Any, wrong_value: Any) -> None:
    if wrong_type is not None:
        with pytest.raises(TypeError, match=f"^{name} must be"):
            _redis(**{name: wrong_type})
    with pytest.raises(ValueError, match=f"^{name} must be"):
        _redis(**{name: wrong_value})


def test_disk_tier_parameters(tmp_path: Path) -> None:
    from kvoffload.tiers.disk import DiskTier

    def disk(**kwargs: Any) -> DiskTier:
        args: dict[str, Any] = {"capacity_bytes": 1 << 20, **kwargs}
        return DiskTier(_memory(), tmp_path / "d", **args)

    for name, wrong_type, wrong_value in (
        ("capacity_bytes", "1", 1),
        ("min_free_bytes", 1.0, -1),
        ("io_threads", "4", 0),
    ):
        with pytest.raises(TypeError, match=f"^{name} must be"):
            disk(**{name: wrong_type})
        with pytest.raises(ValueError, match=f"^{name} must be"):
            disk(**{name: wrong_value})
    for name in ("verify_on_scan", "save_policy_state"):
        with pytest.raises(TypeError, match=f"^{name} must be True or False"):
            disk(**{name: 1})
