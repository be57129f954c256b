"""Every built-in's batched calls honour a subclass that hooks the single calls.

The built-ins batch ``insert_many`` and ``mark_evictable_many`` past their own ``insert`` /
``mark_evictable``; a subclass that overrides those must still see every key, in order, or its
hook (and the ``one_at_a_time`` references of the other policy tests) would be silently skipped.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies import BUILTIN_POLICIES
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.testing import int_key


def _recording(policy_cls: type[CachePolicy]) -> Any:
    class Recording(policy_cls):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.inserted: list[OffloadKey] = []
            self.marked: list[OffloadKey] = []

        def insert(
            self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
        ) -> None:
            self.inserted.append(key)
            super().insert(key, block, req_context)

        def mark_evictable(self, key: OffloadKey) -> None:
            self.marked.append(key)
            super().mark_evictable(key)

    return Recording


@pytest.mark.parametrize("name, module, class_name", [row[:3] for row in BUILTIN_POLICIES])
def test_batched_calls_go_through_hooked_single_calls(
    name: str, module: str, class_name: str
) -> None:
    policy = _recording(getattr(importlib.import_module(module), class_name))(16)
    keys = [int_key(i) for i in range(5)]
    statuses = [BlockStatus(i, -1) for i in range(5)]
    ctx = ReqContext(req_id="r")
    policy.insert_many(keys, statuses, ctx)
    assert policy.inserted == keys, name
    for status in statuses:
        status.ref_cnt = 0
    policy.mark_evictable_many(list(reversed(keys)))
    assert policy.marked == list(reversed(keys)), name
    victims = policy.evict(5, set())
    assert victims is not None and sorted(k for k, _ in victims) == sorted(keys), name
