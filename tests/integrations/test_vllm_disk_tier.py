"""Our disk tier inside vLLM 0.33's own ``TieringOffloadingManager``, configured by keys alone.

Each test builds vLLM's manager from a ``TieringOffloadingSpec`` config that names
``KVOffloadDiskTier`` and drives it the way vLLM's scheduler does (``vllm_tier_driver``), with
real bytes. The tests named ``test_weak_point_*`` each show one of vLLM's fs-tier weak points
(``reference/tiering.md`` §1.11) fixed in ours; docs/vllm.md ("Our tiers in vLLM") lists them.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

try:
    from kvoffload.integrations import vllm_tiers
except ImportError as exc:
    pytest.skip(f"vLLM is not importable here: {exc}", allow_module_level=True)

from vllm.v1.kv_offload.base import Locality, LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import TIER_LABEL, TieringOffloadingMetrics

from kvoffload.tiers.disk import HEADER_BYTES, FileLayer, namespace_digest
from kvoffload.tiers.disk.records import STAMP_BYTES

sys.path.insert(0, str(Path(__file__).parent))
from vllm_tier_driver import MODULE, VllmTieringDriver, tiering_spec

BLOCK = 4096
RECORD = HEADER_BYTES + BLOCK
DISK = "1:KVOffloadDiskTier"


def keys_for(n: int, tag: bytes | None = None) -> list[bytes]:
    tag = tag or uuid.uuid4().bytes
    return [tag + i.to_bytes(8, "big") for i in range(n)]


def disk_config(root: Path, records: int, **extra: Any) -> dict[str, Any]:
    return {
        "type": "KVOffloadDiskTier",
        "module_path": MODULE,
        "root_dir": str(root),
        "capacity_bytes": records * RECORD,
        **extra,
    }


def uid() -> str:
    return f"kvoffload-disk-{uuid.uuid4().hex[:12]}"


def spec_for(root: Path, cpu_chunks: int, records: int, **extra: Any) -> Any:
    """A spec with an engine id of its own (vLLM names its shared-memory file after it)."""
    return tiering_spec([disk_config(root, records, **extra)], cpu_chunks, engine_id=uid())


def driver_for(root: Path, cpu_chunks: int, records: int, **extra: Any) -> VllmTieringDriver:
    return VllmTieringDriver(spec_for(root, cpu_chunks, records, **extra))


def disk_of(driver: VllmTieringDriver) -> Any:
    tier = driver.manager.secondary_tiers[0]
    assert isinstance(tier, vllm_tiers.KVOffloadDiskTier)
    return tier


def evict_from_cpu(driver: VllmTieringDriver, cpu_chunks: int) -> None:
    """Other prompts push everything earlier out of vLLM's CPU tier (LRU)."""
    for _ in range(2):
        driver.request(keys_for(cpu_chunks))
        driver.settle()


# ---------------------------------------------------------------- config


def test_config_keys_follow_vllms_fs_tier_and_are_checked(tmp_path: Path) -> None:
    driver = driver_for(
        tmp_path,
        8,
        16,
        eviction_policy="s3fifo",
        durability="fsync",
        io_threads=2,
        min_free_bytes=0,
        checksum="crc32",
    )
    try:
        tier = disk_of(driver).tier
        assert tier.root == str(tmp_path)
        assert tier.capacity_bytes == 16 * RECORD
        assert tier.durability == "fsync"
        assert type(tier._index.policy).__name__.lower().startswith("s3fifo")
        # the default namespace is vLLM's model/dtype/geometry fingerprint, not empty
        expected = vllm_tiers.KVOffloadDiskTier.default_namespace(driver.spec)
        assert tier.namespace == namespace_digest(expected)
    finally:
        driver.close()
    for bad, hint in (
        ("root_dirr", "root_dir"),
        ("capacity", "capacity_bytes"),
        ("eviction_polcy", "eviction_policy"),
        ("durabilty", "durability"),
    ):
        cfg = disk_config(tmp_path, 4)
        cfg[bad] = cfg.pop(hint, "x")
        with pytest.raises(ValueError, match=rf"unknown config key '{bad}'; did you mean '{hint}'"):
            tiering_spec([cfg], 4, engine_id=uid()).get_manager()
    no_capacity = disk_config(tmp_path, 4)
    del no_capacity["capacity_bytes"]
    with pytest.raises(ValueError, match=r"missing config key.*'capacity_bytes'"):
        tiering_spec([no_capacity], 4, engine_id=uid()).get_manager()
    with pytest.raises(ValueError, match="'root_dir' and 'path' name the same setting"):
        both = disk_config(tmp_path, 4, path=str(tmp_path))
        tiering_spec([both], 4, engine_id=uid()).get_manager()


def test_the_locality_key_is_honoured_as_by_vllms_fs_tier(tmp_path: Path) -> None:
    """vLLM's fs tier takes ``locality`` (a disk may be a network mount); ours took the key
    and dropped it, so vLLM's load filters and KV events never saw it."""
    for given, expected in ((None, None), ("REMOTE", Locality.REMOTE), ("LOCAL", Locality.LOCAL)):
        extra = {} if given is None else {"locality": given}
        driver = driver_for(tmp_path / str(given), 4, 4, **extra)
        try:
            assert disk_of(driver).locality is expected
        finally:
            driver.close()
    assert vllm_tiers.KVOffloadRedisTier.default_locality is Locality.REMOTE


# ---------------------------------------------------------------- cascade, promotion, restart


def test_stores_cascade_to_disk_and_promote_back_byte_exact(tmp_path: Path) -> None:
    driver = driver_for(tmp_path, 8, 64)
    try:
        tier = disk_of(driver)
        first = keys_for(6)
        assert driver.request(first) == 0
        driver.settle()
        assert tier.tier.stats()["stored"] == 6  # vLLM's cascade reached our disk tier
        evict_from_cpu(driver, 8)
        assert driver.request(first) == 6  # promoted from disk, then loaded from the CPU tier
        assert driver.counts.bad_bytes == 0
        assert driver.counts.loaded_bytes == 6 * BLOCK
        assert tier.tier.stats()["hits"] == 6
        assert driver.tier_counters(TieringOffloadingMetrics.CHUNK_HITS)[DISK] == 6
    finally:
        driver.close()


def test_restart_a_new_vllm_manager_serves_the_old_blocks(tmp_path: Path) -> None:
    old = keys_for(20)
    first = driver_for(tmp_path, 32, 64, durability="fsync")
    try:
        first.request(old)
        first.settle()
    finally:
        first.close()
    second = driver_for(tmp_path, 32, 64, durability="fsync")
    try:
        assert disk_of(second).tier.stats()["scanned_records"] == 20
        assert second.request(old) == 20  # all from disk: this manager never stored them
        assert second.counts.bad_bytes == 0
        assert second.counts.loaded_bytes == 20 * BLOCK
    finally:
        second.close()
    # a manager of another model over the same directory sees none of them
    other = spec_for(tmp_path, 32, 64)
    other.config = type(other.config)(
        **{**vars(other.config), "model": type(other.config.model)(name="other", dtype="float16")}
    )
    third = VllmTieringDriver(other)
    try:
        assert third.request(old) == 0
    finally:
        third.close()


# ---------------------------------------------------------------- vLLM's metric conventions


def test_stats_follow_vllms_metric_conventions(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, 4, 4)
    definitions = type(spec).build_metric_definitions(spec.extra_config)
    ours = {n: m for n, m in definitions.items() if n.startswith("vllm:kv_offload_kvoffload_")}
    assert ours, "our metrics must be declared through vLLM's spec"
    for meta in ours.values():
        assert TIER_LABEL not in meta.labelnames  # vLLM adds it; tiers must not declare it
    info_keys = type(spec).config_info_keys(spec.extra_config)  # asserts 'tier' is not ours
    assert "kvoffload_capacity_bytes" in info_keys
    driver = VllmTieringDriver(spec)
    try:
        for _ in range(3):  # 3 x 4 distinct blocks into a 4-record disk tier: 8 evictions
            driver.request(keys_for(4))
            driver.settle()
        stats = driver.manager.get_stats()  # vLLM's own aggregation (a dict here would crash)
        assert stats is not None
        types, values = stats.data["types"], stats.data["data"]
        for name, by_labels in values.items():
            if name.startswith("vllm:kv_offload_kvoffload_"):
                assert name in ours, f"{name} is emitted but not declared"
                for labels in by_labels:  # what vLLM's Prometheus side asserts
                    assert len(labels) == len(ours[name].labelnames)
        evictions = "vllm:kv_offload_kvoffload_disk_evictions"
        assert types[evictions] == "counter"
        assert values[evictions] == {(str(tmp_path),): 8}
        assert values["vllm:kv_offload_kvoffload_disk_used_bytes"] == {(str(tmp_path),): 4 * RECORD}
        driver.request(keys_for(1))
        driver.settle()
        again = driver.manager.get_stats()  # counters are increments since the last call
        assert again is not None and again.data["data"][evictions] == {(str(tmp_path),): 1}
        info = driver.manager.config_info()
        assert info[1][TIER_LABEL] == DISK and info[1]["kvoffload_capacity_bytes"] == 4 * RECORD
        assert list(driver.manager.take_events()) == []  # KV events are off: nothing piles up
        assert disk_of(driver)._events == []
    finally:
        driver.close()


def test_kv_events_for_stores_and_evictions_when_vllm_wants_them(tmp_path: Path) -> None:
    spec = tiering_spec(
        [disk_config(tmp_path, 2, enable_kv_events=True)], 4, engine_id=uid(), kv_events=True
    )
    driver = VllmTieringDriver(spec)
    try:
        first, second = keys_for(2), keys_for(2)
        for keys in (first, second):
            driver.request(keys)
            driver.settle()
        ours = [e for e in driver.manager.take_events() if e.ownership == "KVOffloadDiskTier"]
        stored = [k for e in ours if not e.removed for k in e.keys]
        removed = [k for e in ours if e.removed for k in e.keys]
        assert stored == first + second
        assert sorted(removed) == sorted(first)  # a 2-record tier evicted the first prompt
        assert all(e.medium is vllm_tiers.Medium.STORAGE for e in ours)
    finally:
        driver.close()


# ---------------------------------------------------------------- vLLM's fs weak points


class _Faults(FileLayer):
    """Counts calls; can fail reads with EIO, or hold reads until released."""

    def __init__(self) -> None:
        self.fail_reads = False
        self.hold = threading.Event()
        self.hold.set()
        self.reads = 0
        self.syncs = 0
        self.threads: set[int] = set()

    def preadv(self, fd: int, buffers: Any, offset: int) -> int:
        self.reads += 1
        self.threads.add(threading.get_ident())
        if not self.hold.wait(10):
            raise OSError(errno.ETIMEDOUT, "held too long")
        if self.fail_reads:
            raise OSError(errno.EIO, "injected read error")
        return super().preadv(fd, buffers, offset)

    def pwritev(self, fd: int, buffers: Any, offset: int) -> int:
        self.threads.add(threading.get_ident())
        return super().pwritev(fd, buffers, offset)

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1
        super().fdatasync(fd)


def test_weak_point_unbounded_disk_capacity_is_a_bound(tmp_path: Path) -> None:
    """§1.11.1: vLLM's fs tier has no capacity and never deletes; ours stays in its budget."""
    driver = driver_for(tmp_path, 8, 16)
    try:
        tier = disk_of(driver).tier
        for _ in range(6):
            driver.request(keys_for(8))
            driver.settle()
        stats = tier.stats()
        assert stats["stored"] == 48
        assert stats["used_bytes"] <= 16 * RECORD and stats["records"] == 16
        assert stats["evictions"] == 32
        assert os.path.getsize(tier.arena_path) <= 16 * RECORD + STAMP_BYTES  # + the last stamp
    finally:
        driver.close()


def test_weak_point_free_space_floor(tmp_path: Path) -> None:
    """§1.11.1: only ENOSPC stops vLLM's fs tier; ours stops at ``min_free_bytes``."""

    class AlmostFull(FileLayer):
        def free_bytes(self, path: str) -> int:
            return 6 * RECORD

    driver = driver_for(tmp_path, 8, 64, min_free_bytes=2 * RECORD, files=AlmostFull())
    try:
        tier = disk_of(driver).tier
        driver.request(keys_for(8))
        driver.settle()
        stats = tier.stats()
        assert stats["records"] == 4  # 6 free - 2 floor: four records fit, the rest evict
        assert stats["used_bytes"] == 4 * RECORD
    finally:
        driver.close()


def test_weak_point_a_store_the_disk_refuses_is_counted_not_silent(tmp_path: Path) -> None:
    """§1.11.4 (the tier's part): a failed store is a failed cascade job for vLLM and a
    counted drop by reason in our metrics; the data stays in vLLM's CPU tier."""

    class DiskFull(FileLayer):
        def pwritev(self, fd: int, buffers: Any, offset: int) -> int:
            raise OSError(errno.ENOSPC, "injected: no space left")

    driver = driver_for(tmp_path, 8, 16, files=DiskFull())
    try:
        blocks = keys_for(3)
        driver.request(blocks)
        driver.settle()
        stats = driver.manager.get_stats()
        assert stats is not None
        data = stats.data["data"]
        assert sum(data[TieringOffloadingMetrics.CASCADE_JOB_FAILURES].values()) == 1
        assert data["vllm:kv_offload_kvoffload_disk_stores_dropped"] == {
            (str(tmp_path), "no_space"): 3
        }
        assert driver.request(blocks) == 3  # still served from vLLM's CPU tier
        assert driver.manager.secondary_tiers[0].lookup(blocks[0], ReqContext("x")) is (
            LookupResult.MISS
        )  # never a record that was not written
    finally:
        driver.close()


def test_weak_point_garbled_record_is_a_counted_miss_never_data(tmp_path: Path) -> None:
    """§1.11.2: vLLM's fs tier serves a same-length garbled file; ours checks a checksum."""
    driver = driver_for(tmp_path, 4, 64)
    try:
        tier = disk_of(driver)
        first = keys_for(3)
        driver.request(first)
        driver.settle()
        evict_from_cpu(driver, 4)
        with open(tier.tier.arena_path, "r+b") as f:  # flip one payload byte of every record
            size = os.path.getsize(tier.tier.arena_path)
            for offset in range(HEADER_BYTES + 100, size, RECORD):
                f.seek(offset)
                byte = f.read(1)
                f.seek(offset)
                f.write(bytes([byte[0] ^ 0xFF]))
        assert driver.request(first) == 0  # the first block is corrupt: a miss
        assert driver.counts.bad_bytes == 0  # vLLM never got garbled bytes
        assert tier.tier.stats()["corrupt_records"] >= 1
        stats = driver.manager.get_stats()
        assert stats is not None
        failed = stats.data["data"]["vllm:kv_offload_kvoffload_disk_loads_failed"]
        assert failed[(str(tmp_path), "corrupt")] >= 1
        assert driver.manager.secondary_tiers[0].lookup(first[0], ReqContext("x")) is (
            LookupResult.MISS
        )  # erased, not served again
    finally:
        driver.close()


def test_weak_point_torn_record_after_a_crash_is_erased_on_restart(tmp_path: Path) -> None:
    """§1.11.2: no fsync and no tmp sweep in vLLM's fs tier; ours erases torn records."""
    blocks = keys_for(4)
    driver = driver_for(tmp_path, 8, 16)
    try:
        driver.request(blocks)
        driver.settle()
        arena = disk_of(driver).tier.arena_path
    finally:
        driver.close()
    with open(arena, "r+b") as f:  # a crash mid-write: the second record's header is torn
        f.seek(RECORD + STAMP_BYTES + 40)  # header fields follow the previous slot's stamp
        f.write(b"\xff" * 16)
        f.seek(0, os.SEEK_END)
        f.write(b"partial record")
    again = driver_for(tmp_path, 8, 16)
    try:
        stats = disk_of(again).tier.stats()
        assert stats["torn_records"] == 2 and stats["scanned_records"] == 3
        assert again.request(blocks) == 1  # the first block, then the torn one misses
        assert again.counts.bad_bytes == 0
    finally:
        again.close()


def test_weak_point_fsync_durability_issues_write_barriers(tmp_path: Path) -> None:
    """§1.11.2: vLLM's fs tier never fsyncs; ``durability: fsync`` puts barriers in order."""
    files = _Faults()
    driver = driver_for(tmp_path, 8, 16, durability="fsync", files=files)
    try:
        driver.request(keys_for(4))
        driver.settle()
        assert files.syncs >= 2  # after the payloads, and after the stamps that commit them
    finally:
        driver.close()


def test_weak_point_lookup_never_retries(tmp_path: Path) -> None:
    """§1.11.3: vLLM's fs tier answers RETRY to every first lookup; ours answers from memory."""
    driver = driver_for(tmp_path, 4, 64)
    try:
        first = keys_for(3)
        driver.request(first)
        driver.settle()
        tier = disk_of(driver)
        ctx = ReqContext("probe")
        assert [tier.lookup(k, ctx) for k in first] == [LookupResult.HIT] * 3
        assert tier.lookup(b"never stored".ljust(24, b"\0"), ctx) is LookupResult.MISS
    finally:
        driver.close()


def test_weak_point_failed_load_is_reported_and_never_loops(tmp_path: Path) -> None:
    """§1.11.3: a load that fails (EIO) is reported as vLLM expects (``success=False``, the
    slots freed) and the key is a MISS afterwards, so it is not promoted again and again."""
    files = _Faults()
    driver = VllmTieringDriver(spec_for(tmp_path, 4, 64, files=files), max_wait_steps=1000)
    try:
        first = keys_for(3)
        driver.request(first)
        driver.settle()
        evict_from_cpu(driver, 4)
        files.fail_reads = True
        reads = files.reads
        waits = driver.counts.waits
        assert driver.request(first) == 0
        assert driver.counts.waits - waits < 10  # a few steps, not 1000
        assert files.reads - reads <= 3  # one promotion attempt, never repeated
        stats = driver.manager.get_stats()
        assert stats is not None
        failures = stats.data["data"][TieringOffloadingMetrics.PROMOTION_JOB_FAILURES]
        assert sum(failures.values()) == 1  # vLLM saw one failed job
        deferred = getattr(TieringOffloadingMetrics, "DEFERRED_RELEASE_CHUNKS", None)
        if deferred is not None:  # vLLM 0.34: our job ends after its I/O, nothing deferred
            assert driver.manager.primary_tier.num_deferred_release_chunks == 0
            assert set(stats.data["data"][deferred].values()) == {0}
        assert driver.request(first) == 3  # computed and stored again: CPU hits next time
        evict_from_cpu(driver, 4)
        assert driver.request(first) == 0  # within failed_load_ttl_s: a miss, no new attempt
        assert files.reads - reads <= 3
        files.fail_reads = False
        disk_of(driver).failed_load_ttl_s = 0.0
        disk_of(driver)._failed_loads.clear()
        assert driver.request(first) == 3  # the records were fine: served once reads work
        assert driver.counts.bad_bytes == 0
    finally:
        driver.close()


def test_failed_load_verdicts_expire_and_stay_bounded(tmp_path: Path, monkeypatch: Any) -> None:
    driver = driver_for(tmp_path, 4, 8)
    try:
        tier = disk_of(driver)
        monkeypatch.setattr(vllm_tiers, "_MAX_FAILED_LOADS", 3)
        now = time.monotonic()
        tier._failed_loads.update({k: now - 1 for k in keys_for(2)})  # expired
        fresh = keys_for(5)
        tier._failed_loads.update({k: now + 60 for k in fresh})
        tier._prune_failed_loads(now)
        assert list(tier._failed_loads) == fresh[-3:]
    finally:
        driver.close()


def test_weak_point_drain_is_bounded_and_visible(tmp_path: Path, caplog: Any) -> None:
    """§1.11.5: vLLM's fs ``wait_idle`` blocks with no timeout or word; ours waits in bounded
    rounds and logs each stalled round with the tier's health. (vLLM's ``reset_cache`` must
    still wait for copies into its slots: aborting one would corrupt the slot.)"""
    files = _Faults()
    driver = driver_for(tmp_path, 4, 64, files=files)
    tier = disk_of(driver)
    tier.drain_round_s = 0.05
    try:
        first = keys_for(3)
        driver.request(first)
        driver.settle()
        evict_from_cpu(driver, 4)
        files.hold.clear()
        ctx = ReqContext("held")
        driver.manager.on_new_request(ctx)
        assert driver.manager.lookup(first[0], ctx) is LookupResult.HIT_PENDING
        driver.step()  # the load is submitted and held in the file layer
        threading.Timer(0.3, files.hold.set).start()
        with caplog.at_level(logging.ERROR, logger=vllm_tiers.__name__):
            driver.manager.reset_cache()
        stalls = [r for r in caplog.records if "still in flight" in r.getMessage()]
        assert stalls and "KVOffloadDiskTier" in stalls[0].getMessage()
        assert not driver.manager.has_pending_work()
    finally:
        files.hold.set()
        driver.close()


def test_weak_point_one_job_uses_every_io_thread(tmp_path: Path) -> None:
    """§1.11.7: vLLM's fs tier runs each job serially on one thread; ours splits a job."""
    files = _Faults()
    driver = driver_for(tmp_path, 64, 128, io_threads=4, files=files)
    try:
        driver.request(keys_for(64))  # one store job of 64 blocks
        driver.settle()
        assert len(files.threads) >= 2
    finally:
        driver.close()


# ---------------------------------------------------------------- the documented config


def documented_tiers_config() -> dict[str, Any]:
    """The ``--kv-transfer-config`` of docs/vllm.md's "Our tiers in vLLM"."""
    text = (Path(__file__).parents[2] / "docs" / "vllm.md").read_text()
    section = text.split("## Our tiers in vLLM", 1)[1]
    line = next(ln for ln in section.splitlines() if ln.startswith("vllm serve"))
    return json.loads(line.split("--kv-transfer-config '", 1)[1].rsplit("'", 1)[0])


def test_documented_config_builds_vllms_manager_with_our_tiers(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "tiers"))
    from redis_servers import ci_url

    extra = documented_tiers_config()["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieringOffloadingSpec"
    disk_cfg, redis_cfg = (dict(t) for t in extra["secondary_tiers"])
    disk_cfg["root_dir"] = str(tmp_path)  # only the places differ from the docs
    disk_cfg["capacity_bytes"] = 64 * RECORD
    redis_cfg["url"] = ci_url("KVOFFLOAD_REDIS_URL")
    spec = tiering_spec(
        [disk_cfg, redis_cfg],
        8,
        engine_id=uid(),
        eviction_policy=extra["eviction_policy"],
        cache_policy_module_path=extra["cache_policy_module_path"],
    )
    driver = VllmTieringDriver(spec)
    try:
        disk, remote = driver.manager.secondary_tiers
        assert isinstance(disk, vllm_tiers.KVOffloadDiskTier)
        assert isinstance(remote, vllm_tiers.KVOffloadRedisTier)
        blocks = keys_for(4)
        driver.request(blocks)
        driver.settle()
        evict_from_cpu(driver, 8)
        assert driver.request(blocks) == 4 and driver.counts.bad_bytes == 0
        hits = driver.tier_counters(TieringOffloadingMetrics.CHUNK_HITS)
        assert hits[DISK] == 4  # config order: the disk tier is asked first
    finally:
        driver.close()
