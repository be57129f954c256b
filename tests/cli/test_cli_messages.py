"""What the kvoffload command says: help text, summaries, warnings and the errors it blames.

Each test drives the command the way a user does (``cli.main`` in-process, or a real
``python -m kvoffload`` subprocess where the output of the whole process matters).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload import cli

COMMANDS = ["simulate", "sweep", "bounds", "generate", "demo", "policies"]


def _kvoffload(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "kvoffload", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_percent_signs_once(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line per paragraph: '5%' is not split
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    assert "%%" not in text
    if command in ("simulate", "sweep", "bounds"):
        assert "1%,5%" in text or "1%,2%,5%" in text


def test_generate_summary_rounds_the_duration_and_hides_empty_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "w.jsonl"
    assert cli.main(["generate", "--requests", "50", "-o", str(path), "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    duration = summary["duration_s"]
    assert duration == round(duration, 3) and duration > 0
    assert cli.main(["generate", "--requests", "50", "-o", str(path)]) == 0
    table = capsys.readouterr().out
    assert "None" not in table and "first_skip_error" not in table
    assert f"{duration}" in table


BAD_POLICY = '''
from kvoffload.policies.lru import LRUCachePolicy


class Bad(LRUCachePolicy):
    """Evicts the blocks it is asked to keep first (pinned or not): breaks the contract."""

    def evict(self, n, protected):
        if n <= 0:
            return []
        if n > len(self._evictable):
            return None
        chosen = [key for key in protected if key in self._blocks][:n]
        chosen += [key for key in self._evictable if key not in chosen][: n - len(chosen)]
        for key in chosen:
            self._evictable.pop(key, None)
        return [(key, self._blocks.pop(key)) for key in chosen]
'''


def test_out_of_tree_warning_is_printed_once_per_run(tmp_path: Path) -> None:
    (tmp_path / "oot_once.py").write_text(
        "from kvoffload.policies.lru import LRUCachePolicy\n\n\n"
        "class Mine(LRUCachePolicy):\n    pass\n"
    )
    argv = ["simulate", "--policy", "oot_once:Mine", "--requests", "100"]
    done = _kvoffload(*argv, "--workers", "2", "--no-progress", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Loading out-of-tree") == 1, done.stderr


def _one_error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvoffload: error: "), captured.err
    return lines[0]


def test_simulate_a_directory_names_it_without_errno(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _one_error_line(capsys, "simulate", str(tmp_path), "--policy", "lru")
    assert "Errno" not in line and "is a directory; give a trace file" in line


def test_simulate_a_csv_trace_says_csv_is_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.csv"
    path.write_text('timestamp,input_length,hash_ids\n0,600,"[1, 2]"\n')
    line = _one_error_line(capsys, "simulate", str(path), "--policy", "lru")
    assert "CSV is not read" in line and "csv.DictReader" in line


def test_simulate_a_generic_trace_with_input_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "g.jsonl"
    path.write_text('{"hash_ids": [1, 2], "input_length": 600}\n{"hash_ids": [1, 3]}\n')
    argv = ["simulate", str(path), "--policy", "lru", "--capacity", "2", "--workers", "1"]
    assert cli.main([*argv, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"][0]["requests"] == 2 and out["results"][0]["block_hits"] == 1


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_broken_user_policy_is_blamed_by_name_not_reported_as_our_bug(
    tmp_path: Path, workers: str
) -> None:
    (tmp_path / "badpol_cli.py").write_text(BAD_POLICY)
    argv = ["simulate", "--policy", "badpol_cli:Bad", "--requests", "300", "--overlap"]
    done = _kvoffload(
        *argv, "--workers", workers, "--no-progress", "--format", "json", cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    assert "internal error" not in done.stderr and "this is a bug" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("kvoffload:")]
    assert len(errors) == 1 and errors[0].startswith("kvoffload: error: policy 'badpol_cli:Bad'")
    assert "check_policy_conformance" in errors[0]
    # The check the line shows, run as written, names the broken rule.
    code = errors[0].split('python -c "', 1)[1].split('"', 1)[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    check = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert check.returncode != 0 and "breaks the rule 'never evict protected'" in check.stderr


def test_a_failing_builtin_replay_is_still_our_bug(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvoffload.sim.sweep as sweep

    def broken(*args: object, **kwargs: object) -> None:
        raise AttributeError("a bug of ours")

    monkeypatch.setattr(sweep, "replay", broken)
    argv = ["simulate", "--policy", "lru", "--requests", "50", "--workers", "1", "--no-bounds"]
    assert cli.main(argv) == 70
    assert "internal error: AttributeError: a bug of ours" in capsys.readouterr().err


def test_demo_with_a_disk_path_that_is_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    afile = tmp_path / "kv"
    afile.write_text("a file")
    line = _one_error_line(capsys, "demo", "--disk", str(afile), "--requests", "5")
    assert "tiers[0].path' must be a directory" in line and str(afile) in line
