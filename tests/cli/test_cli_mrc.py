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


SAMPLED = ["--requests", "600", "--capacity", "5%,20%", "--sample-rate", "0.1",
           "--sample-blocks", "0", "--format", "json"]  # fmt: skip


def ratios(record: dict) -> dict[tuple[str, str], tuple[str, float]]:
    return {
        (p["policy"], p["capacity"]): (p["method"], p["block_hit_ratio"]) for p in record["points"]
    }


def test_mrc_corrects_sampled_curves_with_lru_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exact = ratios(run_json(capsys, "mrc", *SAMPLED))
    controlled = ratios(run_json(capsys, "mrc", *SAMPLED, "--policy", "arc"))
    plain = ratios(
        run_json(capsys, "mrc", *SAMPLED, "--policy", "lru,arc", "--sampled", "--no-lru-control")
    )
    assert {method for method, _ in controlled.values()} == {"sampled+lru"}
    assert {method for method, _ in plain.values()} == {"sampled"}
    for cap in ("5%", "20%"):
        luck = plain[("lru", cap)][1] - exact[("lru", cap)][1]
        assert luck != 0.0
        assert controlled[("arc", cap)][1] == pytest.approx(
            plain[("arc", cap)][1] - luck, abs=1e-12
        )
    # --sampled alone shows LRU's sampling error (no control); asked for, LRU reads exact
    assert ratios(run_json(capsys, "mrc", *SAMPLED, "--sampled")) == plain_lru(plain)
    forced = ratios(run_json(capsys, "mrc", *SAMPLED, "--sampled", "--lru-control"))
    for cap in ("5%", "20%"):
        assert forced[("lru", cap)] == ("sampled+lru", pytest.approx(exact[("lru", cap)][1]))
    assert main(["mrc", *SAMPLED, "--policy", "arc", "--mode", "prefix", "--lru-control"]) == 1
    assert "--mode blocks" in capsys.readouterr().err


def plain_lru(plain: dict[tuple[str, str], tuple[str, float]]) -> dict:
    return {key: value for key, value in plain.items() if key[0] == "lru"}


def test_mrc_bounds_the_sample_and_the_miniatures(capsys: pytest.CaptureFixture[str]) -> None:
    half = ["--requests", "600", "--capacity", "5%,20%", "--sample-rate", "0.5",
            "--sample-blocks", "0", "--format", "json", "--policy", "arc"]  # fmt: skip
    record = run_json(capsys, "mrc", *half, "--max-sampled-blocks", "1000", "--max-blocks", "100")
    unique = record["trace"]["unique_blocks"]
    small, big = record["points"]
    assert small["sample_rate"] == pytest.approx(1000 / unique, rel=0.01)  # the draw's bound
    assert big["sample_rate"] == pytest.approx(100 / big["capacity_blocks"], rel=0.01)
    unbounded = run_json(capsys, "mrc", *half, "--max-sampled-blocks", "0", "--max-blocks", "0")
    assert [p["sample_rate"] for p in unbounded["points"]] == [0.5, 0.5]
    assert main(["mrc", *half, "--max-blocks", "100", "--sample-blocks", "256"]) == 1
    assert "--max-blocks must be 0 (no bound) or >= --sample-blocks" in capsys.readouterr().err


def test_mrc_help_names_the_sampling_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["mrc", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--max-sampled-blocks N", "--max-blocks N", "--lru-control, --no-lru-control"):
        assert flag in text
    assert "sampled+lru" in text
