"""Shared test helpers: where the shared traces live, and a flattened-trace fixture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACE = REPO_ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"


def load_flat_trace() -> list[int]:
    """Every request's hash_ids in order (one access per block); skip the test if absent."""
    if not SHARED_TRACE.exists():
        pytest.skip(f"shared trace not found at {SHARED_TRACE}")
    ids: list[int] = []
    with SHARED_TRACE.open() as handle:
        for line in handle:
            ids.extend(json.loads(line)["hash_ids"])
    return ids


@pytest.fixture(scope="session")
def flat_trace() -> list[int]:
    return load_flat_trace()
