"""The kvoffload command: every subcommand, its JSON schema, and its errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from conftest import SHARED_TRACE, needs_shared_trace
from kvoffload import cli
from kvoffload.policies import BUILTIN_POLICIES

SMALL = ["--requests", "200", "--workers", "1"]
SIMULATE_KEYS = {
    "policy",
    "capacity_blocks",
    "mode",
    "requests",
    "block_accesses",
    "block_hits",
    "block_hit_ratio",
    "prefix_hit_ratio",
    "token_hit_ratio",
    "evictions",
    "elapsed_s",
}
BOUNDS_KEYS = {"infinite_hit_ratio", "belady_hit_ratio", "opt_bypass_hit_ratio"}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert cli.main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def run_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvoffload: error: ")
    return lines[0]


def test_policies(capsys: pytest.CaptureFixture[str]) -> None:
    listed = run_json(capsys, "policies")["policies"]
    by_name = {p["name"]: p for p in listed}
    for name, module, class_name, description in BUILTIN_POLICIES:
        assert by_name[name]["description"] == description
        assert by_name[name]["source"] == "built-in"
        assert by_name[name]["target"] == f"{module}:{class_name}"
    assert cli.main(["policies"]) == 0
    assert "lru" in capsys.readouterr().out


def test_simulate_one_run_is_one_flat_object(capsys: pytest.CaptureFixture[str]) -> None:
    record = run_json(capsys, "simulate", *SMALL, "--policy", "lru", "--capacity", "5%")
    assert set(record) >= SIMULATE_KEYS
    assert record["policy"] == "lru" and record["mode"] == "prefix" and record["requests"] == 200
    unique = record["trace"]["unique_blocks"]
    assert record["capacity_blocks"] == int(unique * 5 / 100)
    assert record["block_hits"] / record["block_accesses"] == pytest.approx(
        record["block_hit_ratio"]
    )
    assert set(record["bounds"]) >= BOUNDS_KEYS
    assert record["bounds"]["opt_bypass_hit_ratio"] >= record["prefix_hit_ratio"]


def test_simulate_grid_and_blocks_mode(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys,
        "simulate",
        *SMALL,
        "--policy",
        "lru,arc",
        "--capacity",
        "1%",
        "--capacity",
        "300",
        "--mode",
        "blocks",
    )
    assert [(r["policy"], r["capacity"]) for r in out["results"]] == [
        ("lru", "1%"),
        ("arc", "1%"),
        ("lru", "300"),
        ("arc", "300"),
    ]
    assert all(set(r) >= SIMULATE_KEYS and r["mode"] == "blocks" for r in out["results"])
    assert len(out["bounds"]) == 2 and out["trace"]["requests"] == 200


def test_simulate_table_shows_policies_and_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", *SMALL, "--policy", "arc", "--capacity", "2%"]) == 0
    out = capsys.readouterr().out
    for text in ("arc", "Belady MIN", "OPT (bypass)", "infinite cache", "200 requests"):
        assert text in out


def test_simulate_with_no_arguments_runs_every_builtin_policy() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvoffload.cli", "simulate", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    names = [name for name, *_ in BUILTIN_POLICIES]
    assert [r["policy"] for r in out["results"]] == names * 3
    assert {r["capacity"] for r in out["results"]} == {"1%", "5%", "25%"}
    assert len(out["bounds"]) == 3


def test_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    one = run_json(capsys, "bounds", *SMALL[:2], "--capacity", "5%")
    assert set(one) >= BOUNDS_KEYS
    assert one["belady_hit_ratio"] <= one["opt_bypass_hit_ratio"] <= one["infinite_hit_ratio"]
    many = run_json(capsys, "bounds", *SMALL[:2])
    assert [b["capacity"] for b in many["bounds"]] == ["1%", "5%", "10%", "25%"]
    assert cli.main(["bounds", *SMALL[:2]]) == 0
    assert "Belady MIN" in capsys.readouterr().out


@needs_shared_trace
def test_bounds_on_the_shared_trace(capsys: pytest.CaptureFixture[str]) -> None:
    one = run_json(capsys, "bounds", str(SHARED_TRACE), "--capacity", "2196")
    assert round(one["belady_hit_ratio"], 4) == 0.3955


def test_generate_then_simulate_the_file_equals_the_embedded_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "w.jsonl.gz"
    summary = run_json(capsys, "generate", "--requests", "200", "--seed", "4", "-o", str(path))
    assert summary["requests"] == 200 and summary["config"]["seed"] == 4
    args = ["--policy", "arc", "--capacity", "3%", "--workers", "1"]
    from_file = run_json(capsys, "simulate", str(path), *args)
    embedded = run_json(capsys, "simulate", "--requests", "200", "--seed", "4", *args)
    assert from_file["block_hits"] == embedded["block_hits"]
    assert from_file["capacity_blocks"] == embedded["capacity_blocks"]


def test_generate_to_stdout_writes_mooncake_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", "--requests", "30", "--strict-mooncake"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 30
    assert set(json.loads(lines[0])) == {"timestamp", "input_length", "output_length", "hash_ids"}


def test_sweep_writes_json_csv_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "sweep",
        *SMALL,
        "--policy",
        "lru",
        "--capacity",
        "2%,10%",
        "-o",
        str(tmp_path / "r.json"),
        "-o",
        str(tmp_path / "r.csv"),
    ]
    try:
        import matplotlib  # noqa: F401

        argv += ["--plot", str(tmp_path / "plots")]
    except ImportError:
        pass
    assert cli.main(argv) == 0
    written = json.loads((tmp_path / "r.json").read_text())
    assert len(written["results"]) == 2 and len(written["bounds"]) == 2
    assert (tmp_path / "r.csv").read_text().startswith("policy,")
    if "--plot" in argv:
        assert (tmp_path / "plots" / "miss_ratio_curve.png").exists()
    assert "lru" in capsys.readouterr().out


def test_workload_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys,
        "bounds",
        "--requests",
        "100",
        "--workload-param",
        "think_time_s=5",
        "--workload-param",
        'arrival="bursty"',
        "--capacity",
        "10",
    )
    assert out["trace"]["requests"] == 100
    assert "unknown workload knob 'nope'" in run_error(
        capsys, "bounds", "--workload-param", "nope=1"
    )
    assert "takes a float" in run_error(capsys, "bounds", "--workload-param", "think_time_s=x")


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "trace file not found" in run_error(capsys, "simulate", str(tmp_path / "none.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}\n{oops\n')
    assert f"{bad}:2: not valid JSON" in run_error(capsys, "simulate", str(bad))
    assert "Unknown cache policy: 'nope'" in run_error(capsys, "simulate", "--policy", "nope")
    assert "cannot read capacity" in run_error(capsys, "bounds", "--capacity", "lots")
    assert "--bytes-per-token" in run_error(capsys, "bounds", "--capacity", "8GiB")
    assert "Bad cache_policy_params" in run_error(
        capsys, "simulate", *SMALL, "--policy", "lru", "--param", "x=1"
    )
    assert "KEY=VALUE" in run_error(capsys, "simulate", "--param", "oops")
    assert "need no trace" in run_error(capsys, "simulate", str(bad), "--requests", "5")
    assert "admission filter" in run_error(
        capsys, "simulate", *SMALL, "--admission", "kvoffload.admission:Nope"
    )
    assert ".json or .csv" in run_error(
        capsys, "sweep", *SMALL, "--policy", "lru", "--capacity", "5", "--no-bounds", "-o", "x.txt"
    )


def test_skip_bad_lines_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}\n{oops\n')
    out = run_json(capsys, "bounds", str(bad), "--skip-bad-lines", "--capacity", "1")
    assert out["trace"]["skipped_lines"] == 1


def test_usage_errors_exit_2_and_debug_shows_the_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["simulate", "--mode", "sideways"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        cli.main([])
    with pytest.raises(ValueError, match="cannot read capacity"):
        cli.main(["bounds", "--capacity", "lots", "--debug"])


def test_console_script_errors_have_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvoffload.cli", "simulate", str(tmp_path / "missing.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"kvoffload: error: trace file not found: {tmp_path / 'missing.jsonl'}"
    ]


def test_demo_is_loaded_lazily(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_torch(name: str) -> None:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(cli.importlib, "import_module", no_torch)
    assert "needs PyTorch" in run_error(capsys, "demo")
    monkeypatch.undo()

    calls: list[object] = []
    fake = types.ModuleType("kvoffload.transfer.demo")

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--blocks", type=int, default=3)

    def run(args: argparse.Namespace) -> int:
        calls.append(args.blocks)
        return 0

    fake.add_arguments = add_arguments  # type: ignore[attr-defined]
    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvoffload.transfer.demo", fake)
    assert cli.main(["demo", "--blocks", "7"]) == 0
    assert calls == [7]
