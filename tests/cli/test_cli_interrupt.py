"""Ctrl-C stops ``kvoffload simulate`` within about a second, its worker processes included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the workers")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(child) for child in text)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_ctrl_c_stops_simulate_and_its_workers_within_a_second() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # Long tasks (a few seconds each), so a task started after the interrupt would show.
    argv = ["simulate", "--requests", "6000", "--policy", "lirs,arc,lru", "--workers", "2"]
    argv += ["--no-progress", "--format", "json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvoffload", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while len(workers) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            workers = _children(proc.pid)
        assert len(workers) >= 2, "the workers never started"
        time.sleep(1.0)  # let them get into their replays
        assert proc.poll() is None, "finished before the interrupt: make the run longer"
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does in a terminal
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "kvoffload: interrupted" in err
    assert took < 2.5, f"took {took:.1f} s to stop"
    assert not [pid for pid in workers if _alive(pid)], "workers outlived the command"
