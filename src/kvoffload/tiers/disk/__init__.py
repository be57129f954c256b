"""The disk tier: checksummed record files under a byte budget, rebuilt on restart."""

from kvoffload.tiers.disk.io import FileLayer
from kvoffload.tiers.disk.records import FORMAT_VERSION, HEADER_BYTES, ChecksumKind, RecordError
from kvoffload.tiers.disk.tier import DURABILITIES, DiskTier, DiskTierInUseError, namespace_digest

__all__ = [
    "DURABILITIES",
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "ChecksumKind",
    "DiskTier",
    "DiskTierInUseError",
    "FileLayer",
    "RecordError",
    "namespace_digest",
]
