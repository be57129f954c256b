"""The tier conformance suite on the in-memory tier (once ``kvoffload.tiers.memory`` exists)."""

from __future__ import annotations

import pytest

from kvoffload.testing.tiers import check_tier_conformance


def test_memory_tier_passes_the_tier_conformance_suite() -> None:
    memory_mod = pytest.importorskip("kvoffload.tiers.memory")
    check_tier_conformance(
        lambda memory, records: memory_mod.MemoryTier(memory, records * memory.slot_bytes)
    )
