from __future__ import annotations

import subprocess
import sys

import pytest

from kvoffload.keys import (
    get_offload_block_hash,
    get_offload_group_idx,
    hash_token_blocks,
    int_key,
    make_offload_key,
    namespace_fingerprint,
)


def test_key_encoding_matches_vllm_layout() -> None:
    key = make_offload_key(b"\xab" * 8, 258)
    assert key == b"\xab" * 8 + b"\x00\x00\x01\x02"
    assert get_offload_block_hash(key) == b"\xab" * 8
    assert get_offload_group_idx(key) == 258


@pytest.mark.parametrize("group", [-1, 2**32])
def test_group_index_out_of_range_is_rejected(group: int) -> None:
    with pytest.raises(ValueError, match="group_idx"):
        make_offload_key(b"h", group)


def test_short_key_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least 4 bytes"):
        get_offload_group_idx(b"abc")
    with pytest.raises(TypeError):
        make_offload_key("not bytes", 0)  # type: ignore[arg-type]


def test_hashes_are_chained_and_skip_partial_tail() -> None:
    tokens = list(range(10))
    hashes = hash_token_blocks(tokens, 4)
    assert len(hashes) == 2  # 2 full blocks, the 2-token tail is not hashed
    # Same second block content after a different first block -> different hash (chained).
    other = hash_token_blocks([99, 1, 2, 3, 4, 5, 6, 7], 4)
    assert other[1] != hashes[1]
    # Extending the sequence keeps the prefix hashes.
    assert hash_token_blocks(list(range(16)), 4)[:2] == hashes
    # Continuing a chain from a parent equals hashing the whole sequence.
    assert hash_token_blocks(tokens[4:8], 4, parent_hash=hashes[0]) == hashes[1:2]


def test_namespace_separates_models() -> None:
    tokens = list(range(8))
    a = hash_token_blocks(tokens, 4, namespace=namespace_fingerprint(model="a", dtype="fp16"))
    b = hash_token_blocks(tokens, 4, namespace=namespace_fingerprint(model="b", dtype="fp16"))
    assert a[0] != b[0]
    assert namespace_fingerprint(model="a", dtype="x") == namespace_fingerprint(
        dtype="x", model="a"
    )


def test_hashes_are_stable_across_processes() -> None:
    code = (
        "from kvoffload.keys import hash_token_blocks;"
        "print(hash_token_blocks(list(range(64)), 16, namespace='m')[-1].hex())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert outputs.pop().strip() == hash_token_blocks(list(range(64)), 16, namespace="m")[-1].hex()


def test_bad_block_size_and_tokens() -> None:
    with pytest.raises(ValueError, match="block_size"):
        hash_token_blocks([1, 2], 0)
    with pytest.raises(ValueError, match="64-bit"):
        hash_token_blocks([2**70, 1], 2)


def test_int_key_is_a_vllm_key_in_group_zero() -> None:
    # The simulator's key for integer trace block ids lives in the core (sim must not import
    # kvoffload.testing); testing re-exports the same function.
    from kvoffload.testing import int_key as testing_int_key

    assert int_key(258) == make_offload_key((258).to_bytes(8, "big"), 0)
    assert get_offload_block_hash(int_key(-1)) == b"\xff" * 8
    assert get_offload_group_idx(int_key(7)) == 0
    assert testing_int_key is int_key
