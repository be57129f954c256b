"""``kvoffload demo`` with secondary tiers: a warm restart from disk, two engines on one Redis."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvoffload.cli import main  # noqa: E402

SMALL = ["demo", "--requests", "20", "--layers", "2", "--kv-heads", "2", "--cpu-mib", "1",
         "--device", "cpu", "--format", "json"]  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:  # type: ignore[type-arg]
    assert main([*SMALL, *extra]) == 0
    out: dict = json.loads(capsys.readouterr().out)  # type: ignore[type-arg]
    return out


def test_second_run_starts_warm_from_the_first_runs_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _run(capsys, "--disk", str(tmp_path), "--disk-bytes", "64MiB")
    disk = first["tiers"]["disk"]
    assert disk["blocks_written"] > 0 and disk["bytes_written"] > 0 and disk["write_gbps"] > 0
    assert first["hits_not_stored_here"] == 0  # an empty directory serves nothing it did not store
    second = _run(capsys, "--disk", str(tmp_path), "--disk-bytes", "64MiB")
    disk = second["tiers"]["disk"]
    # The same workload again, with a cold CPU tier: its hits are the first run's blocks.
    assert disk["promoted_blocks"] > 0 and disk["bytes_read"] > 0 and disk["read_gbps"] > 0
    assert second["hits_not_stored_here"] > 0
    assert second["hit_blocks"] > first["hit_blocks"]
    assert second["loaded_blocks_wrong"] == 0 and second["loaded_blocks_verified"] > 0
    assert second["tiers"]["cpu"]["promoted_in_blocks"] == disk["promoted_blocks"]


def test_demo_tier_arguments_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--disk", "/tmp/x", "--disk-bytes", "lots"]) == 1
    assert "--disk-bytes" in capsys.readouterr().err
    assert main(["demo", "--instances", "2"]) == 1
    assert "--instances needs --redis" in capsys.readouterr().err


@pytest.mark.skipif(sys.platform == "win32", reason="loopback Redis servers are POSIX-only here")
def test_two_instances_on_one_redis_share_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "tiers"))
    from redis_servers import ci_url

    url = ci_url("KVOFFLOAD_REDIS_URL")
    assert main([*SMALL, "--redis", url, "--instances", "2"]) == 0
    first, second = json.loads(capsys.readouterr().out)["instances"]
    assert first["pid"] != second["pid"]  # two engine processes
    assert first["tiers"]["redis"]["blocks_written"] > 0
    # The first engine met a fresh namespace: nothing it had not stored itself could hit.
    assert first["hits_not_stored_here"] == 0
    # The second engine's CPU tier starts cold: what it hits that it never stored is the
    # first engine's, read from Redis.
    assert second["hits_not_stored_here"] > 0
    assert second["tiers"]["redis"]["promoted_blocks"] > 0
    assert second["tiers"]["redis"]["bytes_read"] > 0
    assert second["loaded_blocks_wrong"] == 0
