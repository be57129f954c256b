"""Shared test helpers: where the shared trace is, a flattened-trace fixture, and one notice
at the end of the run when tests skipped for want of it (see :mod:`kvoffload.testing.traces`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.testing.traces import TRACE_ENV, missing_trace_notice, shared_trace_path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACE = shared_trace_path(REPO_ROOT)
#: Every skip for want of the trace carries this reason; the run's summary counts them.
NO_TRACE_REASON = f"needs the shared trace (set {TRACE_ENV}; see 'shared trace missing' above)"
needs_shared_trace = pytest.mark.skipif(not SHARED_TRACE.is_file(), reason=NO_TRACE_REASON)


def require_shared_trace() -> Path:
    """The shared trace's path; skips the calling test when it is absent."""
    if not SHARED_TRACE.is_file():
        pytest.skip(NO_TRACE_REASON)
    return SHARED_TRACE


def load_flat_trace() -> list[int]:
    """Every request's hash_ids in order (one access per block); skip the test if absent."""
    ids: list[int] = []
    with require_shared_trace().open() as handle:
        for line in handle:
            ids.extend(json.loads(line)["hash_ids"])
    return ids


@pytest.fixture(scope="session")
def flat_trace() -> list[int]:
    return load_flat_trace()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = 0
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and NO_TRACE_REASON in str(longrepr[-1]):
            skipped += 1
    if skipped:
        terminalreporter.write_sep("=", "shared trace missing", yellow=True)
        terminalreporter.write_line(missing_trace_notice(SHARED_TRACE, skipped))
