"""``kvoffload simulate --shadow``: shadow estimates next to each candidate's full replay."""

from __future__ import annotations

import json

import pytest

from kvoffload import cli

SMALL = ["--requests", "200", "--workers", "1", "--no-bounds", "--no-progress"]


def test_shadow_json_pairs_each_estimate_with_the_full_replay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "simulate",
        *SMALL,
        "--capacity",
        "5%",
        "--shadow",
        "lru,arc",
        "--shadow-rate",
        "1",
        "--shadow-min-blocks",
        "0",
        "--format",
        "json",
    ]
    assert cli.main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in record["results"]] == ["lru", "arc"]  # the candidates
    rows = record["shadow"]
    assert [(r["capacity"], r["candidate"]) for r in rows] == [("5%", "lru"), ("5%", "arc")]
    by_policy = {r["policy"]: r for r in record["results"]}
    for row in rows:
        actual = by_policy[row["candidate"]]
        assert row["actual_block_hit_ratio"] == actual["block_hit_ratio"]
        assert row["shadow_rate"] == 1.0
        # At the full rate the miniature is the policy at full size, driven key by key: it
        # differs from the request-level replay only by the protocol, so it is close.
        assert row["estimated_hit_ratio"] == pytest.approx(actual["block_hit_ratio"], abs=0.03)
        assert row["error"] == pytest.approx(row["estimated_hit_ratio"] - actual["block_hit_ratio"])


def test_shadow_table_and_candidates_beyond_the_policies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "simulate",
        *SMALL,
        "--capacity",
        "10%",
        "--policy",
        "lru",
        "--shadow",
        "arc",
        "--shadow",
        "lru",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "shadow estimates" in out
    line = next(row for row in out.splitlines() if " arc " in row and "10%" in row)
    assert "-" in line.split("arc", 1)[1]  # arc was not replayed: no actual figure


def test_shadow_with_an_unknown_candidate_is_a_user_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["simulate", *SMALL, "--shadow", "lru,nope"]) == 1
    assert "'nope'" in capsys.readouterr().err
    assert cli.main(["simulate", *SMALL, "--policy", "lru", "--shadow", "nope"]) == 1
    err = capsys.readouterr().err
    assert "--shadow" in err and "'nope'" in err
