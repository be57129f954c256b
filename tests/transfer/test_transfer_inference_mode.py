"""The offloader under ``torch.inference_mode()``, as every Hugging Face user calls it.

Tensors made in inference mode (the KV caches, the host buffer) may only be written in place
inside inference mode; the worker's copies run on its own threads, so they must enter it
themselves or every store and load fails there.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from transfer_helpers import make_caches  # noqa: E402

from kvoffload.keys import hash_token_blocks  # noqa: E402
from kvoffload.offloader import KVOffloader  # noqa: E402

TOKENS = 4


def _round_trip(off: KVOffloader, caches: list[torch.Tensor]) -> None:
    original = [c.clone() for c in caches]
    hashes = hash_token_blocks(list(range(6 * TOKENS)), TOKENS)
    assert off.store(hashes, [0, 1, 2, 3, 4, 5]) == 6
    assert off.lookup(hashes) == 6
    assert off.load(hashes, [10, 11, 12, 13, 14, 15]) == 6
    for c, o in zip(caches, original, strict=True):
        assert torch.equal(c[:, 10:16].view(torch.int16), o[:, 0:6].view(torch.int16))
    stats = off.stats()
    assert (stats.failed_stores, stats.failed_loads) == (0, 0)


@pytest.mark.parametrize("bpc", [1, 2])
def test_built_and_called_in_inference_mode(bpc: int) -> None:
    with torch.inference_mode():
        caches = make_caches("kv_first", torch.float16, layers=2, blocks=32, seed=1)
        with KVOffloader(caches, cpu_bytes=1 << 20, blocks_per_chunk=bpc) as off:
            _round_trip(off, caches)


def test_built_in_inference_mode_called_outside() -> None:
    with torch.inference_mode():
        caches = make_caches("kv_first", torch.float16, layers=2, blocks=32, seed=2)
        off = KVOffloader(caches, cpu_bytes=1 << 20)
    with off:
        _round_trip(off, caches)


def test_normal_tensors_called_in_inference_mode() -> None:
    caches = make_caches("kv_first", torch.float16, layers=2, blocks=32, seed=3)
    with KVOffloader(caches, cpu_bytes=1 << 20) as off, torch.inference_mode():
        _round_trip(off, caches)
    assert not caches[0].is_inference()
