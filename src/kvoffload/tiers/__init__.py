"""Secondary KV tiers (disk, a shared remote store) behind the CPU tier: the ``Tier`` contract."""

from kvoffload.tiers.base import (
    BytearraySlotMemory,
    JobKind,
    Medium,
    Presence,
    ScannedBlock,
    SlotMemory,
    Tier,
    TierCapabilities,
    TierHealth,
    TierJob,
    TierResult,
)

__all__ = [
    "BytearraySlotMemory",
    "JobKind",
    "Medium",
    "Presence",
    "ScannedBlock",
    "SlotMemory",
    "Tier",
    "TierCapabilities",
    "TierHealth",
    "TierJob",
    "TierResult",
]
