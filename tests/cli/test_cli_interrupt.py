"""Ctrl-C stops ``kvoffload simulate`` within about a second, its worker processes included,
even when started with SIGINT ignored, and keeps what finished, marked partial."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
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


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    "started_ignoring",
    [False, True],
    ids=["sigint-default", "sigint-ignored-at-start"],  # the second: `cmd &` in a script
)
def test_ctrl_c_stops_simulate_and_its_workers_within_a_second(started_ignoring: bool) -> None:
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
        # SIG_IGN survives exec: what a shell without job control gives a background job.
        preexec_fn=_ignore_sigint if started_ignoring else None,
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


SLOW_POLICY = """
import os
import time

from kvoffload.policies.lru import LRUCachePolicy


class Slow(LRUCachePolicy):
    \"\"\"LRU that takes its time; each replay it starts leaves a file saying so.\"\"\"

    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        if cache_capacity > 1:  # not the one-slot instance the command builds to check it
            open(f"started-{cache_capacity}-{os.getpid()}", "w").close()

    def touch(self, keys, req_context=None):
        time.sleep(0.2)
        super().touch(keys, req_context)
"""


def _interrupt_when(
    tmp_path: Path, argv: list[str], started: int
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``kvoffload`` in ``tmp_path``; Ctrl-C once ``started`` Slow replays have begun."""
    (tmp_path / "slow_policy.py").write_text(textwrap.dedent(SLOW_POLICY))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvoffload", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("started-*"))) < started and proc.poll() is None:
            assert time.monotonic() < deadline, "the slow replays never started"
            time.sleep(0.05)
        # A worker's finished result reaches the parent through a queue a moment after the
        # worker moved on: give it that moment.
        time.sleep(1.0)
        assert proc.poll() is None, "finished before the interrupt"
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), took


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_writes_the_finished_replays_marked_partial(tmp_path: Path, workers: str) -> None:
    # Capacity-major tasks lru@5, Slow@5, lru@6, Slow@6. One worker: interrupted in Slow@5,
    # lru@5 done. Two workers taking tasks in order: both in a Slow replay means both lru done.
    argv = ["sweep", "--policy", "lru,slow_policy:Slow", "--capacity", "5,6", "--requests"]
    # One worker prints the table, two the JSON: both say partial.
    output = "table" if workers == "1" else "json"
    argv += ["200", "--no-bounds", "--no-progress", "--format", output, "--workers", workers]
    argv += ["-o", "out.json", "-o", "out.csv", "--plot", "plots"]
    done, took = _interrupt_when(tmp_path, argv, started=int(workers))
    finished = 1 if workers == "1" else 2
    assert done.returncode == 130, done.stderr
    assert f"kvoffload: interrupted: {finished} of 4 tasks finished" in done.stderr
    assert "marked partial" in done.stderr and took < 10
    records = [json.loads((tmp_path / "out.json").read_text())]
    if output == "json":
        records.append(json.loads(done.stdout))
    else:
        assert f"partial: interrupted, {finished} of 4 tasks finished" in done.stdout
    for record in records:
        assert record["partial"] is True
        assert (record["tasks_finished"], record["tasks_total"]) == (finished, 4)
        assert [r["policy"] for r in record["results"]] == ["lru"] * finished
        assert [r["capacity"] for r in record["results"]] == ["5", "6"][:finished]
    with (tmp_path / "out.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["policy"], r["partial"]) for r in rows] == [("lru", "True")] * finished
    plots = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert "hit_ratio_curve.png" in plots and "bars_5.png" in plots


def test_ctrl_c_before_anything_finished_leaves_no_plot_folder(tmp_path: Path) -> None:
    argv = ["sweep", "--policy", "slow_policy:Slow", "--capacity", "5", "--requests", "200"]
    argv += ["--no-bounds", "--no-progress", "--workers", "1", "--plot", "plots"]
    argv += ["-o", "out.json"]
    done, _ = _interrupt_when(tmp_path, argv, started=1)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "kvoffload: interrupted"
    assert not (tmp_path / "plots").exists() and not (tmp_path / "out.json").exists()
