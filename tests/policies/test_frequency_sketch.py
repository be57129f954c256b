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
