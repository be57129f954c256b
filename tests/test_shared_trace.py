"""Finding the shared trace: $KVOFFLOAD_TRACE first, then shared/traces above the checkout, and
one notice (with how to get it) when the tests that need it skip."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.testing.traces import TRACE_ENV, TRACE_NAME, shared_trace_path

ROOT = Path(__file__).resolve().parents[1]


def test_env_var_wins_then_the_nearest_shared_folder_above(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "a" / "b" / "repo"
    checkout.mkdir(parents=True)
    monkeypatch.delenv(TRACE_ENV, raising=False)
    # The temporary folder's own ancestors (e.g. a /tmp/shared a user made) are outside the test's
    # control: when one holds the trace, that is the right answer for "nothing in tmp_path".
    outside = [
        folder / "shared" / "traces" / TRACE_NAME
        for folder in tmp_path.resolve().parents
        if (folder / "shared" / "traces" / TRACE_NAME).is_file()
    ]
    # Nothing anywhere: the expected place beside the checkout, so a message can name it.
    beside = tmp_path.resolve() / "a" / "b" / "shared" / "traces" / TRACE_NAME
    assert shared_trace_path(checkout) == (outside[0] if outside else beside)
    far = tmp_path / "shared" / "traces" / TRACE_NAME
    far.parent.mkdir(parents=True)
    far.write_text("{}\n")
    assert shared_trace_path(checkout) == far.resolve()  # found two folders up (e.g. a worktree)
    mine = tmp_path / "mine.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(mine))
    assert shared_trace_path(checkout) == mine  # the variable wins, even if the file is absent


def test_a_run_without_the_trace_prints_one_notice_with_how_to_get_it(tmp_path: Path) -> None:
    env = {**os.environ, TRACE_ENV: str(tmp_path / "absent.jsonl")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/sim/test_traces.py::test_shared_trace_figures",
            "tests/cli/test_cli.py::test_bounds_on_the_shared_trace",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "2 skipped" in out
    assert len(re.findall(r"^=+ shared trace missing =+$", out, flags=re.M)) == 1
    assert "2 tests that replay the shared Mooncake synthetic trace were skipped" in out
    assert f"export {TRACE_ENV}=" in out and "curl -L -o" in out
