"""``kvoffload demo --engine hf`` with a small model: bit-exact verdict, a warm restart from
``--disk``, and a second engine process reusing the first's conversations through Redis."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.25")  # cache= (see the module)
pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tiers"))

from kvoffload.cli import main

SMALL = ["demo", "--engine", "hf", "--layers", "2", "--hidden", "128", "--heads", "4",
         "--kv-heads", "2", "--vocab", "1000", "--conversations", "2", "--turns", "2",
         "--system-tokens", "64", "--user-tokens", "20", "40", "--answer-tokens", "10", "20",
         "--block-tokens", "16", "--cpu-mib", "16", "--format", "json"]  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *extra: str) -> object:
    assert main([*SMALL, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_hf_demo_is_exact_and_reuses_the_system_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys)
    assert isinstance(out, dict)
    assert out["exactness"] == {"checked": 4, "bit_identical": 4}
    assert out["tokens_reused"] > 0 and out["tokens_computed"] < out["tokens_cold"]
    assert set(out["restore_ms_per_1k_tokens"]) == {"cpu"}
    assert out["ttft_cpu_s"]["cold_median"] > 0 and out["failed_stores"] == 0


def test_hf_demo_twice_on_one_disk_starts_warm(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    first = _run(capsys, "--disk", str(tmp_path))
    second = _run(capsys, "--disk", str(tmp_path))
    assert isinstance(first, dict) and isinstance(second, dict)
    assert second["exactness"] == {"checked": 4, "bit_identical": 4}
    # The restart computes only what no earlier run could store: each prompt's last block.
    assert second["tokens_reused"] > first["tokens_reused"]
    assert "disk" in second["restore_ms_per_1k_tokens"]
    assert second["bytes"]["disk"]["read"] > 0


def test_hf_demo_second_instance_reuses_the_first_through_redis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("redis")
    from redis_servers import ci_url

    url = ci_url("KVOFFLOAD_REDIS_URL")
    out = _run(capsys, "--redis", url, "--instances", "2")
    assert isinstance(out, list) and len(out) == 2
    first, second = out
    assert second["pid"] != first["pid"]
    assert second["exactness"] == {"checked": 4, "bit_identical": 4}
    assert second["tokens_reused"] > first["tokens_reused"]
    assert "redis" in second["restore_ms_per_1k_tokens"]
