"""Secondary KV tiers (disk, a shared remote store) behind the CPU tier: the ``Tier`` contract.

The tiering manager lives in :mod:`kvoffload.tiers.manager` (imported from there, not here, so
that the CPU manager may import this package without a cycle).
"""

from kvoffload.tiers.base import (
    BytearraySlotMemory,
    JobKind,
    MemoryviewSlotMemory,
    Presence,
    ScannedBlock,
    SlotMemory,
    Tier,
    TierCapabilities,
    TierHealth,
    TierResult,
    TierStats,
)
from kvoffload.tiers.memory import MemoryTier

__all__ = [
    "BytearraySlotMemory",
    "JobKind",
    "MemoryTier",
    "MemoryviewSlotMemory",
    "Presence",
    "ScannedBlock",
    "SlotMemory",
    "Tier",
    "TierCapabilities",
    "TierHealth",
    "TierResult",
    "TierStats",
]
