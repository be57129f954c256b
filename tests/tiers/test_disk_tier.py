"""The disk tier: the tier conformance suite, round trips, budget, free-space floor, restart."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kvoffload.keys import namespace_fingerprint
from kvoffload.testing.tiers import ALL_CHECKS, check_tier_conformance, conformance_key
from kvoffload.tiers import BytearraySlotMemory, Presence, Tier
from kvoffload.tiers.disk import HEADER_BYTES, DiskTier
from kvoffload.tiers.disk.io import FileLayer
from kvoffload.tiers.disk.records import STAMP_BYTES
from kvoffload.tiers.registry import TIER_REGISTRY, available_tiers, get_tier_cls, register_tier


def _key(i: int) -> bytes:
    return conformance_key(i)


def _wait(tier: Tier, job: int) -> object:
    assert tier.drain(10.0)
    (result,) = [r for r in tier.poll() if r.job_id == job]
    return result


def _tier(memory: BytearraySlotMemory, path: Path, records: int, **kw: object) -> DiskTier:
    return DiskTier(memory, path, records * (HEADER_BYTES + memory.slot_bytes), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("durability", ["none", "rename", "fsync"])
def test_disk_tier_passes_the_tier_conformance_suite(tmp_path: Path, durability: str) -> None:
    counter = iter(range(1000))

    def make(memory: BytearraySlotMemory, records: int) -> Tier:
        return _tier(memory, tmp_path / f"t{next(counter)}", records, durability=durability)

    check_tier_conformance(make)


def test_conformance_suite_catches_a_tier_that_evicts_a_pinned_record(tmp_path: Path) -> None:
    """The suite must be able to fail: a disk tier whose reads do not pin is caught."""

    class Unpinned(DiskTier):
        """Reads that do not pin their record (the bug vLLM's fs RFC asks to avoid)."""

        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, **kw)  # type: ignore[arg-type]
            index = self._index

            def begin_read(key: bytes) -> object:
                entry = index.get(key)  # type: ignore[arg-type]
                return entry if entry is not None and entry.status.ref_cnt >= 0 else None

            index.begin_read = begin_read  # type: ignore[method-assign,assignment]
            index.end_read = lambda key, corrupt: None  # type: ignore[method-assign,assignment]

    def make(memory: BytearraySlotMemory, records: int) -> Tier:
        size = records * (HEADER_BYTES + memory.slot_bytes)
        return Unpinned(memory, tmp_path / f"u{next(counter)}", size)

    counter = iter(range(100))
    in_flight = next(c for c in ALL_CHECKS if c.__name__ == "check_in_flight_not_evicted")
    with pytest.raises(AssertionError, match="in_flight"):
        in_flight(make)


@pytest.mark.parametrize("slot_bytes", [1, 4096, 65536 + 7, 2 * 1024 * 1024])
def test_round_trip_is_byte_exact_for_several_slot_sizes(tmp_path: Path, slot_bytes: int) -> None:
    memory = BytearraySlotMemory(slot_bytes, 6)
    rng = random.Random(slot_bytes)
    data = [rng.randbytes(slot_bytes) for _ in range(3)]
    for i, d in enumerate(data):
        memory.slot_view(i)[:] = d
    tier = _tier(memory, tmp_path, 3)
    put = _wait(tier, tier.submit_put([_key(i) for i in range(3)], [0, 1, 2]))
    assert put.all_ok and put.nbytes == 3 * slot_bytes  # type: ignore[attr-defined]
    tier.close()
    fresh = _tier(memory, tmp_path, 3)  # a restart: served from the scanned index
    get = _wait(fresh, fresh.submit_get([_key(i) for i in range(3)], [3, 4, 5]))
    assert get.all_ok  # type: ignore[attr-defined]
    assert [bytes(memory.slot_view(s)) for s in (3, 4, 5)] == data
    fresh.close()


def test_round_trip_through_host_buffer_slots_for_every_layout_and_dtype(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from kvoffload.transfer.host import HostBuffer

    class HostSlots:
        def __init__(self, buf: HostBuffer) -> None:
            self.buf = buf
            self.slot_bytes = buf.slot_bytes
            self.num_slots = buf.num_slots

        def slot_view(self, slot: int) -> memoryview:
            return memoryview(self.buf.slot(slot).numpy()).cast("B")

    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int8]
    for n, dtype in enumerate(dtypes):
        elems = 3 * 5 * 7  # blocks of (3 layers x 5 tokens x 7 dims) in any layout
        nbytes = elems * torch.empty((), dtype=dtype).element_size()
        buf = HostBuffer(nbytes, 4, pin=False)
        slots = HostSlots(buf)
        src = torch.randn(2, elems).to(dtype)
        for s in range(2):
            buf.slot(s).copy_(src[s].view(torch.uint8))
        tier = _tier(slots, tmp_path / str(n), 2)  # type: ignore[arg-type]
        assert _wait(tier, tier.submit_put([_key(0), _key(1)], [0, 1])).all_ok  # type: ignore[attr-defined]
        assert _wait(tier, tier.submit_get([_key(0), _key(1)], [2, 3])).all_ok  # type: ignore[attr-defined]
        for s in range(2):
            back = buf.slot(2 + s).view(dtype)
            assert torch.equal(back.view(torch.uint8), src[s].view(torch.uint8)), dtype
        tier.close()


def test_budget_evicts_by_the_chosen_policy_and_deletes_files(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(1024, 4)
    tier = _tier(memory, tmp_path, 3, policy="fifo")
    for i in range(3):
        assert _wait(tier, tier.submit_put([_key(i)], [0])).all_ok  # type: ignore[attr-defined]
    _wait(tier, tier.submit_get([_key(0)], [1]))  # a hit does not save it under FIFO
    put = _wait(tier, tier.submit_put([_key(3)], [0]))
    assert put.evicted == (_key(0),)  # type: ignore[attr-defined]
    assert tier.contains([_key(0), _key(3)]) == [Presence.MISS, Presence.HIT]
    (arena,) = tmp_path.rglob("*.kv")
    # the 4th reused a slot (the file: 3 slots and the last one's commit stamp)
    assert arena.stat().st_size == 3 * (HEADER_BYTES + 1024) + STAMP_BYTES
    assert tier.stats()["evictions"] == 1
    assert tier.stats()["used_bytes"] <= tier.stats()["capacity_bytes"]
    tier.close()


def test_free_space_floor_shrinks_the_budget(tmp_path: Path) -> None:
    class SmallDisk(FileLayer):
        free = 5 * (HEADER_BYTES + 1024)

        def free_bytes(self, path: str) -> int:
            return self.free

    memory = BytearraySlotMemory(1024, 2)
    files = SmallDisk()
    tier = _tier(memory, tmp_path, 100, files=files, min_free_bytes=3 * (HEADER_BYTES + 1024))
    stored = 0
    for i in range(6):
        result = _wait(tier, tier.submit_put([_key(i)], [0]))
        stored += result.all_ok  # type: ignore[attr-defined]
    # 5 records free minus a floor of 3: the tier keeps 2 however many it is offered
    assert tier.stats()["records"] == 2
    assert stored == 6  # older records were evicted to make room
    assert tier.health().ok
    tier.close()
    files.free = 0  # another writer filled the disk: the arena may not grow
    (arena,) = tmp_path.rglob("*.kv")
    size = arena.stat().st_size
    full = _tier(memory, tmp_path, 100, files=files, min_free_bytes=3 * (HEADER_BYTES + 1024))
    assert full.stats()["records"] == 2 and full.health().ok  # its own slots still serve
    for i in range(10, 13):
        assert _wait(full, full.submit_put([_key(i)], [0])).all_ok  # type: ignore[attr-defined]
    assert arena.stat().st_size == size and full.stats()["records"] == 2
    full.close()
    empty_dir = tmp_path / "empty"
    none_fit = _tier(memory, empty_dir, 100, files=files, min_free_bytes=1)
    assert not none_fit.health().ok and "min_free_bytes" in none_fit.health().reason
    put = _wait(none_fit, none_fit.submit_put([_key(1)], [0]))
    assert put.reasons == {0: "no_space"}  # type: ignore[attr-defined]
    none_fit.close()
    full.close()


def test_warm_restart_seeds_the_policy_oldest_first(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(512, 2)
    tier = _tier(memory, tmp_path, 4)
    for i in range(4):
        assert _wait(tier, tier.submit_put([_key(i)], [0])).all_ok  # type: ignore[attr-defined]
    assert _wait(tier, tier.submit_delete([_key(0)])).all_ok  # type: ignore[attr-defined]
    assert _wait(tier, tier.submit_put([_key(4)], [0])).all_ok  # type: ignore[attr-defined]
    tier.close()
    # slot order is now 4, 1, 2, 3; time order 1, 2, 3, 4: the scan must follow time
    fresh = _tier(memory, tmp_path, 4)
    assert fresh.stats()["scanned_records"] == 4
    put = _wait(fresh, fresh.submit_put([_key(9)], [0]))
    assert put.evicted == (_key(1),)  # type: ignore[attr-defined]
    fresh.close()


def test_restart_with_a_smaller_budget_evicts_down_to_it(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(512, 2)
    tier = _tier(memory, tmp_path, 5)
    assert _wait(tier, tier.submit_put([_key(i) for i in range(5)], [0] * 5)).all_ok  # type: ignore[attr-defined]
    tier.close()
    small = _tier(memory, tmp_path, 2)
    assert small.stats()["records"] == 2
    (arena,) = tmp_path.rglob("*.kv")
    # the file shrank to the budget (and the last kept slot's commit stamp)
    assert arena.stat().st_size == 2 * (HEADER_BYTES + 512) + STAMP_BYTES
    small.close()


def test_namespaces_keep_models_apart(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(256, 2)
    memory.slot_view(0)[:] = b"a" * 256
    ns_a = namespace_fingerprint(model="a", dtype="bf16")
    ns_b = namespace_fingerprint(model="b", dtype="bf16")
    a = _tier(memory, tmp_path, 4, namespace=ns_a)
    assert _wait(a, a.submit_put([_key(1)], [0])).all_ok  # type: ignore[attr-defined]
    a.close()
    b = _tier(memory, tmp_path, 4, namespace=ns_b)
    assert b.contains([_key(1)]) == [Presence.MISS]
    assert b.stats()["scanned_records"] == 0
    b.close()
    a2 = _tier(memory, tmp_path, 4, namespace=ns_a)
    assert a2.contains([_key(1)]) == [Presence.HIT]
    a2.close()


def test_tiers_of_another_block_size_keep_their_own_arena(tmp_path: Path) -> None:
    small = BytearraySlotMemory(256, 1)
    tier = _tier(small, tmp_path, 4)
    assert _wait(tier, tier.submit_put([_key(1)], [0])).all_ok  # type: ignore[attr-defined]
    tier.close()
    big = BytearraySlotMemory(512, 1)
    other = _tier(big, tmp_path, 4)
    assert other.contains([_key(1)]) == [Presence.MISS]
    assert other.stats()["torn_records"] == 0
    other.close()
    again = _tier(small, tmp_path, 4)
    assert again.contains([_key(1)]) == [Presence.HIT]
    again.close()


def test_checksum_choice_round_trips_and_crc32_reads_xxh3_records(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(4096, 2)
    memory.slot_view(0)[:] = random.Random(3).randbytes(4096)
    for n, checksum in enumerate(["crc32", "auto"]):
        tier = _tier(memory, tmp_path / str(n), 2, checksum=checksum)
        assert _wait(tier, tier.submit_put([_key(1)], [0])).all_ok  # type: ignore[attr-defined]
        tier.close()
        # a tier configured with the other checksum still verifies the record by its header
        reader = _tier(memory, tmp_path / str(n), 2, checksum="crc32" if n else "auto")
        assert _wait(reader, reader.submit_get([_key(1)], [1])).all_ok  # type: ignore[attr-defined]
        assert bytes(memory.slot_view(1)) == bytes(memory.slot_view(0))
        reader.close()


def test_bad_arguments_fail_clearly(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(256, 2)
    with pytest.raises(ValueError, match="durability"):
        _tier(memory, tmp_path, 2, durability="sometimes")
    with pytest.raises(ValueError, match="capacity_bytes"):
        DiskTier(memory, tmp_path, 10)
    with pytest.raises(TypeError, match="capacity_bytes"):
        DiskTier(memory, tmp_path, 1.5e9)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="checksum"):
        _tier(memory, tmp_path, 2, checksum="md5")
    with pytest.raises(ValueError, match="policy"):
        _tier(memory, tmp_path, 2, policy="no-such-policy")
    with pytest.raises(ValueError, match=r"put_lanes.*at most io_threads"):
        _tier(memory, tmp_path, 2, io_threads=2, put_lanes=3)
    with pytest.raises(ValueError, match="put_lanes"):
        _tier(memory, tmp_path, 2, put_lanes=0)
    tier = _tier(memory, tmp_path, 2)
    with pytest.raises(ValueError, match="slot"):
        tier.submit_put([_key(1)], [5])
    with pytest.raises(ValueError, match="pair up"):
        tier.submit_put([_key(1)], [0, 1])
    with pytest.raises(TypeError, match=r"a single key is \[key\]"):  # one rule, every tier
        tier.submit_put(_key(1), [0])  # type: ignore[arg-type]
    tier.close()
    after = _wait(tier, tier.submit_put([_key(1)], [0]))
    assert after.ok == (False,) and after.reasons == {0: "closed"}  # type: ignore[attr-defined]


def test_registry_loads_the_disk_tier_by_name_and_by_module_path() -> None:
    assert "disk" in available_tiers()
    assert get_tier_cls("disk") is DiskTier
    assert get_tier_cls("kvoffload.tiers.disk.tier:DiskTier") is DiskTier

    class Mine(DiskTier):
        name = "mine"

    with TIER_REGISTRY.snapshot():
        register_tier("mine-test", Mine)
        assert get_tier_cls("mine-test") is Mine
    with pytest.raises(ValueError, match="Unknown tier: 'nope'"):
        get_tier_cls("nope")
    with pytest.raises(ValueError, match="Did you mean 'disk'"):
        get_tier_cls("Disk")
    with pytest.raises(TypeError, match=r"not a subclass of kvoffload\.tiers\.base\.Tier"):
        get_tier_cls("os:path")
    with pytest.raises(TypeError):
        register_tier("x", int)  # type: ignore[arg-type]


def test_a_tier_name_registered_twice_is_refused_unless_replace_is_said() -> None:
    """One duplicate rule for both registries: the policy registry's (refuse), not a silent swap."""

    class First(DiskTier):
        pass

    class Second(DiskTier):
        pass

    with TIER_REGISTRY.snapshot():
        register_tier("twice-test", First)
        with pytest.raises(ValueError, match="'twice-test' is already registered"):
            register_tier("twice-test", Second)
        assert get_tier_cls("twice-test") is First
        with pytest.raises(ValueError, match="already registered"):
            register_tier("disk", Second)
        assert get_tier_cls("disk") is DiskTier
        register_tier("twice-test", Second, replace=True)
        assert get_tier_cls("twice-test") is Second
    assert "twice-test" not in available_tiers()


def test_a_jobs_records_enter_the_policy_tail_first_whatever_thread_finishes_first(
    tmp_path: Path,
) -> None:
    """LRU evicts a batch's tail first, as the CPU tier does (the head stays most recent)."""
    memory = BytearraySlotMemory(64 * 1024, 8)
    for run in range(4):
        tier = _tier(memory, tmp_path / str(run), 8, io_threads=8)
        keys = [_key(run * 100 + i) for i in range(8)]
        assert _wait(tier, tier.submit_put(keys, list(range(8)))).all_ok  # type: ignore[attr-defined]
        put = _wait(tier, tier.submit_put([_key(999)], [0]))
        assert put.evicted == (keys[-1],)  # type: ignore[attr-defined]
        tier.close()


def test_random_concurrent_jobs_never_serve_wrong_bytes_or_exceed_the_budget(
    tmp_path: Path,
) -> None:
    """Many jobs in flight at once over few records: every hit is the stored bytes."""
    rng = random.Random(7)
    slot = 16 * 1024
    memory = BytearraySlotMemory(slot, 64)
    tier = _tier(memory, tmp_path, 6, io_threads=4, policy="arc")
    content = {k: random.Random(k).randbytes(slot) for k in range(20)}
    for step in range(60):
        jobs = []
        base = (step % 2) * 32
        for j in range(4):
            keys = rng.sample(range(20), rng.randint(1, 4))
            slots = [base + j * 8 + n for n in range(len(keys))]
            if rng.random() < 0.5:
                for k, s in zip(keys, slots, strict=True):
                    memory.slot_view(s)[:] = content[k]
                jobs.append(("put", keys, slots, tier.submit_put([_key(k) for k in keys], slots)))
            elif rng.random() < 0.8:
                jobs.append(("get", keys, slots, tier.submit_get([_key(k) for k in keys], slots)))
            else:
                tier.submit_delete([_key(k) for k in keys])
        assert tier.drain(10.0)
        results = {r.job_id: r for r in tier.poll()}
        for kind, keys, slots, job in jobs:
            if kind == "get":
                for k, s, ok in zip(keys, slots, results[job].ok, strict=True):
                    if ok:
                        assert bytes(memory.slot_view(s)) == content[k]
        stats = tier.stats()
        assert stats["used_bytes"] <= stats["capacity_bytes"] and stats["records"] <= 6
    assert tier.stats()["hits"] > 0 and tier.stats()["evictions"] > 0
    tier.close()


def _fill_then_reuse_the_oldest(path: Path, memory: BytearraySlotMemory, policy: str) -> None:
    """8 records written 0..7, then 0..3 read again: LRU-wise 4..7 are now the oldest."""
    tier = _tier(memory, path, 8, policy=policy)
    assert _wait(tier, tier.submit_put([_key(i) for i in range(8)], [0] * 8)).all_ok  # type: ignore[attr-defined]
    for i in range(4):
        assert _wait(tier, tier.submit_get([_key(i)], [1])).all_ok  # type: ignore[attr-defined]
    tier.close()


def _victims_of_four_new_records(tier: DiskTier) -> set[bytes]:
    put = _wait(tier, tier.submit_put([_key(100 + i) for i in range(4)], [0] * 4))
    assert put.all_ok  # type: ignore[attr-defined]
    return set(put.evicted)  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo"])
def test_a_clean_restart_resumes_the_policys_decisions(tmp_path: Path, policy: str) -> None:
    memory = BytearraySlotMemory(512, 2)
    _fill_then_reuse_the_oldest(tmp_path / "restarted", memory, policy)
    restarted = _tier(memory, tmp_path / "restarted", 8, policy=policy)
    assert restarted.stats()["policy_state_restored"] == 1
    assert not list((tmp_path / "restarted").rglob("policy-*.json"))  # consumed at start
    # the same calls on a tier that never restarted choose the same victims
    never = _tier(memory, tmp_path / "never", 8, policy=policy)
    assert _wait(never, never.submit_put([_key(i) for i in range(8)], [0] * 8)).all_ok  # type: ignore[attr-defined]
    for i in range(4):
        assert _wait(never, never.submit_get([_key(i)], [1])).all_ok  # type: ignore[attr-defined]
    assert _victims_of_four_new_records(restarted) == _victims_of_four_new_records(never)
    restarted.close()
    never.close()


def test_without_the_saved_state_a_restart_is_oldest_first(tmp_path: Path) -> None:
    """The check above can fail: the scan alone seeds by write time and evicts 0..3."""
    memory = BytearraySlotMemory(512, 2)
    _fill_then_reuse_the_oldest(tmp_path, memory, "lru")
    for saved in tmp_path.rglob("policy-*.json"):
        saved.unlink()
    cold = _tier(memory, tmp_path, 8)
    assert cold.stats()["policy_state_restored"] == 0
    assert _victims_of_four_new_records(cold) == {_key(i) for i in range(4)}
    cold.close()


@pytest.mark.parametrize("damage", ["garbage", "other_policy", "other_budget", "foreign_class"])
def test_a_saved_state_that_does_not_fit_is_ignored_and_counted(
    tmp_path: Path, damage: str
) -> None:
    memory = BytearraySlotMemory(512, 2)
    _fill_then_reuse_the_oldest(tmp_path, memory, "lru")
    (saved,) = tmp_path.rglob("policy-*.json")
    if damage == "garbage":
        saved.write_bytes(b"\x00not json")
    elif damage == "foreign_class":
        saved.write_text(saved.read_text().replace("kvoffload.policies.lru", "os"))
    policy = "fifo" if damage == "other_policy" else "lru"
    records = 9 if damage == "other_budget" else 8
    tier = _tier(memory, tmp_path, records, policy=policy)
    stats = tier.stats()
    assert stats["policy_state_ignored"] == 1 and stats["policy_state_restored"] == 0
    assert stats["records"] == 8  # the records themselves are all served
    for i in range(8):
        assert _wait(tier, tier.submit_get([_key(i)], [1])).all_ok  # type: ignore[attr-defined]
    tier.close()


def test_a_saved_state_is_reconciled_with_the_records_found(tmp_path: Path) -> None:
    """A record lost since the close leaves the policy; nothing unknown is ever served."""
    memory = BytearraySlotMemory(512, 2)
    _fill_then_reuse_the_oldest(tmp_path, memory, "lru")
    (arena,) = tmp_path.rglob("*.kv")
    with arena.open("r+b") as f:  # destroy slot 0's header (record 0)
        f.seek(STAMP_BYTES)
        f.write(b"\xff" * 64)
    tier = _tier(memory, tmp_path, 8)
    assert tier.stats()["policy_state_restored"] == 1
    assert tier.stats()["records"] == 7
    assert not _wait(tier, tier.submit_get([_key(0)], [1])).all_ok  # type: ignore[attr-defined]
    # LRU order kept for the rest: 4..7 are still the oldest
    put = _wait(tier, tier.submit_put([_key(100 + i) for i in range(5)], [0] * 5))
    assert set(put.evicted) == {_key(i) for i in range(4, 8)}  # type: ignore[attr-defined]
    tier.close()


def test_save_policy_state_false_leaves_no_state_and_restarts_oldest_first(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(512, 2)
    tier = _tier(memory, tmp_path, 8, save_policy_state=False)
    assert _wait(tier, tier.submit_put([_key(i) for i in range(8)], [0] * 8)).all_ok  # type: ignore[attr-defined]
    for i in range(4):
        assert _wait(tier, tier.submit_get([_key(i)], [1])).all_ok  # type: ignore[attr-defined]
    tier.close()
    assert not list(tmp_path.rglob("policy-*.json"))
    cold = _tier(memory, tmp_path, 8)
    assert cold.stats()["policy_state_restored"] == 0
    assert _victims_of_four_new_records(cold) == {_key(i) for i in range(4)}
    cold.close()


@pytest.mark.parametrize("flag", ["save_policy_state", "verify_on_scan"])
def test_the_disk_tiers_flags_must_be_bools(tmp_path: Path, flag: str) -> None:
    with pytest.raises(TypeError, match=f"{flag} must be True or False"):
        _tier(BytearraySlotMemory(512, 2), tmp_path, 4, **{flag: "no"})


class _ConcurrentWrites(FileLayer):
    """Counts how many ``pwritev`` calls are in the kernel at once (each held a little)."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self._guard = threading.Lock()

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        with self._guard:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.02)
        try:
            return super().pwritev(fd, buffers, offset)
        finally:
            with self._guard:
                self.now -= 1


@pytest.mark.parametrize(("put_lanes", "most"), [(1, 1), (2, 2), (None, 4)])
def test_put_lanes_bound_the_puts_in_flight(
    tmp_path: Path, put_lanes: int | None, most: int
) -> None:
    """Under ``fsync`` no write lock serialises the writes, so the lane is what bounds them
    (the default there: every I/O thread)."""
    memory = BytearraySlotMemory(512, 16)
    files = _ConcurrentWrites()
    tier = _tier(
        memory, tmp_path, 64, durability="fsync", io_threads=4, put_lanes=put_lanes, files=files
    )
    jobs = [
        tier.submit_put([_key(10 * j + i) for i in range(2)], [2 * j, 2 * j + 1]) for j in range(8)
    ]
    assert tier.drain(30)
    assert {r.job_id for r in tier.poll() if r.all_ok} == set(jobs)
    assert files.most == most
    tier.close()
