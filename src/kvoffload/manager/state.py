"""A manager's warm-restart state: its policy's whole state, from which the slots follow.

The policy state (:func:`~kvoffload.policies.state.export_policy_state`: order, frequencies,
ghosts, and the block table with each block's slot) is all a restarted manager needs: the
stored keys and their slots are the table's. What is deliberately not in it: jobs in flight
(they did not survive the restart: pending writes are dropped, pins released, see
:func:`~kvoffload.policies.state.settle_restored`), counters (a new process counts anew),
admission filters' offer counts and shadow evaluators (they start cold), and slots held for
jobs from before a reset (free again).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvoffload.policies import BlockStatus, CachePolicy
from kvoffload.policies.state import export_policy_state, restore_policy_state, settle_restored

FORMAT = "kvoffload.manager-state"
VERSION = 1


def encode_manager_state(num_blocks: int, policy: CachePolicy) -> bytes:
    """The state of a manager of ``num_blocks`` slots whose policy is ``policy``."""
    if policy.block_table is None:
        raise ValueError(
            f"{type(policy).__name__} keeps no block_table: its stored keys cannot be saved"
        )
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "num_blocks": num_blocks,
        "policy_state": json.loads(export_policy_state(policy)),
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_manager_state(data: bytes | str) -> tuple[int, CachePolicy, list[BlockStatus]]:
    """``(num_blocks, policy, statuses by slot)`` from :func:`encode_manager_state`'s bytes.

    The policy is settled (no pending or pinned block). ``statuses`` has one status per slot:
    the stored block's (``ref_cnt == 0``) or a free one's. ``ValueError`` for anything else.
    """
    if not isinstance(data, (bytes, str)):
        raise TypeError(f"data must be bytes or str, got {type(data).__name__}")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"manager state is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a manager state (format must be {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise ValueError(
            f"manager state version {doc.get('version')!r} is not supported (this is {VERSION})"
        )
    num_blocks = doc.get("num_blocks")
    if type(num_blocks) is not int or num_blocks < 0:
        raise ValueError(f"manager state: num_blocks must be an int >= 0, got {num_blocks!r}")
    policy = restore_policy_state(json.dumps(doc.get("policy_state")))
    if policy.cache_capacity != num_blocks:
        raise ValueError(
            f"manager state: the policy holds {policy.cache_capacity} blocks, the manager "
            f"{num_blocks}"
        )
    settle_restored(policy)
    table: Mapping[Any, BlockStatus] | None = policy.block_table
    if table is None:  # pragma: no cover - encode refuses such policies
        raise ValueError("manager state: the restored policy keeps no block_table")
    by_slot: dict[int, BlockStatus] = {}
    for status in table.values():
        slot = status.block_id
        if type(slot) is not int or not 0 <= slot < num_blocks or slot in by_slot:
            raise ValueError(f"manager state: bad or repeated slot {slot!r}")
        by_slot[slot] = status
    statuses = [by_slot.get(slot) or BlockStatus(slot, 0) for slot in range(num_blocks)]
    return num_blocks, policy, statuses


__all__ = ["FORMAT", "VERSION", "decode_manager_state", "encode_manager_state"]
