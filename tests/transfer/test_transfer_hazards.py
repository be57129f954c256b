"""HazardTracker: which unfinished jobs a new job waits for."""

from __future__ import annotations

import pytest

from kvoffload.transfer.hazards import HazardTracker


def test_read_after_write_write_after_read_and_write_after_write() -> None:
    h: HazardTracker[str] = HazardTracker()
    assert h.add("store1", reads=["b1"], writes=["s1"]) == set()
    assert h.add("load1", reads=["s1"], writes=["b2"]) == {"store1"}  # RAW on s1
    assert h.add("load2", reads=["s1"], writes=["b3"]) == {"store1"}  # loads share a slot
    assert h.add("store2", reads=["b4"], writes=["s1"]) == {"store1", "load1", "load2"}  # WAR+WAW
    assert h.add("store3", reads=["b2"], writes=["s9"]) == {"load1"}  # reads a block load1 writes
    assert h.add("other", reads=["b7"], writes=["s7"]) == set()


def test_finished_jobs_are_no_longer_waited_for_and_nothing_leaks() -> None:
    h: HazardTracker[int] = HazardTracker()
    h.add(1, reads=["b"], writes=["s"])
    h.add(2, reads=["s"], writes=["c"])
    h.remove(1)
    assert h.add(3, reads=["s"], writes=["d"]) == set()
    assert h.add(4, reads=["e"], writes=["s"]) == {2, 3}
    for job in (2, 3, 4):
        h.remove(job)
    assert h.idle and len(h) == 0


def test_a_job_is_tracked_once() -> None:
    h: HazardTracker[int] = HazardTracker()
    h.add(1, reads=[], writes=["s"])
    with pytest.raises(ValueError, match="already tracked"):
        h.add(1, reads=[], writes=["t"])
