"""Trace readers: the three formats, compression, and clear errors for malformed lines."""

from __future__ import annotations

import gzip
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from sim_helpers import shared_trace_path, write_jsonl

from kvoffload.sim.traces import TraceFormatError, TraceReader, load_trace
from kvoffload.sim.traces.reader import CSV_TO_JSONL


def mooncake(ts: int, n_in: int, ids: list[int], n_out: int = 5) -> dict[str, object]:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def test_mooncake_records_and_partial_tail(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [mooncake(1000, 1100, [7, 8, 9]), mooncake(2500, 1024, [7, 8], n_out=0)],
    )
    trace = load_trace(path)
    first, second = trace.requests
    assert first.block_ids == [0, 1, 2] and second.block_ids == [0, 1]  # interned in order
    assert first.last_block_tokens == 1100 - 2 * 512 and first.has_partial_tail(512)
    assert second.last_block_tokens == 512 and not second.has_partial_tail(512)
    assert (first.timestamp_s, second.timestamp_s) == (0.0, 1.5)  # ms, relative to the first
    assert first.output_tokens == 5 and first.req_id == "1" and first.line == 1
    assert trace.num_unique_blocks == 3 and trace.block_accesses == 5
    assert trace.total_tokens == 1100 + 1024
    assert trace.block_tokens == 512


def test_generic_hash_ids_with_block_size_and_string_ids(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"hash_ids": ["a", "b"], "timestamp": 10.0, "session_id": "s1"},
            {"hash_ids": ["a", "c"], "input_length": 20},
            "",  # blank lines are ignored
        ],
    )
    trace = load_trace(path, block_tokens=16)
    a, b = trace.requests
    assert a.block_ids == [0, 1] and b.block_ids == [0, 2]
    assert a.session_id == "s1" and a.last_block_tokens == 16
    assert b.last_block_tokens == 4 and b.timestamp_s == 0.0  # no timestamp: the previous one
    assert trace.block_tokens == 16


def test_lmcache_lookup_log(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "lookups.jsonl",
        [
            {
                "timestamp": 1700000000.5,
                "request_id": "cmpl-1",
                "model": "m",
                "chunk_size": 256,
                "seq_len": 600,
                "chunk_hashes": [-5, 99, 3],
            },
            {
                "timestamp": 1700000002.0,
                "request_id": "cmpl-2",
                "chunk_size": 256,
                "seq_len": 900,
                "chunk_hashes": [-5, 99, 4],
            },  # tokens past the last chunk
        ],
    )
    reader = TraceReader(path)
    first, second = list(reader)
    assert reader.detected_format == "lmcache" and reader.block_tokens == 256
    assert first.req_id == "cmpl-1" and first.last_block_tokens == 600 - 512
    assert second.timestamp_s == 1.5 and second.block_ids == [0, 1, 3]
    assert second.last_block_tokens == 256 and second.input_tokens == 768


def test_gzip_and_zstd_are_read_transparently(tmp_path: Path) -> None:
    records = [mooncake(0, 600, [1, 2]), mooncake(5, 512, [1])]
    text = "".join(json.dumps(r) + "\n" for r in records)
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    assert [r.block_ids for r in load_trace(gz).requests] == [[0, 1], [0]]
    zstandard = pytest.importorskip("zstandard")
    zst = tmp_path / "t.bin"  # detection is by content, not by name
    zst.write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    assert [r.block_ids for r in load_trace(zst).requests] == [[0, 1], [0]]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "missing field 'hash_ids'"),
        ('{"timestamp": 0, "input_length": 10, "hash_ids": []}', "'hash_ids' is empty"),
        ('{"timestamp": 0, "input_length": 10, "hash_ids": [1.5]}', "'hash_ids'[0] must be"),
        ('{"timestamp": "x", "input_length": 10, "hash_ids": [1]}', "'timestamp' must be a finite"),
        ('{"timestamp": 0, "input_length": -3, "hash_ids": [1]}', "'input_length' must be >= 1"),
        ('{"timestamp": 0, "input_length": 2000, "hash_ids": [1, 2]}', "expected 513..1024"),
        ('{"timestamp": 0, "input_length": 100, "hash_ids": [1, 2]}', "expected 513..1024"),
        ('{"timestamp": 0, "input_length": 100, "hash_ids": 5}', "must be a list"),
    ],
)
def test_malformed_line_names_file_line_and_problem(
    tmp_path: Path, line: str, message: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [mooncake(0, 600, [1, 2]), line])
    with pytest.raises(TraceFormatError) as info:
        load_trace(path, fmt="mooncake")
    assert info.value.line == 2
    assert str(info.value).startswith(f"{path}:2: ")
    assert message in str(info.value)


def test_unknown_format_and_mixed_chunk_sizes(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "x.jsonl", [{"ids": [1]}])
    with pytest.raises(TraceFormatError, match="cannot tell the trace format"):
        load_trace(path)
    path = write_jsonl(
        tmp_path / "y.jsonl",
        [{"chunk_size": 256, "chunk_hashes": [1]}, {"chunk_size": 128, "chunk_hashes": [1]}],
    )
    with pytest.raises(TraceFormatError, match=r"y.jsonl:2: 'chunk_size' = 128 differs"):
        load_trace(path)


def test_skip_bad_lines_counts_and_keeps_the_rest(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [mooncake(0, 600, [1, 2]), "garbage", mooncake(1, 512, [1]), '{"hash_ids": []}'],
    )
    trace = load_trace(path, skip_bad_lines=True)
    assert len(trace.requests) == 2 and trace.skipped_lines == 2
    assert trace.first_skip_error is not None and ":2: not valid JSON" in trace.first_skip_error
    with pytest.raises(ValueError, match="no requests"):
        load_trace(write_jsonl(tmp_path / "e.jsonl", ["oops"]), skip_bad_lines=True)


def test_reader_streams_and_stops_at_max_requests(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [mooncake(i, 512, [i]) for i in range(10)] + ["bad"])
    reader = TraceReader(path, max_requests=3)
    assert [r.block_ids for r in reader] == [[0], [1], [2]]  # never reaches the bad line


def test_bad_arguments_are_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown trace format"):
        TraceReader(tmp_path / "x", fmt="csv")
    with pytest.raises(ValueError, match="block_tokens must be an int >= 1"):
        TraceReader(tmp_path / "x", block_tokens=0)
    with pytest.raises(ValueError, match="max_requests must be an int >= 1"):
        TraceReader(tmp_path / "x", max_requests=0)


def test_shared_trace_figures() -> None:
    trace = load_trace(shared_trace_path())
    assert len(trace.requests) == 3993
    assert trace.block_accesses == 121877 and trace.num_unique_blocks == 43924


def test_generic_record_with_input_length_and_no_timestamp_is_generic(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "g.jsonl",
        [{"hash_ids": [1, 2], "input_length": 600}, {"hash_ids": [1, 3], "input_length": 1024}],
    )
    reader = TraceReader(path)
    first, second = list(reader)
    assert reader.detected_format == "hash_ids"
    assert first.last_block_tokens == 88 and second.last_block_tokens == 512
    # With its timestamp (milliseconds) the same record is Mooncake's, as before.
    path = write_jsonl(tmp_path / "m.jsonl", [mooncake(1000, 600, [1, 2])])
    reader = TraceReader(path)
    list(reader)
    assert reader.detected_format == "mooncake"


CSV_TRACE = 'timestamp,input_length,output_length,hash_ids,session_id\n0,600,5,"[1, 2]",s1\n'


def test_a_csv_trace_is_named_and_the_one_line_conversion_works(tmp_path: Path) -> None:
    csv_path = tmp_path / "trace.csv"
    csv_path.write_text(CSV_TRACE + '1500,1024,9,"[1, 3]",s2\n')
    with pytest.raises(TraceFormatError) as info:
        load_trace(csv_path)
    message = str(info.value)
    assert message.startswith(f"{csv_path}:1: this looks like a CSV file")
    assert "CSV is not read" in message and CSV_TO_JSONL in message
    # The command the message shows, run as written (in the CSV's folder), gives a trace.
    command = CSV_TO_JSONL.replace("python", shlex.quote(sys.executable), 1)
    subprocess.run(command, shell=True, cwd=tmp_path, check=True)
    trace = load_trace(tmp_path / "trace.jsonl")
    assert [r.block_ids for r in trace.requests] == [[0, 1], [0, 2]]
    assert [r.session_id for r in trace.requests] == ["s1", "s2"]
    assert trace.requests[1].timestamp_s == 1.5  # Mooncake: milliseconds


def test_a_directory_is_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"trace path '.*' is a directory; give a trace file"):
        load_trace(tmp_path)
