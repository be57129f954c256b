"""``kvoffload mrc`` and the warm-up / window options of ``simulate``: end to end."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvoffload.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_mrc_exact_equals_simulate_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--requests", "300", "--capacity", "2%,20%", "--format", "json"]
    curve = run_json(capsys, "mrc", *common)
    sim = run_json(
        capsys,
        "simulate",
        *common,
        "--mode",
        "blocks",
        "--policy",
        "lru",
        "--no-bounds",
        "--workers",
        "1",
    )
    assert [p["block_hits"] for p in curve["points"]] == [r["block_hits"] for r in sim["results"]]
    assert [p["token_hits"] for p in curve["points"]] == [r["token_hits"] for r in sim["results"]]


def test_mrc_writes_json_csv_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_csv, plots = tmp_path / "c.json", tmp_path / "c.csv", tmp_path / "plots"
    status = main(
        ["mrc", "--requests", "300", "--points", "6", "--policy", "lru,arc", "--window-s", "60",
         "-o", str(out_json), "-o", str(out_csv), "--plot", str(plots), "--sample-blocks", "0"]
    )  # fmt: skip
    assert status == 1  # per-window figures are for exact LRU only: a user error
    capsys.readouterr()
    status = main(
        ["mrc", "--requests", "300", "--points", "6", "--policy", "lru", "--window-s", "60",
         "-o", str(out_json), "-o", str(out_csv), "--plot", str(plots)]
    )  # fmt: skip
    assert status == 0
    record = json.loads(out_json.read_text())
    assert len(record["points"]) == 6 and record["windows"]
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 6 + len(record["windows"])
    assert (plots / "hit_ratio_curve.png").stat().st_size > 0
    assert (plots / "hit_ratio_over_time.png").stat().st_size > 0


def test_simulate_warmup_and_windows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    windows = tmp_path / "w.csv"
    record = run_json(
        capsys, "simulate", "--requests", "300", "--policy", "lru", "--capacity", "5%",
        "--no-bounds", "--workers", "1", "--warmup-requests", "50", "--window-s", "60",
        "--windows-output", str(windows), "--format", "json",
    )  # fmt: skip
    (result,) = record["results"]
    assert result["requests"] == 250
    assert result["windows"] and sum(w["requests"] for w in result["windows"]) == 250
    rows = list(csv.DictReader(windows.open()))
    assert len(rows) == len(result["windows"])
    assert main(["simulate", "--requests", "50", "--windows-output", str(windows)]) == 1
