"""What a tier declares in ``capabilities`` is read: ``max_value_bytes`` by the manager's
settings, ``max_batch`` by its job splitting, ``supports_delete`` by the conformance suite."""

from __future__ import annotations

import dataclasses

import pytest

import kvoffload.tiers
from kvoffload.tiers import BytearraySlotMemory, MemoryTier, TierCapabilities
from kvoffload.tiers.settings import SecondaryTier


class SmallRecords(MemoryTier):
    """A memory tier that declares records of at most 1 KiB."""

    @property
    def capabilities(self) -> TierCapabilities:
        return dataclasses.replace(super().capabilities, max_value_bytes=1024)


def test_a_tier_that_cannot_hold_a_block_is_refused_before_it_serves() -> None:
    big = BytearraySlotMemory(4096, 4)
    with pytest.raises(ValueError, match=r"at most 1024 bytes .*a block is 4096 bytes"):
        SecondaryTier(SmallRecords(big, 4 * 4096))
    small = BytearraySlotMemory(1024, 4)
    assert SecondaryTier(SmallRecords(small, 4 * 1024)).tier.capabilities.max_value_bytes == 1024
    assert SecondaryTier(MemoryTier(big, 4 * 4096))  # 0: no limit


def test_the_capabilities_declare_nothing_that_nothing_reads() -> None:
    """``supports_ttl`` (declared by the Redis tier) and ``medium``, ``shared``,
    ``persistent`` (declared by every tier; the vLLM adapters state vLLM's medium and locality
    themselves) were read by nobody: they are gone, and so is the ``Medium`` enum."""
    names = {f.name for f in dataclasses.fields(TierCapabilities)}
    assert not {"supports_ttl", "medium", "shared", "persistent"} & names
    assert not hasattr(kvoffload.tiers, "Medium")
    assert {"max_batch", "max_value_bytes", "supports_delete"} <= names
