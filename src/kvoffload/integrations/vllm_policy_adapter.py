"""A policy written against vLLM's ``CachePolicy`` API, run in kvoffload's manager and simulator.

``kvoffload simulate --policy mymodule:MyVLLMPolicy`` (or any factory lookup) finds a class that
subclasses vLLM's ``vllm.v1.kv_offload.cpu.policies.base.CachePolicy`` and wraps it with
:func:`adapt_vllm_policy` automatically; nothing to write. The wrapper makes the calls vLLM's
own CPU offloading manager (0.33 or 0.34, whichever is installed) makes, from the calls our
manager makes:

* statuses: the vLLM policy gets real ``ChunkStatus`` objects whose ``ref_cnt`` *is* our
  manager's ``BlockStatus.ref_cnt`` (a live view, so every pin count change is seen) and whose
  ``chunk_id`` is the slot. ``get`` and ``evict`` hand our ``BlockStatus`` objects back.
* ``touch(keys, ctx)`` (our manager: once per request and key, loaded keys and offered keys that
  are absent or ready) -> ``on_store_miss(absent keys)`` then ``on_request_access(keys)``, and
  the keys are recorded for the request as vLLM's manager records them: by KV group, loaded or
  re-offered ready keys as *reused*, keys inserted for the request as *inserted*.
* ``on_request_finished(ctx)`` -> ``on_request_finished(key_groups, inserted - reused, reused,
  ctx)``, once per request and cache generation, each group sorted by token position when
  every key has one.
* ``mark_evictable_many`` (ours releases a batch tail first) -> ``mark_evictable`` per key head
  first, vLLM's order.
* ``touch`` without a request context (our manager's ``touch(keys)``, vLLM 0.33's
  ``manager.touch``): on 0.33 the policy's own ``touch``; 0.34's policies have none, so there
  it is a request of its own, made as 0.34's manager makes one: ``on_store_miss`` for the absent
  keys, ``on_request_access``, then ``on_request_finished`` with the present ready keys reused.

Known protocol differences from vLLM's manager (see ``docs/vllm.md``): our manager touches a
store's keys only when the store fits (vLLM reports them before it knows), and pins a load's
keys after touching them (vLLM pins first).
"""

from __future__ import annotations

import ctypes
import inspect
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from kvoffload.context import ReqContext
from kvoffload.integrations.vllm_api import (
    POLICY_HAS_TOUCH,
    ChunkStatus,
    VllmCachePolicy,
    VllmReqContext,
    get_offload_group_idx,
)
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims, already_stored


class LiveChunkStatus(ChunkStatus):  # type: ignore[misc]
    """vLLM's status type reading and writing our manager's ``BlockStatus`` (no copy to sync)."""

    def __init__(self, block: BlockStatus) -> None:
        ctypes.Structure.__init__(self)  # not ChunkStatus.__init__: it would set ref_cnt to -1
        self.block = block
        self.chunk_id = block.block_id

    @property
    def ref_cnt(self) -> int:
        return self.block.ref_cnt

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        self.block.ref_cnt = value


class _RequestAccess:
    """What vLLM's manager records per request for ``on_request_finished``."""

    __slots__ = (
        "finished",
        "generation",
        "inserted",
        "key_groups",
        "owner",
        "reused",
        "seen",
        "vllm_ctx",
    )

    def __init__(self, owner: VllmPolicyAdapter, generation: int, vllm_ctx: VllmReqContext):
        self.owner = owner
        self.generation = generation
        self.vllm_ctx = vllm_ctx
        self.key_groups: dict[int, list[OffloadKey]] = {}
        self.seen: set[OffloadKey] = set()
        self.reused: set[OffloadKey] = set()
        self.inserted: set[OffloadKey] = set()
        self.finished = False


def to_vllm_context(ctx: ReqContext) -> VllmReqContext:
    """vLLM's context for one of our requests: id, transfer params (positions copied later)."""
    return VllmReqContext(req_id=ctx.req_id, kv_transfer_params=ctx.kv_transfer_params)


class VllmPolicyAdapter(CachePolicy):
    """Runs a vLLM ``CachePolicy`` subclass under kvoffload's contract (see the module doc)."""

    vllm_policy_cls: ClassVar[type[Any]]

    def __init__(self, cache_capacity: int, **params: Any) -> None:
        super().__init__(cache_capacity)
        #: The wrapped vLLM policy instance.
        self.vllm_policy = self.vllm_policy_cls(cache_capacity=cache_capacity, **params)
        self._generation = 0

    # --------------------------------------------------------------- helpers
    def _access(self, ctx: ReqContext) -> _RequestAccess:
        access = ctx.get_state(_RequestAccess)
        if access is None or access.owner is not self or access.generation != self._generation:
            vllm_ctx = access.vllm_ctx if access is not None else to_vllm_context(ctx)
            access = _RequestAccess(self, self._generation, vllm_ctx)
            ctx.set_state(access)
        return access

    @staticmethod
    def _copy_positions(
        ctx: ReqContext, vllm_ctx: VllmReqContext, keys: Iterable[OffloadKey]
    ) -> None:
        for key in keys:
            position = ctx.get_offload_key_position(key)
            if position is not None:
                vllm_ctx.set_offload_key_position(key, position)

    def _vllm_context(self, ctx: ReqContext | None, keys: Iterable[OffloadKey]) -> VllmReqContext:
        if ctx is None:  # a fresh one each time: nothing accumulates outside a request
            return VllmReqContext(req_id="")
        vllm_ctx = self._access(ctx).vllm_ctx
        self._copy_positions(ctx, vllm_ctx, keys)
        return vllm_ctx

    # ------------------------------------------------------ our contract
    def get(self, key: OffloadKey) -> BlockStatus | None:
        chunk = self.vllm_policy.get(key)
        return None if chunk is None else chunk.block

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        if self.vllm_policy.get(key) is not None:  # our contract (vLLM's policies overwrite)
            raise already_stored(key)
        vllm_ctx = self._vllm_context(req_context, (key,))
        self.vllm_policy.insert(key, LiveChunkStatus(block), vllm_ctx)
        if req_context is not None:
            self._access(req_context).inserted.add(key)

    def _require_absent(self, keys: Sequence[OffloadKey]) -> None:
        """The base's double-insert check, against the vLLM policy's own table."""
        seen: set[OffloadKey] = set()
        for key in keys:
            if key in seen or self.vllm_policy.get(key) is not None:
                raise already_stored(key)
            seen.add(key)

    def remove(self, key: OffloadKey) -> None:
        self.vllm_policy.remove(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        keys = list(keys)
        if req_context is None:
            if POLICY_HAS_TOUCH:
                self.vllm_policy.touch(keys, self._vllm_context(None, keys))
            else:
                one_off = ReqContext()
                self.touch(keys, one_off)
                self.on_request_finished(one_off)
            return
        access = self._access(req_context)
        vllm_ctx = self._vllm_context(req_context, keys)
        fresh = [key for key in keys if key not in access.seen]
        if not fresh:
            return
        get = self.vllm_policy.get
        chunks = [get(key) for key in fresh]
        misses = [key for key, chunk in zip(fresh, chunks, strict=True) if chunk is None]
        if misses:
            self.vllm_policy.on_store_miss(misses, vllm_ctx)
        for key, chunk in zip(fresh, chunks, strict=True):
            access.key_groups.setdefault(get_offload_group_idx(key), []).append(key)
            if chunk is not None and chunk.ref_cnt >= 0 and key not in access.inserted:
                access.reused.add(key)
        access.seen.update(fresh)
        self.vllm_policy.on_request_access(fresh, vllm_ctx)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        protected_set = protected if isinstance(protected, set) else set(protected)
        victims = self.vllm_policy.evict(n, protected_set)
        if victims is None:
            return None
        return [(key, chunk.block) for key, chunk in victims]

    def clear(self) -> None:
        self.vllm_policy.clear()
        self._generation += 1  # requests' records from before are stale now

    def mark_evictable(self, key: OffloadKey) -> None:
        self.vllm_policy.mark_evictable(key)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        for key in reversed(keys):  # ours releases tail first, vLLM's manager head first
            self.vllm_policy.mark_evictable(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self.vllm_policy.mark_non_evictable(key)

    def on_request_finished(self, req_context: ReqContext) -> None:
        access = req_context.get_state(_RequestAccess)
        if (
            access is None
            or access.owner is not self
            or access.generation != self._generation
            or access.finished
        ):
            return
        access.finished = True
        vllm_ctx = access.vllm_ctx
        key_groups = []
        for group in sorted(access.key_groups):
            keys = access.key_groups[group]
            positions = [vllm_ctx.get_offload_key_position(key) for key in keys]
            if None not in positions:
                keys = [key for _, key in sorted(zip(positions, keys, strict=True))]
            key_groups.append(tuple(keys))
        self.vllm_policy.on_request_finished(
            tuple(key_groups), access.inserted - access.reused, set(access.reused), vllm_ctx
        )

    def stats(self) -> Mapping[str, float]:
        return {}


_ADAPTERS: dict[type[Any], type[VllmPolicyAdapter]] = {}


def adapt_vllm_policy(vllm_policy_cls: type[Any]) -> type[VllmPolicyAdapter]:
    """Our ``CachePolicy`` class running ``vllm_policy_cls`` (one class per vLLM class)."""
    adapter = _ADAPTERS.get(vllm_policy_cls)
    if adapter is not None:
        return adapter
    if not (inspect.isclass(vllm_policy_cls) and issubclass(vllm_policy_cls, VllmCachePolicy)):
        raise TypeError(
            f"{vllm_policy_cls!r} is not a subclass of vLLM's "
            "vllm.v1.kv_offload.cpu.policies.base.CachePolicy"
        )
    if inspect.isabstract(vllm_policy_cls):
        missing = ", ".join(sorted(getattr(vllm_policy_cls, "__abstractmethods__", ())))
        raise TypeError(
            f"vLLM policy {vllm_policy_cls.__qualname__} is abstract (missing: {missing})"
        )
    inner = inspect.signature(vllm_policy_cls)
    doc = vllm_policy_cls.__doc__ or f"vLLM policy {vllm_policy_cls.__qualname__}."
    adapter = type(
        f"VllmPolicyAdapter[{vllm_policy_cls.__qualname__}]",
        (VllmPolicyAdapter,),
        {
            "__doc__": doc,
            "__module__": __name__,
            "vllm_policy_cls": vllm_policy_cls,
            "__signature__": inner,
        },
    )
    _ADAPTERS[vllm_policy_cls] = adapter
    return adapter


__all__ = [
    "LiveChunkStatus",
    "VllmPolicyAdapter",
    "adapt_vllm_policy",
    "to_vllm_context",
]
