"""Worker behaviour beyond single round trips: concurrency, ordering, errors, failures."""

from __future__ import annotations

import random
import threading

import pytest

torch = pytest.importorskip("torch")

from transfer_helpers import expected_slot, make_caches, slot_bytes  # noqa: E402

from kvoffload.layout import KVCacheLayout, KVTensorLayout  # noqa: E402
from kvoffload.transfer import cpu_worker  # noqa: E402
from kvoffload.transfer.cpu_worker import RowRuns  # noqa: E402
from kvoffload.transfer.factory import create_transfer_worker  # noqa: E402
from kvoffload.transfer.host import HostBuffer  # noqa: E402
from kvoffload.transfer.worker import TransferWorker  # noqa: E402

# "cuda-direct": the CUDA worker's per-page baseline copy mode, under the same ordering rules.
DEVICES = ["cpu"] + (["cuda", "cuda-direct"] if torch.cuda.is_available() else [])


def _worker(
    blocks: int = 32, slots: int = 16, bpc: int = 1, device: str = "cpu"
) -> tuple[TransferWorker, list[torch.Tensor], KVCacheLayout, HostBuffer]:
    on = "cuda" if device.startswith("cuda") else device
    caches = make_caches("kv_first", torch.float16, layers=2, blocks=blocks, seed=1, device=on)
    layout = KVCacheLayout.from_tensors(caches)
    pin = None if on == "cuda" else False
    host = HostBuffer(layout.slot_layout(bpc).slot_bytes, slots, pin=pin)
    if device == "cuda-direct":
        from kvoffload.transfer.cuda_worker import CudaTransferWorker

        worker: TransferWorker = CudaTransferWorker(
            layout, layout.slot_layout(bpc), host, caches, copy_mode="direct"
        )
    else:
        worker = create_transfer_worker(layout, layout.slot_layout(bpc), host, caches)
    return worker, caches, layout, host


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.mark.parametrize("device", DEVICES)
def test_many_concurrent_jobs_all_complete_byte_exact(device: str) -> None:
    worker, caches, layout, host = _worker(blocks=64, slots=32, device=device)
    rng = random.Random(0)
    slot_ids = list(range(32))
    rng.shuffle(slot_ids)
    stored: dict[int, int] = {}  # slot -> device block
    with worker:
        for job in range(8):  # 8 stores of 4 chunks each, in flight together
            blocks = rng.sample(range(64), 4)
            slots = slot_ids[4 * job : 4 * job + 4]
            stored.update(zip(slots, blocks, strict=True))
            worker.submit_store(job, blocks, slots)
        worker.wait(range(8))
        results = worker.get_finished()
        assert sorted(r.job_id for r in results) == list(range(8))
        assert all(r.success for r in results)
        assert worker.get_finished() == []  # each result is reported once
        for slot, block in stored.items():
            want = expected_slot(layout, layout.slot_layout(1), caches, 0, [block])
            assert slot_bytes(host, slot, len(want)) == want


@pytest.mark.parametrize("device", DEVICES)
def test_interleaved_stores_and_loads_of_one_slot_keep_submission_order(device: str) -> None:
    """store A->s, load s->x, store B->s, load s->y, all in flight: x gets A, y gets B."""
    for trial in range(5):
        worker, caches, layout, host = _worker(device=device)
        with worker:
            jobs = [
                ("store", [1], [3]),
                ("load", [3], [10]),
                ("store", [2], [3]),
                ("load", [3], [11]),
                ("store", [4], [3]),
            ]
            for job_id, (kind, a, b) in enumerate(jobs):
                if kind == "store":
                    worker.submit_store(job_id, a, b)
                else:
                    worker.submit_load(job_id, a, b)
            worker.wait(range(len(jobs)))
            assert all(r.success for r in worker.get_finished()), trial
            for c in caches:
                assert torch.equal(_bits(c[:, 10]), _bits(c[:, 1]))
                assert torch.equal(_bits(c[:, 11]), _bits(c[:, 2]))
            want = expected_slot(layout, layout.slot_layout(1), caches, 0, [4])
            assert slot_bytes(host, 3, len(want)) == want


@pytest.mark.parametrize("device", DEVICES)
def test_a_load_reads_the_slot_before_a_later_store_overwrites_it(device: str) -> None:
    worker, caches, _layout, _host = _worker(device=device)
    with worker:
        worker.submit_store(1, [5], [0])
        worker.wait([1])
        worker.submit_load(2, [0], [20])
        worker.submit_store(3, [6], [0])  # write-after-read: must wait for the load
        worker.wait([2, 3])
        assert all(r.success for r in worker.get_finished())
        for c in caches:
            assert torch.equal(_bits(c[:, 20]), _bits(c[:, 5]))


@pytest.mark.parametrize("device", DEVICES)
def test_submissions_from_several_threads(device: str) -> None:
    worker, caches, layout, host = _worker(blocks=64, slots=64, device=device)
    errors: list[BaseException] = []

    def submit(first: int) -> None:
        try:
            for k in range(8):
                job = first + k
                worker.submit_store(job, [job % 64], [job % 64])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with worker:
        threads = [threading.Thread(target=submit, args=(8 * t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        worker.wait_all()
        assert not errors
        results = worker.get_finished()
        assert sorted(r.job_id for r in results) == list(range(32))
        for s in range(32):
            want = expected_slot(layout, layout.slot_layout(1), caches, 0, [s])
            assert slot_bytes(host, s, len(want)) == want


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda w: w.submit_store(1, [0, 1], [0]), ValueError, "need 1 device block ids"),
        (lambda w: w.submit_store(1, [0], [16]), ValueError, "host_slot_ids: id 16"),
        (lambda w: w.submit_store(1, [32], [0]), ValueError, "device_block_ids: id 32"),
        (lambda w: w.submit_store(1, [0, 1], [2, 2]), ValueError, "cannot write one slot twice"),
        (lambda w: w.submit_load(1, [2, 3], [4, 4]), ValueError, "one device block twice"),
        (lambda w: w.submit_store(1, [0.5], [0]), TypeError, "sequence of ints"),
        (lambda w: w.submit_store("j", [0], [0]), TypeError, "job_id must be an int"),
        (lambda w: w.submit_store(1, [0], [0], group_ids=[1]), ValueError, "group_ids: id 1"),
    ],
)
def test_bad_submissions_raise_and_queue_nothing(call, error, message) -> None:  # type: ignore[no-untyped-def]
    worker, *_ = _worker()
    with worker:
        with pytest.raises(error, match=message):
            call(worker)
        assert worker.num_pending == 0 and worker.get_finished() == []


def test_job_ids_in_flight_are_unique_and_shutdown_refuses_new_jobs() -> None:
    worker, *_ = _worker()
    gate = threading.Event()
    original = cpu_worker.copy_pairs

    def slow_copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        gate.wait(5)
        original(dst, src)

    cpu_worker.copy_pairs = slow_copy  # type: ignore[assignment]
    try:
        worker.submit_store(1, [0], [0])
        with pytest.raises(ValueError, match="still in flight"):
            worker.submit_store(1, [1], [1])
    finally:
        gate.set()
        cpu_worker.copy_pairs = original  # type: ignore[assignment]
    worker.shutdown()
    assert [r.success for r in worker.get_finished()] == [True]
    with pytest.raises(RuntimeError, match="shut down"):
        worker.submit_store(2, [0], [0])
    worker.shutdown()  # idempotent


def test_group_ids_are_required_with_several_groups() -> None:
    caches = make_caches("mla", torch.float16, layers=2, blocks=8)
    layout = KVCacheLayout(
        [
            KVTensorLayout(f"l{i}", "mla", tuple(c.shape), "float16", group=i)
            for i, c in enumerate(caches)
        ]
    )
    host = HostBuffer(layout.slot_layout(1).slot_bytes, 4, pin=False)
    worker = create_transfer_worker(layout, layout.slot_layout(1), host, caches)
    with worker, pytest.raises(ValueError, match="group_ids is required"):
        worker.submit_store(1, [0], [0])


def test_a_failing_copy_reports_failure_and_the_worker_keeps_going(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker, caches, layout, host = _worker()
    calls = {"n": 0}
    original = cpu_worker.copy_pairs

    def flaky(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated copy fault")
        original(dst, src)

    monkeypatch.setattr(cpu_worker, "copy_pairs", flaky)
    with worker:
        worker.submit_store(1, [3], [2])
        worker.wait([1])
        [failed] = worker.get_finished()
        assert (failed.success, failed.bytes) == (False, 0)
        assert "simulated copy fault" in (failed.error or "")
        worker.submit_store(2, [3], [2])
        worker.wait([2])
        [ok] = worker.get_finished()
        assert ok.success and ok.bytes == layout.slot_layout(1).chunk_bytes(0)
        want = expected_slot(layout, layout.slot_layout(1), caches, 0, [3])
        assert slot_bytes(host, 2, len(want)) == want


def test_empty_job_completes_at_once() -> None:
    worker, *_ = _worker()
    with worker:
        worker.submit_load(5, [], [])
        assert [(r.job_id, r.success, r.bytes) for r in worker.get_finished()] == [(5, True, 0)]


def test_kv_tensors_must_match_the_layout() -> None:
    caches = make_caches("kv_first", torch.float16, layers=2, blocks=8)
    layout = KVCacheLayout.from_tensors(caches)
    host = HostBuffer(layout.slot_layout(1).slot_bytes, 4, pin=False)
    with pytest.raises(ValueError, match="the layout says shape"):
        create_transfer_worker(layout, layout.slot_layout(1), host, [caches[0], caches[1][:, :4]])
    with pytest.raises(ValueError, match="not contiguous"):
        create_transfer_worker(
            layout,
            layout.slot_layout(1),
            host,
            [caches[0], caches[1].transpose(3, 4).contiguous().transpose(3, 4)],
        )
    with pytest.raises(ValueError, match="slot layout needs"):
        create_transfer_worker(layout, layout.slot_layout(2), host, caches)


def test_row_runs_merge_only_pairs_advancing_together() -> None:
    runs = RowRuns([4, 5, 6, 9, 10], [0, 1, 2, 3, 7])
    assert runs.num_runs == 3 and runs.longest == 3
    matrix = torch.arange(40).view(20, 2)
    assert [p.tolist() for p in runs.pick_src(matrix)] == [
        [[8, 9], [10, 11], [12, 13]],
        [[18, 19]],
        [[20, 21]],
    ]
    assert RowRuns([1, 1, 2], [0, 1, 2]).num_runs == 3  # a repeated source row: no merging
