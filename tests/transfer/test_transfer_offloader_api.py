"""KVOffloader's engine-facing helpers: the hit cap for a prompt, chunk-aligned stores, and
a model namespace that keeps two models' blocks apart on every tier."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from transfer_helpers import make_caches  # noqa: E402

from kvoffload.offloader import KVOffloader  # noqa: E402

TOKENS = 4  # tokens per device block in make_caches
PER_BLOCK = 2 * 2 * TOKENS * 2 * 4 * 2  # layers * (K, V) * tokens * heads * head_size * fp16


def _offloader(bpc: int = 1, **kw: object) -> KVOffloader:
    caches = make_caches("kv_first", torch.float16, layers=2, blocks=32, seed=3)
    return KVOffloader(caches, cpu_bytes=16 * PER_BLOCK, blocks_per_chunk=bpc, **kw)


def test_lookup_caps_the_hit_so_the_last_token_is_computed() -> None:
    with _offloader() as off:
        tokens = list(range(4 * TOKENS))  # exactly 4 blocks
        hashes = off.hash_tokens(tokens)
        assert len(hashes) == 4
        off.store(hashes, [0, 1, 2, 3])
        assert off.lookup(hashes) == 4  # uncapped: a full hit, nothing left to compute
        assert off.lookup(hashes, num_tokens=len(tokens)) == 3
        assert off.lookup(hashes, num_tokens=len(tokens) + 1) == 4
        assert off.lookup(hashes, num_tokens=1) == 0
        with pytest.raises(ValueError, match="num_tokens"):
            off.lookup(hashes, num_tokens=0)
    with _offloader(bpc=2) as off:
        assert off.max_hit_blocks(16) == 2  # 15 tokens: one whole chunk of 8
        assert off.max_hit_blocks(17) == 4


def test_a_store_off_a_chunk_boundary_is_refused() -> None:
    with _offloader(bpc=2) as off:
        hashes = off.hash_tokens(list(range(6 * TOKENS)))
        with pytest.raises(ValueError, match="first_block 1 is not on a chunk boundary"):
            off.store(hashes[1:], [1, 2, 3, 4, 5], first_block=1)
        assert off.store(hashes[2:], [2, 3, 4, 5], first_block=2) == 4
        assert off.lookup(hashes) == 0  # the first chunk was never stored
        assert off.store(hashes, list(range(6))) == 2  # only the missing chunk is written
        assert off.lookup(hashes) == 6


def test_namespace_must_be_a_model_id() -> None:
    with pytest.raises(TypeError, match="namespace must be a str or bytes"):
        _offloader(namespace=7)
    with pytest.raises(ValueError, match="namespace must be a non-empty"):
        _offloader(namespace="")


def _tiered(tiers: list[dict[str, object]], namespace: str) -> KVOffloader:
    caches = make_caches("kv_first", torch.float16, layers=2, blocks=32, seed=5)
    return KVOffloader(caches, cpu_bytes=16 * PER_BLOCK, tiers=tiers, namespace=namespace)


def _two_models_stay_apart(tiers: list[dict[str, object]]) -> None:
    first = _tiered(tiers, "model-a")
    hashes = first.hash_tokens(list(range(6 * TOKENS)))
    first.store(hashes, list(range(6)))
    first.close()  # drains the write-through puts
    other = _tiered(tiers, "model-b")  # same shape, same tokens, another model
    assert other.lookup(hashes) == 0
    other.close()
    same = _tiered(tiers, "model-a")
    assert same.lookup(hashes) == 6
    same.close()


def test_namespace_keeps_two_models_apart_on_disk(tmp_path: Path) -> None:
    _two_models_stay_apart([{"type": "disk", "path": str(tmp_path), "capacity_bytes": "1MiB"}])


def test_namespace_keeps_two_models_apart_on_redis() -> None:
    pytest.importorskip("redis")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tiers"))
    from redis_servers import ci_url

    url = ci_url("KVOFFLOAD_REDIS_URL")
    _two_models_stay_apart([{"type": "redis", "url": url, "namespace": uuid.uuid4().hex}])
