"""Offload keys and deterministic, namespaced chained block hashing.

An :data:`OffloadKey` is raw ``bytes`` (no tuple, no object: cheap to hash and store) encoded
exactly as vLLM encodes it: the block hash followed by the KV-cache group index as 4 unsigned
big-endian bytes. Keys built here therefore interoperate with keys built by vLLM.

:func:`hash_token_blocks` chains every block hash to its parent, so one hash names the whole
token prefix that ends at that block. Unlike vLLM's default it is stable across processes and
machines (no random per-process seed) and it carries a namespace (model, dtype, KV layout), so
two models can never share a key by accident.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import NewType

OffloadKey = NewType("OffloadKey", bytes)

GROUP_IDX_BYTES = 4
_MAX_GROUP_IDX = 2**32 - 1
_HASH_DIGEST_BYTES = 32


def make_offload_key(block_hash: bytes, group_idx: int = 0) -> OffloadKey:
    """Encode like vLLM: ``block_hash`` bytes + ``group_idx`` as 4 big-endian bytes."""
    if not isinstance(block_hash, (bytes, bytearray, memoryview)):
        raise TypeError(f"block_hash must be bytes, got {type(block_hash).__name__}")
    if not 0 <= group_idx <= _MAX_GROUP_IDX:
        raise ValueError(f"group_idx must be in [0, 2**32 - 1], got {group_idx}")
    return OffloadKey(bytes(block_hash) + group_idx.to_bytes(GROUP_IDX_BYTES, "big"))


def _check_key(key: bytes) -> None:
    if len(key) < GROUP_IDX_BYTES:
        raise ValueError(
            f"an offload key has at least {GROUP_IDX_BYTES} bytes (the group index), got {len(key)}"
        )


def get_offload_block_hash(key: bytes) -> bytes:
    """Return the block-hash part of ``key`` (everything but the last 4 bytes)."""
    _check_key(key)
    return bytes(key[:-GROUP_IDX_BYTES])


def get_offload_group_idx(key: bytes) -> int:
    """Return the KV-cache group index stored in the last 4 bytes of ``key``."""
    _check_key(key)
    return int.from_bytes(key[-GROUP_IDX_BYTES:], "big")


def namespace_fingerprint(**fields: object) -> bytes:
    """Digest of named fields (model, dtype, layout, ...) used as a hashing namespace.

    Field order does not matter; values are rendered with ``repr`` so ``1`` and ``"1"`` differ.
    """
    text = "\x1f".join(f"{name}={fields[name]!r}" for name in sorted(fields))
    return hashlib.sha256(b"kvoffload-ns\x00" + text.encode()).digest()


def root_hash(namespace: bytes | str = b"") -> bytes:
    """The parent hash of a sequence's first block within ``namespace``."""
    ns = namespace.encode() if isinstance(namespace, str) else bytes(namespace)
    return hashlib.sha256(b"kvoffload-root\x00" + ns).digest()


def hash_token_blocks(
    token_ids: Sequence[int],
    block_size: int,
    namespace: bytes | str = b"",
    parent_hash: bytes | None = None,
) -> list[bytes]:
    """Hash every *full* block of ``token_ids``, each hash chained to its parent's.

    The trailing partial block (fewer than ``block_size`` tokens) is not hashed: its KV is not
    reusable as a block. ``parent_hash`` continues a chain (e.g. a later turn of a session);
    by default the chain starts at :func:`root_hash` of ``namespace``. Token ids must fit in
    a signed 64-bit integer. The result is identical on every process and machine.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
    parent = root_hash(namespace) if parent_hash is None else bytes(parent_hash)
    num_full = len(token_ids) // block_size
    pack = struct.Struct(f"<{block_size}q").pack
    hashes: list[bytes] = []
    for i in range(num_full):
        block = token_ids[i * block_size : (i + 1) * block_size]
        try:
            payload = pack(*block)
        except struct.error as exc:
            raise ValueError(
                f"block {i}: token ids must be integers in the signed 64-bit range ({exc})"
            ) from exc
        parent = hashlib.sha256(parent + payload).digest()
        hashes.append(parent)
    return hashes


def int_key(i: int) -> OffloadKey:
    """A compact key for an integer block id (8-byte big-endian hash + group 0, vLLM's encoding).

    The simulator and the test drivers name trace blocks by integer; this is their one key form.
    """
    return OffloadKey(i.to_bytes(8, "big", signed=True) + b"\x00\x00\x00\x00")


__all__ = [
    "GROUP_IDX_BYTES",
    "OffloadKey",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "hash_token_blocks",
    "int_key",
    "make_offload_key",
    "namespace_fingerprint",
    "root_hash",
]
