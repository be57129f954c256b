"""``kvoffload demo``: runs end to end, and its byte check really catches corruption."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from kvoffload.cli import main  # noqa: E402
from kvoffload.transfer import cpu_worker  # noqa: E402

ARGS = ["demo", "--requests", "25", "--layers", "2", "--kv-heads", "2", "--cpu-mib", "4",
        "--device", "cpu", "--format", "json"]  # fmt: skip


def test_demo_verifies_every_loaded_block(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--blocks-per-chunk", "2", "--policy", "arc"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["loaded_blocks_verified"] == out["hit_blocks"] > 0
    assert out["loaded_blocks_wrong"] == 0 and out["failed_transfers"] == 0
    assert out["stored_bytes"] > 0 and out["loaded_bytes"] > 0 and out["load_gbps"] > 0
    assert 0 < out["hit_ratio"] < 1 and out["evictions"] > 0  # a 4 MiB tier must evict


def test_demo_heads_first_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--kind", "heads_first", "--dtype", "float32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["loaded_blocks_verified"] == out["hit_blocks"] > 0
    assert out["loaded_blocks_wrong"] == 0 and out["failed_transfers"] == 0


def test_demo_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for a in ARGS if a not in ("--format", "json")]
    assert main([*args, "--kind", "mla", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "hit_ratio" in out and "verification            OK" in out


def test_demo_detects_a_corrupted_load(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    original = cpu_worker.copy_pairs

    def corrupting(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        original(dst, src)
        if dst:
            dst[-1].view(-1)[0] ^= 1  # flip one bit of the last page of every copy

    monkeypatch.setattr(cpu_worker, "copy_pairs", corrupting)
    assert main([*ARGS, "--seed", "1"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["loaded_blocks_wrong"] > 0


def test_demo_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--requests", "0"]) == 1
    assert "--requests must be >= 1" in capsys.readouterr().err
    assert main(["demo", "--dtype", "float128"]) == 1
    assert "no dtype" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_demo_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    args = [a if a != "cpu" else "cuda" for a in ARGS]
    assert main([*args, "--blocks-per-chunk", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"].startswith("cuda")
    assert out["loaded_blocks_verified"] > 0 and out["loaded_blocks_wrong"] == 0
