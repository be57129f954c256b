"""kvoffload's policies inside vLLM's own CPU offloading manager (vLLM 0.33 and 0.34).

vLLM loads an out-of-tree policy by class name from a module given in the connector config::

    "kv_connector_extra_config": {"eviction_policy": "S3FIFOCachePolicy",
                                  "cache_policy_module_path": "kvoffload.integrations.vllm", ...}

This module has one such class per built-in kvoffload policy, named like the policy's class
(``LRUCachePolicy``, ``KVAwareCachePolicy``, ...) and also ``KVOffload<ClassName>``. vLLM's
factory looks its own registry up first, but by the *configured string*: only ``"lru"`` and
``"arc"`` are registered there, so ``"LRUCachePolicy"`` with this module path loads ours, while
``"lru"`` always means vLLM's own LRU whatever the module path. The ``KVOffload`` names can never
be mistaken for a vLLM class in logs or configs. :func:`vllm_policy_class` makes a class with
constructor parameters (vLLM passes only ``cache_capacity``) or for an out-of-tree kvoffload
policy.

How vLLM's calls reach our policy (same order as our own manager, so hit counts match it):

* ``get`` / ``insert`` / ``remove`` / ``evict`` / ``clear``: forwarded. vLLM's ``ChunkStatus``
  objects are our policy's statuses: it reads ``ref_cnt`` from the very objects vLLM's manager
  mutates, so nothing is mirrored (our policies never read ``block_id``; victims go back to
  vLLM as the ``ChunkStatus`` objects it inserted).
* ``on_request_access(keys)`` -> ``touch(keys)``: vLLM calls it once per request and key, for
  loaded keys and for offered keys that are absent or ready, which is exactly when our manager
  touches. ``on_store_miss`` is therefore ignored (its keys reach ``on_request_access`` next).
* ``on_request_finished(..., req_context)`` -> ``on_request_finished(ctx)``.
* ``touch`` -> ``touch``, on vLLM 0.33 only (only its ``manager.touch`` calls it); 0.34's
  ``CachePolicy`` has no ``touch``, so the class has none there either.
* ``mark_evictable``: vLLM's manager releases a completed batch head first; our policies expect
  tail first, so that the request's head ends most recent (``kvoffload.policies.base``). The
  adapter queues consecutive ``mark_evictable`` calls and hands them over reversed before the
  next other call (``get`` is pure and does not need them). So a run of releases ends at the
  next call other than ``get``, even one that changes nothing, such as a failed ``evict``.

Recording: :func:`record_trace` gives every adapter a
:class:`~kvoffload.manager.recorder.TraceRecorder`; each request's ``on_request_access`` keys
(loaded, and offered absent or ready: the keys our manager records) and its end are written as
a trace ``kvoffload simulate`` replays. vLLM's context has no arrival time or prompt length,
so the recorder's clock times the requests and every block counts as full.

vLLM's ``ReqContext`` becomes a kvoffload :class:`~kvoffload.context.ReqContext` per request and
policy, kept in vLLM's context: same ``req_id`` and ``kv_transfer_params``, the keys' token
positions copied as keys arrive, and optional hints from ``kv_transfer_params["kvoffload"]``
(``session_id``, ``category``, ``priority``, ``priority_duration_s``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from kvoffload.context import ReqContext
from kvoffload.integrations.vllm_api import (
    POLICY_HAS_TOUCH,
    TESTED_VLLM_VERSIONS,
    VLLM_VERSION,
    ChunkStatus,
    VllmCachePolicy,
    VllmReqContext,
)
from kvoffload.keys import OffloadKey
from kvoffload.manager.recorder import TraceRecorder
from kvoffload.policies import BUILTIN_POLICIES, CachePolicy, create_cache_policy

logger = logging.getLogger(__name__)

#: Request hints read from ``kv_transfer_params["kvoffload"]``, with the types they must have.
HINT_TYPES: Mapping[str, tuple[type, ...]] = {
    "session_id": (str,),
    "category": (str,),
    "priority": (int,),
    "priority_duration_s": (int, float),
}
HINTS_KEY = "kvoffload"
ALIAS_PREFIX = "KVOffload"


class _Contexts:
    """Our ReqContext for one vLLM request, one per adapter instance (policies keep state in it)."""

    __slots__ = ("by_policy",)

    def __init__(self) -> None:
        self.by_policy: dict[KVOffloadPolicy, ReqContext] = {}


def _hints(vllm_ctx: VllmReqContext) -> dict[str, Any]:
    params = vllm_ctx.kv_transfer_params
    raw = params.get(HINTS_KEY) if isinstance(params, Mapping) else None
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        logger.warning(
            "request %s: kv_transfer_params[%r] must be a mapping; ignored",
            vllm_ctx.req_id,
            HINTS_KEY,
        )
        return {}
    hints = {}
    for name, value in raw.items():
        types = HINT_TYPES.get(name)
        if types is None or isinstance(value, bool) or not isinstance(value, types):
            logger.warning(
                "request %s: kv_transfer_params[%r][%r] = %r ignored (known hints: %s)",
                vllm_ctx.req_id,
                HINTS_KEY,
                name,
                value,
                ", ".join(f"{k}: {'|'.join(t.__name__ for t in v)}" for k, v in HINT_TYPES.items()),
            )
            continue
        hints[name] = value
    return hints


def translate_context(vllm_ctx: VllmReqContext) -> ReqContext:
    """A fresh kvoffload context carrying what vLLM's context says about the request."""
    return ReqContext(
        req_id=vllm_ctx.req_id,
        kv_transfer_params=vllm_ctx.kv_transfer_params,
        **_hints(vllm_ctx),
    )


class KVOffloadPolicy(VllmCachePolicy):  # type: ignore[misc]
    """A kvoffload policy behind vLLM's ``CachePolicy`` API (base of the generated classes).

    Subclasses set ``kvoffload_policy`` (a kvoffload policy name or ``"module:Class"``) and
    optionally ``kvoffload_module_path`` and ``kvoffload_params``.
    """

    kvoffload_policy: ClassVar[str] = ""
    kvoffload_module_path: ClassVar[str | None] = None
    kvoffload_params: ClassVar[Mapping[str, Any]] = {}
    #: Set by :func:`record_trace` for every adapter (``None``: nothing recorded).
    recorder: ClassVar[TraceRecorder | None] = None

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        if not self.kvoffload_policy:
            raise TypeError(
                "KVOffloadPolicy is abstract: configure one of the classes in "
                "kvoffload.integrations.vllm, or make one with vllm_policy_class()"
            )
        #: The kvoffload policy doing the work (public for introspection and stats).
        self.policy: CachePolicy = create_cache_policy(
            self.kvoffload_policy,
            cache_capacity,
            self.kvoffload_module_path,
            dict(self.kvoffload_params),
        )
        self._released: list[OffloadKey] = []
        # vLLM's manager calls get on every lookup, load, store and completion: the policy's
        # own bound method saves a Python frame per call (get is pure, queued releases or not).
        self.get = self.policy.get  # type: ignore[method-assign]

    # --------------------------------------------------------------- helpers
    def _context(self, vllm_ctx: VllmReqContext | None, keys: Iterable[OffloadKey]) -> ReqContext:
        """This request's kvoffload context, with the positions of ``keys`` copied over."""
        if vllm_ctx is None:
            return ReqContext()
        contexts: _Contexts | None = vllm_ctx.get_state(_Contexts)
        if contexts is None:
            contexts = _Contexts()
            vllm_ctx.set_state(contexts)
        ctx = contexts.by_policy.get(self)
        if ctx is None:
            ctx = contexts.by_policy[self] = translate_context(vllm_ctx)
        position_of = vllm_ctx.get_offload_key_position
        for key in keys:
            position = position_of(key)
            if position is not None:
                ctx.set_offload_key_position(key, position)
        return ctx

    def _hand_over_released(self) -> None:
        """Apply queued ``mark_evictable`` calls, tail first (see the module docstring)."""
        if self._released:
            released, self._released = self._released, []
            released.reverse()
            self.policy.mark_evictable_many(released)

    # ------------------------------------------------------ vLLM's interface
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.policy.get(key)

    def insert(
        self, key: OffloadKey, chunk: ChunkStatus, req_context: VllmReqContext | None = None
    ) -> None:
        self._hand_over_released()
        self.policy.insert(key, chunk, self._context(req_context, (key,)))

    def remove(self, key: OffloadKey) -> None:
        self._hand_over_released()
        self.policy.remove(key)

    def _touch(
        self, keys: Iterable[OffloadKey], req_context: VllmReqContext | None
    ) -> tuple[list[OffloadKey], ReqContext]:
        self._hand_over_released()
        keys = list(keys)
        ctx = self._context(req_context, keys)
        self.policy.touch(keys, ctx)
        return keys, ctx

    if POLICY_HAS_TOUCH:  # vLLM 0.33's contract; 0.34 dropped touch from CachePolicy

        def touch(
            self, keys: Iterable[OffloadKey], req_context: VllmReqContext | None = None
        ) -> None:
            self._touch(keys, req_context)

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: VllmReqContext) -> None:
        """Ignored: the same keys reach ``on_request_access`` right after, once per request."""

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: VllmReqContext) -> None:
        touched, ctx = self._touch(keys, req_context)
        recorder = self.recorder
        if recorder is not None and req_context is not None:
            recorder.add_keys(ctx, touched)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: VllmReqContext,
    ) -> None:
        self._hand_over_released()
        ctx = self._context(req_context, ())
        self.policy.on_request_finished(ctx)
        recorder = self.recorder
        if recorder is not None and req_context is not None:
            recorder.finish(ctx)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        self._hand_over_released()
        return self.policy.evict(n, protected)

    def clear(self) -> None:
        self._released.clear()
        self.policy.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        self._released.append(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._hand_over_released()
        self.policy.mark_non_evictable(key)


def record_trace(recorder: TraceRecorder | None) -> None:
    """Record the requests every kvoffload policy inside vLLM sees (``None``: stop)."""
    if recorder is not None and not isinstance(recorder, TraceRecorder):
        raise TypeError(f"recorder must be a TraceRecorder, got {type(recorder).__name__}")
    KVOffloadPolicy.recorder = recorder


def vllm_policy_class(
    policy: str,
    class_name: str | None = None,
    module_path: str | None = None,
    module: str | None = None,
    **params: Any,
) -> type[KVOffloadPolicy]:
    """Make a class vLLM can load for kvoffload ``policy`` built with ``params``.

    ``policy`` is a kvoffload name (``"slru"``), a class name, or ``"module:Class"``;
    ``module_path`` is our factory's module fallback. Assign the result to a module attribute
    named ``class_name`` and configure vLLM with that name and module. The parameters are
    checked now (a ``ValueError`` here rather than in vLLM's scheduler).
    """
    create_cache_policy(policy, 1, module_path, dict(params))  # fail early on a bad name/param
    name = class_name or f"{ALIAS_PREFIX}{policy.rpartition(':')[2]}"
    doc = f"kvoffload policy {policy!r}{f' with {params}' if params else ''}, for vLLM."
    cls = type(
        name,
        (KVOffloadPolicy,),
        {
            "__doc__": doc,
            "__module__": module or __name__,
            "__qualname__": name,
            "kvoffload_policy": policy,
            "kvoffload_module_path": module_path,
            "kvoffload_params": dict(params),
        },
    )
    return cls


def _builtin_classes() -> dict[str, type[KVOffloadPolicy]]:
    """Policy name -> generated class, one per built-in (the first line of its doc is ours)."""
    classes = {}
    for name, _module, class_name, description in BUILTIN_POLICIES:
        cls = type(
            class_name,
            (KVOffloadPolicy,),
            {
                "__doc__": f"{description}\n\nkvoffload's '{name}' policy, for vLLM.",
                "__module__": __name__,
                "__qualname__": class_name,
                "kvoffload_policy": name,
            },
        )
        classes[name] = cls
    return classes


#: kvoffload policy name -> the class vLLM loads (also module attributes, see below).
POLICY_CLASSES: Mapping[str, type[KVOffloadPolicy]] = _builtin_classes()
for _cls in POLICY_CLASSES.values():
    globals()[_cls.__name__] = _cls
    globals()[ALIAS_PREFIX + _cls.__name__] = _cls
del _cls


def vllm_class_names() -> list[str]:
    """Every ``eviction_policy`` value this module serves (class names and their aliases)."""
    names = [cls.__name__ for cls in POLICY_CLASSES.values()]
    return names + [ALIAS_PREFIX + name for name in names]


__all__ = [
    "HINTS_KEY",
    "HINT_TYPES",
    "POLICY_CLASSES",
    "TESTED_VLLM_VERSIONS",
    "VLLM_VERSION",
    "KVOffloadPolicy",
    "record_trace",
    "translate_context",
    "vllm_class_names",
    "vllm_policy_class",
]
