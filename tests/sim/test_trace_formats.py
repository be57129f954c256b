"""Trace formats as plug-ins, bounded lines, corrupt files and bad bytes reported where they are."""

from __future__ import annotations

import gzip
import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from sim_helpers import write_jsonl

from kvoffload import cli
from kvoffload.sim.traces import (
    TRACE_FORMAT_REGISTRY,
    MixedBlockIdWarning,
    ReaderState,
    TraceFormat,
    TraceFormatError,
    TraceReader,
    TraceRecord,
    load_trace,
    trace_format_choices,
)


def mooncake(ts: int, ids: list[Any]) -> dict[str, object]:
    return {"timestamp": ts, "input_length": 512 * len(ids), "output_length": 1, "hash_ids": ids}


class CsvishFormat(TraceFormat):
    """A test format: {"blocks": "a b c", "t": seconds}, 16-token blocks."""

    name = "csvish"
    default_block_tokens = 16
    length_field = "tokens"
    detect_priority = 50

    def detect(self, obj: dict[str, Any]) -> bool:
        return "blocks" in obj

    def parse(self, obj: dict[str, Any], state: ReaderState) -> TraceRecord:
        return TraceRecord(obj["blocks"].split(), float(obj["t"]), obj.get("tokens"))


def test_a_new_format_is_one_class_and_one_line(tmp_path: Path) -> None:
    with TRACE_FORMAT_REGISTRY.snapshot():
        TRACE_FORMAT_REGISTRY.register("csvish", f"{__name__}:CsvishFormat")
        assert trace_format_choices() == (
            "auto",
            "mooncake",
            "lmcache",
            "hash_ids",
            "keys_hex",
            "csvish",
        )
        records = [{"blocks": "a b", "t": 5}, {"blocks": "a c", "t": 7, "tokens": 20}]
        reader = TraceReader(write_jsonl(tmp_path / "t.jsonl", records))
        first, second = list(reader)
        assert first.block_ids == [0, 1] and first.last_block_tokens == 16
        assert reader.detected_format == "csvish" and reader.block_tokens == 16
        assert second.block_ids == [0, 2] and second.timestamp_s == 2.0
        assert second.last_block_tokens == 4
        bad = write_jsonl(tmp_path / "b.jsonl", [{"blocks": "a b", "t": 0, "tokens": 99}])
        with pytest.raises(TraceFormatError, match=r"'tokens' = 99 does not fit 2 blocks of 16"):
            load_trace(bad)
    assert "csvish" not in trace_format_choices()


def test_unknown_format_names_get_a_did_you_mean(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"format 'Mooncake'\. Did you mean 'mooncake'"):
        TraceReader(tmp_path / "x", fmt="Mooncake")


def test_a_format_that_cannot_load_is_skipped_by_auto_detection(tmp_path: Path) -> None:
    with TRACE_FORMAT_REGISTRY.snapshot():
        TRACE_FORMAT_REGISTRY.register("broken", "no_such_trace_format_module:X")
        path = write_jsonl(tmp_path / "t.jsonl", [mooncake(0, [1, 2])])
        assert load_trace(path).requests[0].block_ids == [0, 1]
        with pytest.raises(ImportError, match="no_such_trace_format_module"):
            TraceReader(path, fmt="broken")


def test_a_line_without_end_fails_fast_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(mooncake(0, [1])) + "\n" + "x" * 5000)
    with pytest.raises(TraceFormatError, match=r"long.jsonl:2: line is longer than 1,000 bytes"):
        list(TraceReader(path, max_line_bytes=1000))
    with pytest.raises(TraceFormatError, match="longer than"):  # not skippable
        list(TraceReader(path, max_line_bytes=1000, skip_bad_lines=True))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_simulating_dev_zero_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "/dev/zero", "--no-bounds", "--workers", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "/dev/zero:1: line is longer than" in err[0]


def _gzip_trace(tmp_path: Path, n: int = 300) -> bytes:
    text = "".join(json.dumps(mooncake(i, [i, i + 1, i + 2])) + "\n" for i in range(n))
    return gzip.compress(text.encode(), mtime=0)


def test_a_bit_flipped_gzip_is_a_trace_error_wherever_the_flip(tmp_path: Path) -> None:
    data = _gzip_trace(tmp_path)
    path = tmp_path / "t.jsonl.gz"
    kinds = set()
    for position in range(20, len(data) - 8, max(1, (len(data) - 28) // 40)):
        flipped = bytearray(data)
        flipped[position] ^= 0x10
        path.write_bytes(bytes(flipped))
        with pytest.raises(TraceFormatError) as info:
            load_trace(path)
        kinds.add(info.value.message.split(":")[0])
    assert any(k.startswith("cannot read the file") for k in kinds)


def test_a_bit_flipped_gzip_is_one_line_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = bytearray(_gzip_trace(tmp_path))
    data[len(data) // 2] ^= 0x10
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(bytes(data))
    assert cli.main(["simulate", str(path), "--no-bounds", "--workers", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvoffload: error: {path}:")


def test_a_non_utf8_line_is_reported_at_its_line_and_can_be_skipped(tmp_path: Path) -> None:
    lines = [json.dumps(mooncake(i, [i])).encode() for i in range(20)]
    lines[10] = lines[10].replace(b'"timestamp"', b'"time\xffstamp"')
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert info.value.line == 11 and "not valid UTF-8" in info.value.message
    trace = load_trace(path, skip_bad_lines=True)
    assert len(trace.requests) == 19 and trace.skipped_lines == 1
    assert trace.first_skip_error is not None and ":11: not valid UTF-8" in trace.first_skip_error


def test_a_number_and_its_string_are_two_blocks_with_one_warning(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [mooncake(0, [1, 2, "x"]), mooncake(1, ["1", 2]), mooncake(2, [3, "2", "3"])],
    )
    expected = r"t.jsonl: block ids 1 and '1' both appear"
    with pytest.warns(MixedBlockIdWarning, match=expected) as record:
        trace = load_trace(path)
    assert len([w for w in record if issubclass(w.category, MixedBlockIdWarning)]) == 1
    assert trace.num_unique_blocks == 7  # 1, 2, x, "1", 3, "2", "3": still distinct
    clean = write_jsonl(tmp_path / "c.jsonl", [mooncake(0, [1, 2]), mooncake(1, ["a", "01"])])
    with warnings.catch_warnings():
        warnings.simplefilter("error", MixedBlockIdWarning)
        load_trace(clean)
