"""TraceRecorder: a run recorded through the manager replays with the same hits; rotation,
bounded memory (drops counted), hints written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.keys import int_key
from kvoffload.manager import CPUOffloadingManager, LookupResult, TraceRecorder
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import make_context, replay
from kvoffload.sim.traces import load_trace
from kvoffload.sim.workloads import WorkloadConfig, generate_workload


def live_run(trace: Trace, manager: CPUOffloadingManager) -> int:
    """An engine's prefix-cache calls per request (lookup until a miss, load the prefix,
    store the rest); returns the prefix hits."""
    hits = 0
    for request in trace.requests:
        keys = list(dict.fromkeys(int_key(i) for i in request.block_ids))
        ctx = make_context(request, keys, trace.block_tokens)
        manager.on_new_request(ctx)
        p = 0
        while p < len(keys) and manager.lookup(keys[p], ctx) is LookupResult.HIT:
            p += 1
        hits += p
        if p:
            manager.prepare_load(keys[:p], ctx)
        if p < len(keys):
            out = manager.prepare_store(keys[p:], ctx)
            if out is not None and out.keys_to_store:
                manager.complete_store(out.keys_to_store, ctx)
        if p:
            manager.complete_load(keys[:p], ctx)
        ctx.output_tokens = request.output_tokens
        manager.on_request_finished(ctx)
    return hits


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "kvaware"])
@pytest.mark.parametrize("percent", [2, 20])
def test_recorded_run_replays_with_the_same_hits(tmp_path: Path, policy: str, percent: int) -> None:
    trace = generate_workload(WorkloadConfig(seed=5, requests=400))
    capacity = trace.num_unique_blocks * percent // 100
    path = tmp_path / "live.jsonl"
    recorder = TraceRecorder(path, block_tokens=trace.block_tokens)
    manager = CPUOffloadingManager(capacity, cache_policy=policy, recorder=recorder)
    live_hits = live_run(trace, manager)
    recorder.close()
    assert recorder.stats() == {"recorded": 400, "dropped": 0, "written": 400}
    recorded = load_trace(path, block_tokens=trace.block_tokens)
    assert recorded.block_accesses == trace.block_accesses
    assert recorded.total_tokens == trace.total_tokens
    assert recorded.num_unique_blocks == trace.num_unique_blocks
    assert [r.session_id for r in recorded.requests] == [r.session_id for r in trace.requests]
    replayed = replay(recorded, capacity, policy)
    assert replayed.prefix_hit_blocks == live_hits


def test_files_rotate_by_size_and_the_oldest_go(tmp_path: Path) -> None:
    trace = generate_workload(WorkloadConfig(seed=1, requests=200))
    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(path, max_bytes=20_000, max_files=3)
    live_run(trace, CPUOffloadingManager(500, recorder=recorder))
    recorder.close()
    files = sorted(tmp_path.iterdir())
    assert len(files) == 3 and path not in files  # the first files were rotated away
    for name in files:
        assert name.stat().st_size <= 20_000
        for line in name.read_text().splitlines():
            assert json.loads(line)["keys_hex"]
    assert recorder.written == 200


def test_a_full_queue_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    trace = generate_workload(WorkloadConfig(seed=2, requests=50))
    recorder = TraceRecorder(tmp_path / "t.jsonl", max_pending_keys=1)
    live_run(trace, CPUOffloadingManager(100, recorder=recorder))
    recorder.close()
    long_requests = sum(len(set(r.block_ids)) > 1 for r in trace.requests)
    assert recorder.dropped == long_requests > 0
    assert recorder.written == 50 - long_requests


def test_set_recorder_checks_its_type(tmp_path: Path) -> None:
    manager = CPUOffloadingManager(10)
    with pytest.raises(TypeError, match="recorder must be a TraceRecorder"):
        manager.set_recorder(str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes"):
        TraceRecorder(tmp_path / "x.jsonl", max_bytes=0)


def test_the_config_key_records_through_the_tiering_manager(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from kvoffload.layout import KVCacheLayout, KVTensorLayout
    from kvoffload.spec import OffloadingConfig, OffloadingSpecFactory
    from kvoffload.tiers.manager import TieringManager

    path = tmp_path / "live.jsonl"
    cfg = OffloadingConfig(
        cpu_bytes_to_use=1 << 20,
        record_trace=str(path),
        tiers=[{"type": "memory", "capacity_bytes": 1 << 16}],
    )
    layout = KVCacheLayout([KVTensorLayout("l0", "kv_first", (2, 8, 16, 2, 8), "float16")])
    spec = OffloadingSpecFactory.create_spec(cfg, layout)
    manager = spec.get_manager()
    assert isinstance(manager, TieringManager)
    recorder = manager.cpu.recorder
    assert recorder is not None and recorder.block_tokens == spec.tokens_per_chunk()
    trace = generate_workload(WorkloadConfig(seed=4, requests=20, block_tokens=16))
    for request in trace.requests:
        keys = list(dict.fromkeys(int_key(i) for i in request.block_ids))
        ctx = make_context(request, keys, trace.block_tokens)
        manager.on_new_request(ctx)
        out = manager.prepare_store(keys, ctx)
        if out is not None and out.keys_to_store:
            manager.complete_store(out.keys_to_store, ctx)
        manager.on_request_finished(ctx)
    manager.shutdown()
    recorder.close()
    recorded = load_trace(path, block_tokens=16)
    assert len(recorded.requests) == 20
    assert recorded.block_accesses == sum(len(set(r.block_ids)) for r in trace.requests)


def test_keys_of_mixed_lengths_and_unicode_hints_are_written_exactly(tmp_path: Path) -> None:
    from kvoffload.context import ReqContext

    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(path, block_tokens=4)
    ctx = ReqContext(req_id='é"1', session_id="会话", timestamp=2.5, prompt_tokens=9)
    keys = [b"\x01\x02", b"\x03", b"\x01\x02", b"\xff" * 3]
    recorder.add_keys(ctx, keys[:2])
    recorder.add_keys(ctx, keys[2:])
    recorder.finish(ctx)
    recorder.close()
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert record["hash_ids"] == ["0102", "03", "ffffff"]  # the repeat written once
    assert record["request_id"] == 'é"1' and record["session_id"] == "会话"
    assert record["timestamp"] == 2.5 and record["input_length"] == 9


def test_the_keys_hex_format_reads_each_key_once(tmp_path: Path) -> None:
    from kvoffload.sim.traces import TraceFormatError

    path = tmp_path / "k.jsonl"
    lines = [
        {"keys_hex": "0a0b" + "0c0d" + "0a0b", "key_bytes": 2, "input_length": 5},
        {"keys_hex": "0c0d0e0f", "key_bytes": 2, "input_length": 3, "session_id": "s"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = load_trace(path, block_tokens=2)
    first, second = trace.requests
    assert first.block_ids == [0, 1] and first.input_tokens == 4  # repeat dropped, length too
    assert second.block_ids == [1, 2] and second.last_block_tokens == 1
    path.write_text(json.dumps({"keys_hex": "0a0b0c", "key_bytes": 2}) + "\n")
    with pytest.raises(TraceFormatError, match="multiple of 2 \\* key_bytes"):
        load_trace(path)


def test_the_writer_writes_these_exact_lines(tmp_path: Path) -> None:
    """The bytes ``simulate`` reads, pinned: field order, the microseconds, the hints, and a
    request whose keys differ in width though their total is the first width times their
    count (it must get the per-key line: one width check per request is not enough)."""
    from kvoffload.context import ReqContext

    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(path, block_tokens=4, flush_interval_s=3600)
    requests = [
        (
            ReqContext(
                req_id="a",
                session_id="s",
                category="c",
                timestamp=12.0000015,
                prompt_tokens=11,
                output_tokens=3,
            ),
            [b"\x00\x01", b"\xab\xcd", b"\x00\x01"],
        ),
        (
            ReqContext(req_id="b", timestamp=1.5, prompt_tokens=99),
            [b"\x01\x02", b"\x03", b"\x04\x05\x06"],
        ),
        (ReqContext(req_id="c", timestamp=0.25), [b"\xff"]),
    ]
    for ctx, keys in requests:
        recorder.add_keys(ctx, keys)
        recorder.finish(ctx)
    recorder.close()
    assert path.read_bytes() == (
        b'{"keys_hex":"0001abcd0001","key_bytes":2,"timestamp":12.000002,"input_length":11,'
        b'"output_length":3,"session_id":"s","category":"c","request_id":"a"}\n'
        b'{"hash_ids":["0102","03","040506"],"timestamp":1.500000,"request_id":"b"}\n'
        b'{"keys_hex":"ff","key_bytes":1,"timestamp":0.250000,"request_id":"c"}\n'
    )
    trace = load_trace(path, block_tokens=4)
    assert [len(r.block_ids) for r in trace.requests] == [2, 3, 1]
    # A batch whose keys all have one width is hexed at once and cut per request.
    path = tmp_path / "one_width.jsonl"
    recorder = TraceRecorder(path, block_tokens=4, flush_interval_s=3600)
    for name, keys in (
        ("x", [b"\x00\x01", b"\xab\xcd"]),
        ("y", [b"\xab\xcd"]),
        ("z", [b"\x02\x03"]),
    ):
        ctx = ReqContext(req_id=name, timestamp=3.0)
        recorder.add_keys(ctx, keys)
        recorder.finish(ctx)
    recorder.close()
    assert path.read_bytes() == (
        b'{"keys_hex":"0001abcd","key_bytes":2,"timestamp":3.000000,"request_id":"x"}\n'
        b'{"keys_hex":"abcd","key_bytes":2,"timestamp":3.000000,"request_id":"y"}\n'
        b'{"keys_hex":"0203","key_bytes":2,"timestamp":3.000000,"request_id":"z"}\n'
    )
    path = tmp_path / "t.jsonl"
    # Both kinds of line in one file read whichever comes first, a key one block either way.
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[1] + lines[0] + b'{"hash_ids":["abcd","0102"]}\n')
    trace = load_trace(path, block_tokens=4)
    first, second, third = (r.block_ids for r in trace.requests)
    assert len(first) == 3 and len(second) == 2 and third == [second[1], first[0]]
