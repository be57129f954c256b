"""Test helpers: the policy and tier conformance suites and the single-block driver."""

from kvoffload.testing.conformance import (
    ALL_CHECKS,
    ConformanceError,
    PolicyConformanceSuite,
    check_policy_conformance,
)
from kvoffload.testing.drive import drive_single_blocks, int_key
from kvoffload.testing.tiers import TierConformanceError, check_tier_conformance

__all__ = [
    "ALL_CHECKS",
    "ConformanceError",
    "PolicyConformanceSuite",
    "TierConformanceError",
    "check_policy_conformance",
    "check_tier_conformance",
    "drive_single_blocks",
    "int_key",
]
