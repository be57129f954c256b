"""Offloading events: what the manager stored and removed, for external KV indexers.

The manager emits one :class:`OffloadingEvent` per completed store batch, per eviction batch
and per reset (only when events are enabled). :func:`to_kv_cache_events` turns them into
vLLM-style ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` records, the schema that
KV-aware routers consume.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.keys import get_offload_block_hash, get_offload_group_idx

CPU_MEDIUM = "CPU"


@dataclass(frozen=True)
class OffloadingEvent:
    """Blocks that became readable (``removed=False``) or were dropped (``removed=True``).

    ``reset=True`` marks a ``reset_cache``: every block of ``medium`` was dropped at once and
    ``keys`` is empty.
    """

    keys: tuple[bytes, ...]
    medium: str = CPU_MEDIUM
    removed: bool = False
    reset: bool = False


@dataclass(frozen=True)
class BlockStored:
    """vLLM KV event: blocks now held by ``medium`` (hashes without the group suffix)."""

    block_hashes: list[bytes]
    group_idx: int
    medium: str
    parent_block_hash: bytes | None = None
    token_ids: list[int] | None = None
    block_size: int | None = None
    lora_id: int | None = None


@dataclass(frozen=True)
class BlockRemoved:
    """vLLM KV event: blocks no longer held by ``medium``."""

    block_hashes: list[bytes]
    group_idx: int
    medium: str


@dataclass(frozen=True)
class AllBlocksCleared:
    """vLLM KV event: ``medium`` dropped everything."""

    medium: str


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


def to_kv_cache_events(
    events: list[OffloadingEvent], block_size: int | None = None
) -> list[KVCacheEvent]:
    """Convert offloading events to vLLM-style records, one record per (event, group)."""
    out: list[KVCacheEvent] = []
    for event in events:
        if event.reset:
            out.append(AllBlocksCleared(event.medium))
            continue
        by_group: dict[int, list[bytes]] = {}
        for key in event.keys:
            by_group.setdefault(get_offload_group_idx(key), []).append(get_offload_block_hash(key))
        for group, hashes in by_group.items():
            if event.removed:
                out.append(BlockRemoved(hashes, group, event.medium))
            else:
                out.append(BlockStored(hashes, group, event.medium, block_size=block_size))
    return out


__all__ = [
    "CPU_MEDIUM",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
    "OffloadingEvent",
    "to_kv_cache_events",
]
