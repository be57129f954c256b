"""Multi-tier replay (``--tiers``): hits per tier, bytes moved, modelled prefill time saved."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from kvoffload import cli
from kvoffload.sim.records import Trace, TraceRequest
from kvoffload.sim.replay import ReplayOptions, replay
from kvoffload.sim.tier_config import (
    TIER_TYPES,
    MediumCost,
    load_seconds,
    parse_sim_tiers,
    recompute_seconds,
    simulated_write_policies,
)
from kvoffload.sim.tiered import tiered_replay
from kvoffload.sim.workloads import WorkloadConfig, generate_workload

TIER_KEYS = {
    "tier",
    "type",
    "medium",
    "shared",
    "capacity",
    "capacity_blocks",
    "hit_blocks",
    "hit_ratio",
    "hit_tokens",
    "read_requests",
    "read_blocks",
    "read_bytes",
    "written_blocks",
    "written_bytes",
    "evictions",
    "bandwidth_bytes_per_s",
    "latency_s",
    "load_s",
    "recompute_s",
    "saved_s",
}
TOTAL_KEYS = {
    "config",
    "instances",
    "bytes_per_token",
    "block_bytes",
    "prefill_tokens_per_s",
    "hit_blocks",
    "hit_ratio",
    "prefill_s",
    "saved_s",
    "saved_share",
    "per_tier",
}
SMALL = ["--requests", "300", "--workers", "1", "--no-progress", "--policy", "lru"]


@pytest.fixture(scope="module")
def default_workload() -> Trace:
    return generate_workload(WorkloadConfig())


def config(trace: Trace, text: str, instances: int = 1):  # type: ignore[no-untyped-def]
    return parse_sim_tiers(text, trace.num_unique_blocks, trace.block_tokens, None, instances)


def test_a_bigger_secondary_strictly_adds_hits(default_workload: Trace) -> None:
    hits = [
        tiered_replay(default_workload, config(default_workload, text), "lru").prefix_hit_blocks
        for text in ("cpu=5%", "cpu=5%,disk=10%", "cpu=5%,disk=50%")
    ]
    assert hits[0] < hits[1] < hits[2], hits


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo"])
def test_cpu_only_tiers_equal_the_single_tier_replay(default_workload: Trace, policy: str) -> None:
    cfg = config(default_workload, "cpu=5%")
    tiered = tiered_replay(default_workload, cfg, policy)
    single = replay(default_workload, cfg.cpu.blocks, policy)
    for name in (
        "block_hits",
        "prefix_hit_blocks",
        "token_hits",
        "stored_blocks",
        "evictions",
        "store_failures",
        "hit_lengths",
    ):
        assert getattr(tiered, name) == getattr(single, name), name
    assert tiered.tiers is not None
    assert tiered.tiers["per_tier"][0]["hit_blocks"] == single.prefix_hit_blocks


def _request(rid: str, ids: list[int], tokens: int) -> TraceRequest:
    return TraceRequest(rid, 0.0, ids, tokens, 0, tokens - 4 * (len(ids) - 1))


def test_time_saved_on_a_hand_computed_case() -> None:
    # 4-token blocks, a CPU of 2 blocks, a disk of 10. r2 pushes 0, 1 out of the CPU (the disk
    # keeps them); r3 promotes both from the disk (one batch), r4 finds them in the CPU.
    trace = Trace(
        [
            _request("r1", [0, 1], 8),
            _request("r2", [2, 3], 8),
            _request("r3", [0, 1], 7),  # its last block holds 3 tokens
            _request("r4", [0, 1], 8),
        ],
        4,
        4,
    )
    cfg = parse_sim_tiers("cpu=2,disk=10", 4, 4)
    options = ReplayOptions(bytes_per_token=1e6, prefill_tokens_per_s=1000.0)
    result = tiered_replay(trace, cfg, "lru", options)
    assert result.tiers is not None
    cpu, disk = result.tiers["per_tier"]
    assert (cpu["hit_blocks"], cpu["hit_tokens"], cpu["read_requests"]) == (2, 8, 1)
    assert (disk["hit_blocks"], disk["hit_tokens"], disk["read_requests"]) == (2, 7, 1)
    # block = 4 tokens x 1e6 bytes; disk 5e9 B/s + 100 us, cpu 25e9 B/s + 10 us.
    cpu_load = 10e-6 + 2 * 4e6 / 25e9  # 0.00033 s
    disk_load = 100e-6 + 2 * 4e6 / 5e9 + cpu_load  # 0.00203 s: disk -> CPU, then CPU -> GPU
    assert math.isclose(cpu["load_s"], 0.00033)
    assert math.isclose(disk["load_s"], 0.00203)
    assert math.isclose(cpu["load_s"], cpu_load) and math.isclose(disk["load_s"], disk_load)
    assert math.isclose(cpu["recompute_s"], 0.008) and math.isclose(disk["recompute_s"], 0.007)
    assert math.isclose(cpu["saved_s"], 0.008 - 0.00033)
    assert math.isclose(disk["saved_s"], 0.007 - 0.00203)
    assert math.isclose(result.tiers["saved_s"], 0.00767 + 0.00497)
    assert math.isclose(result.tiers["prefill_s"], 31 / 1000)
    assert (disk["read_blocks"], disk["read_bytes"]) == (2, 8e6)
    assert (disk["written_blocks"], cpu["written_blocks"]) == (4, 6)  # 4 stores + 2 promotions
    assert result.prefix_hit_blocks == 4 and result.token_hits == 15


def test_load_and_recompute_seconds() -> None:
    cost = MediumCost(2e9, 1e-3)
    assert math.isclose(load_seconds(10, 2, 1e8, cost), 2e-3 + 0.5)
    assert math.isclose(load_seconds(10, 2, 1e8, cost, MediumCost(1e9, 0.0)), 2e-3 + 0.5 + 1.0)
    assert recompute_seconds(30000, 20000.0) == 1.5
    with pytest.raises(ValueError, match="bandwidth"):
        MediumCost(0.0, 0.0)


def test_a_shared_tier_serves_what_other_instances_stored() -> None:
    trace = generate_workload(WorkloadConfig(requests=600))
    private = tiered_replay(trace, config(trace, "cpu=5%,disk=100%", 3), "lru")
    shared = tiered_replay(trace, config(trace, "cpu=5%,redis=100%", 3), "lru")
    assert shared.prefix_hit_blocks > private.prefix_hit_blocks
    assert shared.tiers is not None and private.tiers is not None
    redis = shared.tiers["per_tier"][1]
    # One store: every block is written there once, whichever instance stored it first.
    assert redis["shared"] and redis["written_blocks"] <= trace.num_unique_blocks
    assert private.tiers["per_tier"][1]["written_blocks"] > redis["written_blocks"]
    one = tiered_replay(trace, config(trace, "cpu=5%,redis=100%"), "lru")
    assert (
        one.tiers is not None
        and one.tiers["per_tier"][1]["written_blocks"] == (redis["written_blocks"])
    )


def test_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", *SMALL, "--tiers", "cpu=5%,disk=50%,redis=100%", "--format", "json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"trace", "results", "bounds"} and out["bounds"] == []
    (result,) = out["results"]
    tiers = result["tiers"]
    assert set(tiers) == TOTAL_KEYS
    assert [t["tier"] for t in tiers["per_tier"]] == ["cpu", "disk", "redis"]
    assert all(set(t) == TIER_KEYS for t in tiers["per_tier"])
    assert sum(t["hit_blocks"] for t in tiers["per_tier"]) == result["prefix_hit_blocks"]
    assert math.isclose(sum(t["saved_s"] for t in tiers["per_tier"]), tiers["saved_s"])
    assert result["capacity"] == "cpu=5%,disk=50%,redis=100%"
    assert cli.main(["simulate", *SMALL, "--capacity", "5%", "--format", "json"]) == 0
    assert "tiers" not in json.loads(capsys.readouterr().out)["results"][0]


def test_sweep_table_csv_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("rich")
    pytest.importorskip("matplotlib")
    path = tmp_path / "grid.csv"
    argv = ["sweep", *SMALL, "--tiers", "cpu=5%", "--tiers", "cpu=5%,disk=50%"]
    assert cli.main([*argv, "-o", str(path), "--plot", str(tmp_path / "plots")]) == 0
    text = capsys.readouterr().out
    assert "cpu=5%,disk=50%" in text and "disk (50%)" in text and "all tiers" in text
    assert "recompute s: their tokens at 20,000 prefill tokens/s" in text
    rows = list(csv.DictReader(path.open()))
    assert [r["capacity"] for r in rows] == ["cpu=5%", "cpu=5%,disk=50%"]
    assert rows[0]["tier_disk_hit_blocks"] == ""  # no disk tier in the first column
    assert int(rows[1]["tier_disk_hit_blocks"]) > 0
    assert int(rows[1]["tiers_hit_blocks"]) == int(rows[1]["prefix_hit_blocks"])
    assert (tmp_path / "plots" / "tiers.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--tiers", "cpu=5%,dsk=50%"], "unknown tier type 'dsk' (did you mean 'disk'?)"),
        (["--tiers", "cpu=5%,redis=lots"], "tier 'redis': cannot read capacity 'lots'"),
        (["--tiers", "cpu=5%,disk=120%"], "tier 'disk': capacity '120%'"),
        (["--tiers", "disk=50%"], "the first tier must be cpu"),
        (["--tiers", "cpu=5%,disk"], "tier 'disk' must look like TYPE=CAPACITY"),
        (["--tiers", "cpu=5%,,disk=5%"], "empty tier"),
        (["--tiers", "cpu=0"], "tier 'cpu' capacity '0' is 0 blocks"),
        (["--tiers", "cpu=5%", "--capacity", "5%"], "drop --capacity"),
        (["--tiers", "cpu=5%", "--mode", "blocks"], "prefix mode only"),
        (["--tiers", "cpu=5%", "--tier-policy", "lruu"], "--tier-policy"),
        (["--instances", "2"], "--instances needs --tiers"),
        (["--tier-write-policy", "write_back"], "--tier-write-policy needs --tiers"),
        (["--tier-policy", "arc"], "--tier-policy needs --tiers"),
        (["--tiers", "cpu=5%", "--instances", "0"], "--instances must be an int >= 1"),
    ],
)
def test_bad_tiers_name_the_bad_part(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    assert cli.main(["simulate", *SMALL, *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("kvoffload: error: ") and needle in captured.err, captured.err


def test_every_tier_type_has_documented_costs() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
    for name, tier in TIER_TYPES.items():
        assert f"`{name}`" in text
        assert tier.cost.bandwidth_bytes_per_s > 0


def test_write_back_secondaries_hold_what_the_cpu_evicted(default_workload: Trace) -> None:
    """Written on CPU eviction, a secondary holds blocks the CPU does not: never fewer hits
    than write-through's copies of the CPU's blocks, and fewer writes of blocks still hot."""
    through = tiered_replay(default_workload, config(default_workload, "cpu=5%,disk=20%"), "lru")
    back_cfg = parse_sim_tiers(
        "cpu=5%,disk=20%",
        default_workload.num_unique_blocks,
        default_workload.block_tokens,
        write_policy="write_back",
    )
    back = tiered_replay(default_workload, back_cfg, "lru")
    assert back.tiers is not None and through.tiers is not None
    assert back.prefix_hit_blocks >= through.prefix_hit_blocks
    assert back.tiers["per_tier"][1]["hit_blocks"] > 0
    with pytest.raises(ValueError, match="tier-write-policy"):
        parse_sim_tiers("cpu=5%,disk=20%", 100, 16, write_policy="write_around")


def test_the_simulated_write_policies_are_the_tiering_managers_less_none() -> None:
    """One list of write policies (``WritePolicy``): the simulator's and the CLI's follow it."""
    from kvoffload.cli.main import build_parser
    from kvoffload.tiers.settings import WritePolicy

    assert simulated_write_policies() == ("write_through", "write_back", "selective")
    assert set(simulated_write_policies()) == {p.value for p in WritePolicy} - {"none"}
    with pytest.raises(ValueError, match="write_through, write_back, selective, got 'none'"):
        parse_sim_tiers("cpu=5%,disk=20%", 100, 16, write_policy="none")
    for policy in simulated_write_policies():
        args = build_parser().parse_args(["simulate", "--tier-write-policy", policy])
        assert args.tier_write_policy == policy
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--tier-write-policy", "none"])


def test_the_simulators_old_tier_list_names_still_import_with_a_warning() -> None:
    """``TierConfig`` / ``parse_tiers`` of ``sim.tier_config`` were documented; they warn now."""
    from kvoffload.sim import tier_config

    with pytest.warns(DeprecationWarning, match="parse_tiers is now parse_sim_tiers"):
        assert tier_config.parse_tiers is parse_sim_tiers
    with pytest.warns(DeprecationWarning, match="TierConfig is now SimTierList"):
        assert tier_config.TierConfig is tier_config.SimTierList
    with pytest.raises(AttributeError):
        tier_config.NoSuchName  # noqa: B018
