"""The kvoffload command: every subcommand, its JSON schema, and its errors."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import kvoffload.cli as cli_package
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


def test_simulate_one_run_has_the_grid_shape(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "simulate", *SMALL, "--policy", "lru", "--capacity", "5%")
    assert set(out) == {"trace", "results", "bounds"}
    assert len(out["results"]) == 1 and len(out["bounds"]) == 1
    record = {**out["results"][0], "trace": out["trace"], "bounds": out["bounds"][0]}
    assert set(record) >= SIMULATE_KEYS
    assert "elapsed_s" not in record and "blocks_per_s" not in record
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


def test_simulate_with_no_arguments_runs_every_builtin_policy_auto_included() -> None:
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
    assert "auto" in names
    assert [r["policy"] for r in out["results"]] == names * 3  # auto too: the adaptive answer
    assert {r["capacity"] for r in out["results"]} == {"1%", "5%", "25%"}
    assert len(out["bounds"]) == 3


def test_simulate_ends_with_one_answer_per_capacity_and_names_what_auto_ran() -> None:
    """Piped (not a terminal), every answer and legend line stays whole, however long."""
    argv = [*SMALL, "--policy", "lru,arc,mq,auto", "--capacity", "2%,9000", "--no-progress"]
    proc = subprocess.run(
        [sys.executable, "-m", "kvoffload.cli", "simulate", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    answers = [line for line in lines if line.startswith("At ")]
    assert len(answers) == 2, proc.stdout
    for line in answers:
        assert re.fullmatch(
            r"At .+: use \S+( -> \S+)?, prefix hit 0\.\d{4}.*"
            r"(over lru \(0\.\d{4}.*\)\.|no policy beats lru here\.)",
            line,
        ), line
    reminder = lines[lines.index(answers[-1]) + 1]
    assert reminder.startswith("These answers hold for this generated workload")
    assert reminder.endswith("picks among its candidates online.")  # one line, not cut
    auto_rows = [ln for ln in lines if ln.startswith(" auto -> ") and " 0." in ln]
    assert len(auto_rows) == 2  # one per capacity, each naming its candidate
    assert all(re.match(r"\s*auto -> (mq|kvaware|arc)\b", row) for row in auto_rows)
    legend = [line for line in lines if line.startswith("block hit: share")]
    assert len(legend) == 1 and legend[0].endswith("weighed by its tokens.")


def test_answer_lines_say_when_lru_was_not_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", *SMALL, "--policy", "arc,fifo", "--capacity", "2%"]) == 0
    out = capsys.readouterr().out
    assert "lru was not in this run." in " ".join(out.split())
    assert cli.main(["simulate", *SMALL, "--policy", "arc", "--capacity", "2%"]) == 0
    assert "At 2%" not in capsys.readouterr().out  # one policy: nothing to choose


def test_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "bounds", *SMALL[:2], "--capacity", "5%")
    assert set(out) == {"trace", "bounds"}
    (one,) = out["bounds"]
    assert set(one) >= BOUNDS_KEYS and one["capacity"] == "5%"
    assert one["belady_hit_ratio"] <= one["opt_bypass_hit_ratio"] <= one["infinite_hit_ratio"]
    many = run_json(capsys, "bounds", *SMALL[:2])
    assert [b["capacity"] for b in many["bounds"]] == ["1%", "5%", "10%", "25%"]
    assert cli.main(["bounds", *SMALL[:2]]) == 0
    assert "Belady MIN" in capsys.readouterr().out


@needs_shared_trace
def test_bounds_on_the_shared_trace(capsys: pytest.CaptureFixture[str]) -> None:
    (one,) = run_json(capsys, "bounds", str(SHARED_TRACE), "--capacity", "2196")["bounds"]
    assert round(one["belady_hit_ratio"], 4) == 0.3955


def test_generate_then_simulate_the_file_equals_the_embedded_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "w.jsonl.gz"
    summary = run_json(capsys, "generate", "--requests", "200", "--seed", "4", "-o", str(path))
    assert summary["requests"] == 200 and summary["config"]["seed"] == 4
    args = ["--policy", "arc", "--capacity", "3%", "--workers", "1"]
    (from_file,) = run_json(capsys, "simulate", str(path), *args)["results"]
    (embedded,) = run_json(capsys, "simulate", "--requests", "200", "--seed", "4", *args)["results"]
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
        assert (tmp_path / "plots" / "hit_ratio_curve.png").exists()
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
    assert "workload think_time_s must be a finite number" in run_error(
        capsys, "bounds", "--workload-param", "think_time_s=x"
    )


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "trace file not found" in run_error(capsys, "simulate", str(tmp_path / "none.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}\n{oops\n')
    assert f"{bad}:2: not valid JSON" in run_error(capsys, "simulate", str(bad))
    assert "Unknown cache policy: 'nope'" in run_error(capsys, "simulate", "--policy", "nope")
    assert "cannot read capacity" in run_error(capsys, "bounds", "--capacity", "lots")
    assert "--bytes-per-token" in run_error(capsys, "bounds", "--capacity", "8GiB")
    assert "no policy run accepts 'x' (lru)" in run_error(
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
    with pytest.raises(cli.UserError, match="cannot read capacity"):
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


def test_demo_without_torch_has_help_and_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    monkeypatch.delitem(sys.modules, "kvoffload.cli.toy_engine", raising=False)
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", "--help"])
    assert info.value.code == 0
    assert "--kv-heads" in capsys.readouterr().out
    assert "needs PyTorch" in run_error(capsys, "demo")


def test_demo_runs_the_toy_engine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[object] = []
    fake = types.ModuleType("kvoffload.cli.toy_engine")

    def run(args: argparse.Namespace) -> int:
        calls.append(args.requests)
        return 0

    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvoffload.cli.toy_engine", fake)
    monkeypatch.setattr(cli_package, "toy_engine", fake, raising=False)
    assert cli.main(["demo", "--requests", "7"]) == 0
    assert calls == [7]
    assert "--requests must be >= 1" in run_error(capsys, "demo", "--requests", "0")


def test_outputs_are_checked_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvoffload.cli.grid as grid

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the grid ran although an output was bad")

    monkeypatch.setattr(grid, "run_sweep", never)
    missing = tmp_path / "nonexistent" / "out.json"
    assert "does not exist" in run_error(capsys, "simulate", *SMALL, "-o", str(missing))
    (tmp_path / "d.json").mkdir()
    assert "is a directory" in run_error(capsys, "simulate", *SMALL, "-o", str(tmp_path / "d.json"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "--plot" in run_error(capsys, "simulate", *SMALL, "--plot", str(blocker / "plots"))
    assert not missing.parent.exists()


def test_the_table_is_printed_even_when_a_file_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvoffload.cli.output as output

    good, bad = tmp_path / "ok.csv", tmp_path / "gone" / "r.json"
    argv = ["simulate", *SMALL, "--policy", "lru", "--capacity", "5%", "-o", str(bad)]
    argv += ["-o", str(good)]
    monkeypatch.setattr(output, "check_outputs", lambda *a: None)  # as if it broke mid-run
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert "capacity 5% = " in captured.out and "lru" in captured.out
    assert f"--output '{bad}' was not written" in captured.err
    assert good.read_text().startswith("policy,")


def test_per_policy_params(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", *SMALL, "--capacity", "5%", "--no-bounds"]
    out = run_json(capsys, *base, "--policy", "lru,2q", "--param", "2q.a_in_ratio=0.3")
    assert [r["policy"] for r in out["results"]] == ["lru", "2q(a_in_ratio=0.3)"]
    bare = run_json(capsys, *base, "--policy", "lru,2q", "--param", "a_in_ratio=0.3")
    assert [r["policy"] for r in bare["results"]] == ["lru", "2q(a_in_ratio=0.3)"]
    assert bare["results"] == out["results"]
    plain = run_json(capsys, *base, "--policy", "2q")["results"][0]
    assert plain["block_hits"] != out["results"][1]["block_hits"]  # the parameter was used
    assert "policy 'lfu' is not one of the policies run (lru, 2q)" in run_error(
        capsys, *base, "--policy", "lru,2q", "--param", "lfu.x=1"
    )
    assert "'lru'" in run_error(capsys, *base, "--policy", "lru,2q", "--param", "lru.a_in_ratio=1")
    assert "'2q'" in run_error(capsys, *base, "--policy", "lru,2q", "--param", "2q.a_in_ratio=7")


def test_json_and_files_need_no_rich(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    import kvoffload.sim.report as report

    monkeypatch.delitem(sys.modules, "kvoffload.sim.report.table", raising=False)
    monkeypatch.delattr(report, "table", raising=False)
    monkeypatch.setitem(sys.modules, "rich", None)  # `import rich` now fails
    argv = ["sweep", *SMALL, "--policy", "lru", "--capacity", "5%"]
    out = run_json(capsys, *argv, "-o", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.csv"))
    assert out == json.loads((tmp_path / "r.json").read_text())
    assert "cli]" in run_error(capsys, *argv)  # a table says which extra it needs


def test_table_fits_80_columns_marks_the_best_and_explains_itself(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "COLUMNS": "80",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    argv = ["simulate", *SMALL, "--policy", "lru,arc,prefix-lru", "--capacity", "2%,9000"]
    cmd = [sys.executable, "-c", "import sys, rich.console as c; c.Console.is_terminal = True; "
           "from kvoffload.cli import main; sys.exit(main(sys.argv[1:]))", *argv]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    text = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)  # no colours, just the characters
    lines = text.splitlines()
    assert "…" not in text
    table = [line for line in lines if "0." in line]
    assert table and max(len(line) for line in table) <= 80
    assert sum(" * " in line or line.rstrip().endswith("*") for line in lines) >= 2
    words = " ".join(text.split())  # the legend wraps at 80 columns
    for phrase in ("prefix hit:", "of OPT:", "best policy"):
        assert phrase in words
    assert "blocks/s" not in text


def test_timing_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", *SMALL, "--policy", "lru", "--capacity", "5%", "--no-bounds"]
    (timed,) = run_json(capsys, *argv, "--timing")["results"]
    assert timed["elapsed_s"] > 0 and "blocks_per_s" in timed
    assert cli.main([*argv, "--timing"]) == 0
    assert "blocks/s" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["policies", "simulate", "sweep", "bounds", "generate", "demo"])
def test_help_describes_every_option_in_80_columns(command: str) -> None:
    env = {
        **os.environ,
        "COLUMNS": "80",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "kvoffload", command, "--help"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    body = text.partition("\n\n")[2]
    description = body.partition("\n\n")[0]
    assert description.strip() and not description.startswith(("options", "positional"))
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not line.startswith("  -") or stripped in ("-h, --help",):
            continue
        head = line[2:].split("  ", 1)
        has_help = len(head) == 2 and head[1].strip()
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        has_help = has_help or (nxt.startswith(" " * 8) and not nxt.strip().startswith("-"))
        assert has_help, f"{command}: option without help: {stripped}"


def test_policy_module_in_the_current_directory_loads_as_with_python_m(tmp_path: Path) -> None:
    (tmp_path / "my_policy_mod.py").write_text(
        "from kvoffload.policies.lru import LRUCachePolicy\n\n"
        "class Mine(LRUCachePolicy):\n    pass\n"
    )
    script = (
        "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
        "sys.path[0:0] = ['/nonexistent-bin']; from kvoffload.cli import main; sys.exit(main())"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = ["simulate", "--requests", "50", "--workers", "1", "--capacity", "5%", "--no-bounds"]
    argv += ["--policy", "my_policy_mod:Mine", "--format", "json"]
    proc = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"][0]["policy"] == "my_policy_mod:Mine"


def test_a_bug_is_not_reported_as_bad_input(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvoffload.cli.grid as grid

    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("unsupported operand")

    monkeypatch.setattr(grid, "run_sweep", broken)
    assert cli.main(["simulate", *SMALL, "--policy", "lru"]) == 70
    err = capsys.readouterr().err
    assert "internal error: TypeError: unsupported operand" in err and "--debug" in err
    assert "kvoffload: error:" not in err
