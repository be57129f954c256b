"""Test helpers for policy authors: the conformance suite and the single-block driver."""

from kvoffload.testing.conformance import (
    ALL_CHECKS,
    ConformanceError,
    PolicyConformanceSuite,
    check_policy_conformance,
)
from kvoffload.testing.drive import drive_single_blocks, int_key

__all__ = [
    "ALL_CHECKS",
    "ConformanceError",
    "PolicyConformanceSuite",
    "check_policy_conformance",
    "drive_single_blocks",
    "int_key",
]
