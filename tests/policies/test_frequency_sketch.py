"""TinyLFU frequency sketch: bounds against exact counts, saturation, doorkeeper, aging."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kvoffload.policies.frequency_sketch import MAX_COUNT, FrequencySketch
from kvoffload.testing import int_key


def test_never_underestimates_and_is_mostly_exact() -> None:
    rng = random.Random(1)
    sketch = FrequencySketch(512, sample_size=10**9)
    counts: Counter[int] = Counter()
    for _ in range(5000):
        block = int(rng.paretovariate(1.0)) % 400
        counts[block] += 1
        sketch.increment(int_key(block))
    exact = 0
    for block, count in counts.items():
        estimate = sketch.estimate(int_key(block))
        assert estimate >= min(count, MAX_COUNT + 1)  # +1: the doorkeeper's first use
        exact += estimate == min(count, MAX_COUNT + 1)
    assert exact >= 0.9 * len(counts)
    assert sketch.estimate(int_key(10**6)) <= 1  # unseen: zero unless hash collisions


def test_counters_saturate_at_15_plus_the_doorkeeper() -> None:
    sketch = FrequencySketch(64, sample_size=10**6)
    for _ in range(100):
        sketch.increment(b"hot-key")
    assert sketch.estimate(b"hot-key") == MAX_COUNT + 1


def test_doorkeeper_absorbs_the_first_use() -> None:
    with_door = FrequencySketch(64, sample_size=1000)
    without = FrequencySketch(64, sample_size=1000, doorkeeper=False)
    for sketch in (with_door, without):
        sketch.increment(b"k")
        assert sketch.estimate(b"k") == 1
        sketch.increment(b"k")
        assert sketch.estimate(b"k") == 2
    assert with_door.estimate(b"other") == 0


def test_aging_halves_counters_and_clears_the_doorkeeper() -> None:
    sketch = FrequencySketch(64, sample_size=40)
    for _ in range(11):
        sketch.increment(b"tracked")  # doorkeeper + 10 in the counters
    assert sketch.estimate(b"tracked") == 11
    for _ in range(29):
        sketch.increment(b"filler")  # the 40th use triggers aging
    assert sketch.additions == 20
    assert sketch.estimate(b"tracked") == 5  # 10 // 2, doorkeeper cleared


def test_clear_forgets_everything() -> None:
    sketch = FrequencySketch(64, sample_size=1000)
    for _ in range(3):
        sketch.increment(b"k")
    sketch.clear()
    assert sketch.estimate(b"k") == 0
    assert sketch.additions == 0


def test_estimates_are_reproducible_between_instances() -> None:
    first, second = FrequencySketch(32, sample_size=50), FrequencySketch(32, sample_size=50)
    rng = random.Random(2)
    keys = [int_key(rng.randrange(100)) for _ in range(400)]
    for key in keys:
        first.increment(key)
        second.increment(key)
    assert [first.estimate(k) for k in keys] == [second.estimate(k) for k in keys]


def test_sample_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="sample_size"):
        FrequencySketch(8, sample_size=0)


@pytest.mark.parametrize("doorkeeper", [True, False])
def test_batched_increments_equal_single_ones(doorkeeper: bool) -> None:
    """increment_keys (hashing fused with recording) across sample periods, batch sizes and
    repeated keys moves the sketch exactly as increment does, one key at a time."""
    rng = random.Random(3)
    batched = FrequencySketch(40, sample_size=37, doorkeeper=doorkeeper)
    single = FrequencySketch(40, sample_size=37, doorkeeper=doorkeeper)
    hashed = FrequencySketch(40, sample_size=37, doorkeeper=doorkeeper)
    for _ in range(300):
        keys = [int_key(rng.randrange(60)) for _ in range(rng.randint(1, 30))]
        batched.increment_keys(keys)
        hashed.increment_hashes(FrequencySketch.key_hashes(keys))
        for key in keys:
            single.increment(key)
        probe = [int_key(i) for i in range(60)]
        expected = [single.estimate(key) for key in probe]
        assert [batched.estimate(key) for key in probe] == expected
        assert [hashed.estimate(key) for key in probe] == expected
        assert batched.additions == single.additions == hashed.additions
        assert batched._rows == single._rows == hashed._rows  # every counter, not just minima
        assert batched._door == single._door == hashed._door


def test_hashes_are_the_same_in_every_process() -> None:
    import os
    import subprocess
    import sys

    keys = [int_key(i) for i in (0, 1, -1, 2**40)] + [b"k", bytes(range(36))]
    code = (
        "from kvoffload.policies.frequency_sketch import FrequencySketch as F;"
        f"print(F.key_hashes({keys!r}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(FrequencySketch.key_hashes(keys))


def test_memory_follows_use() -> None:
    """No doorkeeper or rows allocated up front for a huge cache (was 1 GB at 10**7 blocks)."""
    import tracemalloc

    from kvoffload.policies.wtinylfu import WTinyLFUCachePolicy

    tracemalloc.start()
    try:
        WTinyLFUCachePolicy(10**7)
        FrequencySketch(512, sample_size=10**9)  # was a 4 GiB doorkeeper (and 4.4 GB RSS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak


def test_sparse_and_dense_sketches_count_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sparse sketch (large ones start so) holds the same counters as a dense one, before
    and after it fills up and turns dense, through agings."""
    import kvoffload.policies.frequency_sketch as fs

    rng = random.Random(4)
    keys = [int_key(rng.randrange(3000)) for _ in range(30000)]
    dense = FrequencySketch(4096, sample_size=9000)
    monkeypatch.setattr(fs, "DENSE_BYTES", 0)
    sparse = FrequencySketch(4096, sample_size=9000)
    assert sparse._sparse and not dense._sparse
    probe = keys[:200] + [int_key(10**6 + i) for i in range(50)]
    turned_dense = False
    for start in range(0, len(keys), 500):
        for sketch in (dense, sparse):
            sketch.increment_keys(keys[start : start + 500])
        assert [sparse.estimate(k) for k in probe] == [dense.estimate(k) for k in probe]
        turned_dense = turned_dense or not sparse._sparse
        if start == 1000:
            sparse.age(), dense.age()
    assert turned_dense
    assert sparse._rows == dense._rows and sparse._door == dense._door


def test_wtinylfu_decides_alike_with_a_sparse_sketch(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvoffload.policies.frequency_sketch as fs
    from kvoffload.policies.wtinylfu import WTinyLFUCachePolicy
    from kvoffload.testing import drive_single_blocks

    rng = random.Random(5)
    ids = [int(rng.paretovariate(0.8)) % 5000 for _ in range(20000)]
    dense_hits = drive_single_blocks(WTinyLFUCachePolicy(300), ids)
    monkeypatch.setattr(fs, "DENSE_BYTES", 0)
    policy = WTinyLFUCachePolicy(300)
    assert policy._sketch._sparse
    assert drive_single_blocks(policy, ids) == dense_hits
