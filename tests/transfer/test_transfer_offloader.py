"""KVOffloader end to end: real copies, the manager's bookkeeping, failures and resets."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from transfer_helpers import make_caches  # noqa: E402

from kvoffload.keys import hash_token_blocks  # noqa: E402
from kvoffload.offloader import KVOffloader, TransferError  # noqa: E402
from kvoffload.transfer import cpu_worker  # noqa: E402

TOKENS = 4  # tokens per device block in make_caches


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _hashes(n_blocks: int, seed: int = 0) -> list[bytes]:
    tokens = [seed * 100_000 + i for i in range(n_blocks * TOKENS)]
    return hash_token_blocks(tokens, TOKENS)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _offloader(
    slots: int, bpc: int = 1, device: str = "cpu", **config: object
) -> tuple[KVOffloader, list[torch.Tensor]]:
    caches = make_caches("kv_first", torch.float16, layers=2, blocks=32, seed=3, device=device)
    per_slot = 2 * 2 * TOKENS * 2 * 4 * 2 * bpc  # layers * (K, V) * page bytes * bpc
    return KVOffloader(caches, cpu_bytes=slots * per_slot, blocks_per_chunk=bpc, **config), caches


def _same(
    caches: list[torch.Tensor], dst: list[int], src: list[int], reference: list[torch.Tensor]
) -> bool:
    return all(
        torch.equal(_bits(c[:, dst]), _bits(r[:, src]))
        for c, r in zip(caches, reference, strict=True)
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bpc", [1, 2])
def test_store_lookup_load_round_trip(bpc: int, device: str) -> None:
    off, caches = _offloader(slots=8, bpc=bpc, device=device)
    original = [c.clone() for c in caches]
    hashes = _hashes(8)
    with off:
        assert off.lookup(hashes) == 0
        assert off.store(hashes, list(range(8))) == 8
        assert off.lookup(hashes) == 8
        assert off.lookup(hashes[:5]) == (5 // bpc) * bpc
        targets = [20, 9, 31, 12, 13, 30, 8, 25]
        assert off.load(hashes, targets) == 8
        assert _same(caches, targets, list(range(8)), original)
        untouched = [b for b in range(32) if b not in targets]
        assert _same(caches, untouched, untouched, original)
        stats = off.stats()
        assert stats.loaded_blocks == 8 and stats.stored_blocks == 8
        assert stats.loaded_bytes == stats.stored_bytes > 0
        assert stats.manager is not None and stats.manager.pinned_blocks == 0


def test_eviction_keeps_the_tier_within_its_slots() -> None:
    off, caches = _offloader(slots=4)
    with off:
        first, second = _hashes(4, seed=1), _hashes(4, seed=2)
        assert off.store(first, [0, 1, 2, 3]) == 4
        assert off.store(second, [4, 5, 6, 7]) == 4  # evicts all of `first` (LRU)
        assert off.lookup(first) == 0 and off.lookup(second) == 4
        original = [c.clone() for c in caches]
        off.load(second, [10, 11, 12, 13])
        assert _same(caches, [10, 11, 12, 13], [4, 5, 6, 7], original)
        assert off.stats().manager.evictions == 4  # type: ignore[union-attr]


def test_trailing_partial_chunk_is_not_stored_and_loads_need_whole_chunks() -> None:
    off, _ = _offloader(slots=8, bpc=2)
    hashes = _hashes(5)
    with off:
        assert off.store(hashes, [0, 1, 2, 3, 4]) == 4
        assert off.lookup(hashes) == 4
        with pytest.raises(ValueError, match="whole number of chunks"):
            off.load(hashes[:3], [9, 10, 11])
        with pytest.raises(ValueError, match="same length"):
            off.store(hashes, [0, 1])
        with pytest.raises(ValueError, match="group"):
            off.lookup(hashes, group=1)


def test_loading_a_miss_is_refused_before_any_copy() -> None:
    off, _ = _offloader(slots=4)
    with off:
        with pytest.raises(ValueError, match="lookup returned HIT"):
            off.load(_hashes(2), [0, 1])
        assert off.stats().manager.pinned_blocks == 0  # type: ignore[union-attr]


def test_failed_store_leaves_no_block_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    off, caches = _offloader(slots=4)

    def broken(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        raise RuntimeError("simulated DMA fault")

    hashes = _hashes(3)
    with off:
        monkeypatch.setattr(cpu_worker, "copy_pairs", broken)
        with pytest.raises(TransferError, match="simulated DMA fault"):
            off.store(hashes, [0, 1, 2])  # a failed copy is an error, not "nothing new"
        monkeypatch.undo()
        stats = off.stats()
        assert stats.failed_stores == 1 and stats.stored_blocks == 0
        m = stats.manager
        assert m is not None and (m.stored_blocks, m.pending_blocks, m.stores_failed) == (0, 0, 3)
        assert off.lookup(hashes) == 0
        # The freed slots serve the next store, byte-exact.
        original = [c.clone() for c in caches]
        assert off.store(hashes, [0, 1, 2]) == 3
        off.load(hashes, [20, 21, 22])
        assert _same(caches, [20, 21, 22], [0, 1, 2], original)


def test_store_tells_nothing_new_from_no_room() -> None:
    off, _ = _offloader(slots=2)
    hashes = _hashes(2)
    with off:
        assert off.store(hashes, [0, 1]) == 2
        assert off.store(hashes, [0, 1]) == 0  # nothing new: no error, nothing counted
        assert (off.stats().failed_stores, off.stats().stores_without_room) == (0, 0)
        off.begin_request()  # keeps nothing pinned: the two blocks stay evictable
        assert off.store(_hashes(3, seed=1), [2, 3, 4]) == 0  # 3 chunks never fit 2 slots
        assert (off.stats().failed_stores, off.stats().stores_without_room) == (0, 1)


def test_background_stores_failing_in_a_row_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    off, _ = _offloader(slots=16)

    def broken(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        raise RuntimeError("simulated DMA fault")

    with off:
        monkeypatch.setattr(cpu_worker, "copy_pairs", broken)
        off.store(_hashes(1, seed=1), [0], wait=False)
        off.flush()  # one failure: counted and logged, no error yet
        monkeypatch.undo()
        assert off.store(_hashes(1, seed=2), [1], wait=False) == 1
        off.flush()  # a success resets the run of failures
        monkeypatch.setattr(cpu_worker, "copy_pairs", broken)
        for seed in (3, 4):
            off.store(_hashes(1, seed=seed), [seed], wait=False)
        off.flush()
        off.store(_hashes(1, seed=5), [5], wait=False)
        with pytest.raises(TransferError, match=r"last 3 stores all failed.*simulated DMA fault"):
            off.flush()  # waits for the third, then raises (as would any other call)
        monkeypatch.undo()
        assert off.stats().failed_stores == 4
        assert off.lookup(_hashes(1, seed=5)) == 0  # raised once; the offloader still works
        assert off.store(_hashes(1, seed=5), [5]) == 1


def test_failed_load_raises_and_unpins(monkeypatch: pytest.MonkeyPatch) -> None:
    off, caches = _offloader(slots=4)
    hashes = _hashes(2)
    original = [c.clone() for c in caches]
    with off:
        off.store(hashes, [0, 1])

        def broken(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
            raise RuntimeError("simulated DMA fault")

        monkeypatch.setattr(cpu_worker, "copy_pairs", broken)
        with pytest.raises(TransferError, match="simulated DMA fault"):
            off.load(hashes, [5, 6])
        monkeypatch.undo()
        m = off.stats().manager
        assert m is not None and (m.pinned_blocks, m.stored_blocks) == (0, 2)
        assert off.lookup(hashes) == 2
        off.load(hashes, [5, 6])
        assert _same(caches, [5, 6], [0, 1], original)
        assert off.stats().failed_loads == 1


@pytest.mark.parametrize("device", DEVICES)
def test_reset_with_a_store_in_flight_ignores_its_stale_completion(device: str) -> None:
    off, caches = _offloader(slots=4, device=device)
    old, new = _hashes(4, seed=1), _hashes(4, seed=2)
    original = [c.clone() for c in caches]
    with off:
        assert off.store(old, [0, 1, 2, 3], wait=False) == 4
        off.reset()
        assert off.lookup(old) == 0
        # New stores reuse slots 0..3: they are ordered after the stale writes to them.
        assert off.store(new, [4, 5, 6, 7]) == 4
        off.flush()
        m = off.stats().manager
        assert m is not None
        assert m.stale_completions == 4 and m.pending_blocks == 0 and m.stored_blocks == 4
        assert off.lookup(old) == 0 and off.lookup(new) == 4
        off.load(new, [10, 11, 12, 13])
        assert _same(caches, [10, 11, 12, 13], [4, 5, 6, 7], original)


def test_background_store_is_a_hit_only_once_complete() -> None:
    off, _ = _offloader(slots=4)
    hashes = _hashes(2)
    with off:
        off.store(hashes, [0, 1], wait=False)
        off.flush()
        assert off.lookup(hashes) == 2


def test_one_request_spans_several_calls() -> None:
    off, _caches = _offloader(slots=8)
    hashes = _hashes(4)
    with off:
        off.store(hashes, [0, 1, 2, 3])
        ctx = off.begin_request("req-1")
        hit = off.lookup(hashes, ctx=ctx)
        off.load(hashes[:hit], [8, 9, 10, 11], ctx=ctx)
        off.end_request(ctx)
        assert hit == 4


def test_closed_offloader_refuses_calls_and_unknown_config_is_rejected() -> None:
    off, _ = _offloader(slots=2)
    off.close()
    off.close()
    with pytest.raises(RuntimeError, match="closed"):
        off.lookup(_hashes(1))
    caches = make_caches("kv_first", torch.float16, layers=1, blocks=4)
    with pytest.raises(ValueError, match="Did you mean 'store_threshold'"):
        KVOffloader(caches, cpu_bytes=1 << 20, store_treshold=2)


def test_a_hash_given_twice_is_stored_once_from_its_first_block() -> None:
    off, caches = _offloader(slots=3)
    h = _hashes(4, seed=5)
    original = [c.clone() for c in caches]
    with off:
        assert off.store([h[0], h[0]], [1, 2]) == 1
        m = off.stats().manager
        assert m is not None and (m.stored_blocks, m.pending_blocks) == (1, 0)
        assert off.load([h[0]], [9]) == 1
        assert _same(caches, [9], [1], original)
        assert off.store(h[1:], [3, 4, 5]) == 3  # 3 fresh blocks still fit the 3 slots


def test_reset_keeps_the_slots_of_stores_in_flight_until_they_complete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    off, caches = _offloader(slots=6)
    old, new = _hashes(4, seed=1), _hashes(2, seed=2)
    original = [c.clone() for c in caches]
    gate = threading.Event()
    real_copy = cpu_worker.copy_pairs

    def gated(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        assert gate.wait(30), "the test never opened the gate"
        real_copy(dst, src)

    submitted: list[list[int]] = []
    real_submit = off.worker.submit_store

    def spy(job_id: int, blocks: list[int], slots: list[int], *args: object) -> None:
        submitted.append(list(slots))
        real_submit(job_id, blocks, slots, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_worker, "copy_pairs", gated)
    monkeypatch.setattr(off.worker, "submit_store", spy)
    with off:
        assert off.store(old, [0, 1, 2, 3], wait=False) == 4  # held up in the worker
        off.reset()
        m = off.stats().manager
        assert m is not None and (m.held_blocks, m.stored_blocks) == (4, 0)
        assert off.store(new, [4, 5], wait=False) == 2
        assert not set(submitted[1]) & set(submitted[0]), "reused a slot still being written"
        gate.set()
        off.flush()
        m = off.stats().manager
        assert m is not None and (m.held_blocks, m.stale_completions, m.stored_blocks) == (0, 4, 2)
        assert off.lookup(old) == 0 and off.lookup(new) == 2
        off.load(new, [10, 11])
        assert _same(caches, [10, 11], [4, 5], original)
        assert off.store(_hashes(4, seed=3), [20, 21, 22, 23]) == 4  # the held slots are back


def test_facade_moved_above_the_spec_and_keeps_its_old_names() -> None:
    import kvoffload.transfer as transfer

    assert transfer.KVOffloader is KVOffloader
    assert transfer.TransferError is TransferError
    assert KVOffloader.__module__ == "kvoffload.offloader"
    assert not hasattr(KVOffloader, "from_spec")  # dead code removed (issue 13 item 8)
