"""Offloading specs: one validated config in, a matching manager and transfer worker out.

:class:`OffloadingConfig` is a typed view of vLLM's ``kv_connector_extra_config`` (same key
names); unknown keys are rejected with a did-you-mean instead of being silently ignored.
:class:`OffloadingSpec` turns a config plus the engine's :class:`KVCacheLayout` into a
scheduler-side manager (``get_manager``, slots computed from the byte budget) and a
worker-side :class:`~kvoffload.transfer.worker.TransferWorker` (``get_worker``).
:class:`OffloadingSpecFactory` resolves a spec by name like the policy registry does: a
registered name, ``"package.module:ClassName"``, or ``spec_name`` + ``spec_module_path`` for
an out-of-tree spec (no fork needed).

Importing this module does not import torch: only ``get_worker`` does.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import logging
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from kvoffload._checks import check_bool, check_int, redact
from kvoffload._sizes import format_size, parse_size
from kvoffload.admission import check_store_threshold
from kvoffload.keys import namespace_fingerprint
from kvoffload.layout import KVCacheLayout, slots_for_budget
from kvoffload.manager import CPUOffloadingManager, OffloadingManager
from kvoffload.registry import Registry
from kvoffload.tiers.config import TierConfig, build_tiers, parse_tiers

if TYPE_CHECKING:
    from kvoffload.transfer.host import HostBuffer
    from kvoffload.transfer.worker import TransferWorker

logger = logging.getLogger(__name__)

DEFAULT_SPEC = "CPUOffloadingSpec"

#: Keys vLLM users may carry over that this library does not take, with what to do instead.
_REPLACED_KEYS = {
    "num_cpu_blocks": "it was replaced by cpu_bytes_to_use (bytes for the whole server)",
    "cache_policy": "the policy name key is eviction_policy",
}
#: vLLM's names for keys this config takes under another name.
_ALIASES = {"secondary_tiers": "tiers"}


def _check_int(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    check_int(name, value, minimum, or_none=optional)  # the constructors' check and message


def _check_bool(name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    check_bool(name, value)


def _check_str(name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    accepts = f"a non-empty string{' or None' if optional else ''}"
    if not isinstance(value, str):
        raise TypeError(f"{name} must be {accepts}, got {type(value).__name__} {value!r}")
    if not value:
        raise ValueError(f"{name} must be {accepts}, got ''")


@dataclass(frozen=True, repr=False)
class OffloadingConfig:
    """Validated offloading settings; field names are vLLM's extra-config keys.

    Attributes:
        cpu_bytes_to_use: host memory for the CPU tier across all workers (required): bytes
            or a size (``"8GiB"``); a float (vLLM computes GiB * 2**30) is floored.
        block_size: tokens per offloaded chunk (a multiple of the device block size).
        blocks_per_chunk: device blocks per offloaded chunk (alternative to block_size).
        eviction_policy: cache policy name, registered or ``"module:Class"``.
        cache_policy_module_path: module of an unregistered policy class.
        cache_policy_params: keyword parameters of the policy's constructor.
        store_threshold: store a block on its N-th offer (0/1: always).
        max_tracker_size: capacity of the offer tracker used when store_threshold >= 2.
        spec_name / spec_module_path: which OffloadingSpec to build.
        enable_kv_cache_events: record stored/removed events for ``take_events``.
        partial_store: store the longest fitting prefix instead of nothing.
        skip_partial_tail: never store a request's last, partial block.
        offload_prompt_only / max_recompute_pending_tokens: for engine integrations (vLLM's
            meaning); the spec itself does not act on them.
        world_size: workers sharing the budget (each holds its shard of every slot).
        staging_bytes: device staging memory per direction of a CUDA worker (bytes or a size).
        pin_memory: page-lock the host buffer (None: when CUDA is available).
        tiers: secondary tiers behind the CPU tier, nearest first (vLLM's key
            ``secondary_tiers`` is accepted too): each a mapping with a ``type`` and that
            tier's keys (:mod:`kvoffload.tiers.config`); checked into
            :class:`~kvoffload.tiers.config.TierConfig` entries. With tiers the manager is a
            :class:`~kvoffload.tiers.manager.TieringManager` (``world_size`` must be 1).
    """

    cpu_bytes_to_use: int
    block_size: int | None = None
    blocks_per_chunk: int | None = None
    eviction_policy: str = "lru"
    cache_policy_module_path: str | None = None
    cache_policy_params: Mapping[str, Any] = field(default_factory=dict)
    store_threshold: int = 0
    max_tracker_size: int = 64000
    spec_name: str = DEFAULT_SPEC
    spec_module_path: str | None = None
    enable_kv_cache_events: bool = False
    partial_store: bool = False
    skip_partial_tail: bool = False
    offload_prompt_only: bool = True
    max_recompute_pending_tokens: int = 0
    world_size: int = 1
    staging_bytes: int = 128 << 20
    pin_memory: bool | None = None
    tiers: Sequence[TierConfig] = ()

    def __post_init__(self) -> None:
        budget = self.cpu_bytes_to_use
        if isinstance(budget, float) and math.isfinite(budget) and budget >= 1:
            budget = int(budget)  # vLLM computes GiB * 2**30: floored to whole bytes
        # Every *_bytes key takes a size ("8GiB"), as the tiers' keys do.
        object.__setattr__(self, "cpu_bytes_to_use", parse_size("cpu_bytes_to_use", budget, 1))
        _check_int("block_size", self.block_size, 1, optional=True)
        _check_int("blocks_per_chunk", self.blocks_per_chunk, 1, optional=True)
        if self.block_size is not None and self.blocks_per_chunk is not None:
            raise ValueError(
                "config: specify only one of block_size (tokens per chunk) and blocks_per_chunk"
            )
        _check_str("eviction_policy", self.eviction_policy)
        _check_str("cache_policy_module_path", self.cache_policy_module_path, optional=True)
        if not isinstance(self.cache_policy_params, Mapping):
            raise TypeError(
                "config 'cache_policy_params' must be a mapping of policy parameters, got "
                f"{type(self.cache_policy_params).__name__}"
            )
        object.__setattr__(self, "cache_policy_params", dict(self.cache_policy_params))
        check_store_threshold(self.store_threshold)
        _check_int("max_tracker_size", self.max_tracker_size, 1)
        _check_str("spec_name", self.spec_name)
        _check_str("spec_module_path", self.spec_module_path, optional=True)
        for name in ("enable_kv_cache_events", "partial_store", "skip_partial_tail"):
            _check_bool(name, getattr(self, name))
        _check_bool("offload_prompt_only", self.offload_prompt_only)
        _check_int("max_recompute_pending_tokens", self.max_recompute_pending_tokens, 0)
        _check_int("world_size", self.world_size, 1)
        object.__setattr__(
            self, "staging_bytes", parse_size("staging_bytes", self.staging_bytes, 1)
        )
        _check_bool("pin_memory", self.pin_memory, optional=True)
        object.__setattr__(self, "tiers", parse_tiers(self.tiers))
        if self.tiers and self.world_size != 1:
            raise ValueError(
                "config 'tiers' needs world_size 1: the tiering manager and the transfer "
                f"worker share one host buffer, got world_size {self.world_size}"
            )

    def __repr__(self) -> str:
        """Every field, with passwords, secrets and URL credentials as ``***``: configs get
        logged."""
        shown = ", ".join(
            f"{f.name}={redact(f.name, getattr(self, f.name))!r}" for f in fields(self)
        )
        return f"{type(self).__name__}({shown})"

    @classmethod
    def keys(cls) -> list[str]:
        """Every accepted key."""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_extra_config(
        cls, extra_config: Mapping[str, Any], **overrides: Any
    ) -> OffloadingConfig:
        """Build from a ``kv_connector_extra_config``-style dict (``overrides`` win)."""
        if not isinstance(extra_config, Mapping):
            raise TypeError(f"extra_config must be a mapping, got {type(extra_config).__name__}")
        merged = {**extra_config, **overrides}
        for alias, key in _ALIASES.items():
            if alias in merged:
                if key in merged:
                    raise ValueError(f"config: give either '{key}' or '{alias}', not both")
                merged[key] = merged.pop(alias)
        known = cls.keys()
        for key in merged:
            if key in known:
                continue
            if not isinstance(key, str):
                raise TypeError(f"config keys must be strings, got {key!r}")
            if key in _REPLACED_KEYS:
                raise ValueError(f"config key '{key}' is not accepted: {_REPLACED_KEYS[key]}")
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"unknown config key '{key}'.{hint} Accepted keys: {', '.join(known)}")
        if "cpu_bytes_to_use" not in merged:
            raise ValueError(
                "config 'cpu_bytes_to_use' is required: the host bytes the CPU tier may use"
            )
        return cls(**merged)


def host_memory_bytes() -> int | None:
    """The memory this process may use: physical memory, capped by a cgroup v2 limit
    (a container's); ``None`` when neither can be read."""
    total: int | None = None
    with contextlib.suppress(AttributeError, ValueError, OSError):  # no POSIX sysconf
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
    except OSError:
        limit = ""
    if limit.isdigit():
        total = int(limit) if total is None else min(total, int(limit))
    return total


class HostMemoryError(ValueError):
    """The CPU tier's host memory cannot be had (more than the machine has, or refused):
    one line naming ``cpu_bytes_to_use`` instead of the allocator's message."""

    def __init__(self, host_bytes: int, detail: str) -> None:
        self.host_bytes = host_bytes
        super().__init__(
            f"config 'cpu_bytes_to_use' asks for {host_bytes} bytes ({format_size(host_bytes)}) "
            f"of host memory for the CPU tier, {detail}; it accepts bytes or a size like "
            "'8GiB' that this machine can hold"
        )


class OffloadingSpec(ABC):
    """A backend: builds the manager (scheduler side) and the worker (each device process).

    Subclasses take ``(config, layout)`` and implement :meth:`get_manager` and
    :meth:`get_worker`; register them with :meth:`OffloadingSpecFactory.register_spec` or
    name them with ``spec_name`` + ``spec_module_path``.
    """

    def __init__(self, config: OffloadingConfig, layout: KVCacheLayout) -> None:
        if not isinstance(config, OffloadingConfig):
            raise TypeError(f"config must be an OffloadingConfig, got {type(config).__name__}")
        if not isinstance(layout, KVCacheLayout):
            raise TypeError(f"layout must be a KVCacheLayout, got {type(layout).__name__}")
        self.config = config
        self.layout = layout
        if config.block_size is not None:
            self.blocks_per_chunk = layout.blocks_per_chunk_for_tokens(config.block_size)
        else:
            self.blocks_per_chunk = config.blocks_per_chunk or 1
        self.slot_layout = layout.slot_layout(self.blocks_per_chunk)

    def tokens_per_chunk(self, group: int = 0) -> int:
        """Tokens covered by one offloaded chunk of ``group``."""
        return self.layout.block_size(group) * self.blocks_per_chunk

    @abstractmethod
    def get_manager(self) -> OffloadingManager:
        """The scheduler-side manager (one per engine)."""

    @abstractmethod
    def get_worker(self, kv_caches: Sequence[Any] | Mapping[str, Any]) -> TransferWorker:
        """A transfer worker over this process's KV tensors (one per device process)."""


class CPUOffloadingSpec(OffloadingSpec):
    """The CPU tier: ``cpu_bytes_to_use // (slot bytes * world_size)`` slots in host memory."""

    def __init__(self, config: OffloadingConfig, layout: KVCacheLayout) -> None:
        super().__init__(config, layout)
        try:
            self.num_slots = slots_for_budget(
                self.slot_layout.slot_bytes * config.world_size, config.cpu_bytes_to_use
            )
        except ValueError as exc:
            raise ValueError(f"config 'cpu_bytes_to_use' is too small: {exc}") from None
        self._manager: OffloadingManager | None = None
        self._host: HostBuffer | None = None

    @property
    def tier_namespace(self) -> bytes:
        """What keeps this engine's blocks apart in a disk or shared tier: the slot's byte map
        and dtypes (never the number of device blocks, which differs between engines)."""
        layout = self.layout
        return namespace_fingerprint(
            slot_bytes=self.slot_layout.slot_bytes,
            blocks_per_chunk=self.blocks_per_chunk,
            regions=repr(self.slot_layout.regions),
            tensors=repr([(t.kind, t.dtype, t.group, t.page_bytes) for t in layout.tensors]),
        )

    def host_buffer(self) -> HostBuffer:
        """The host slots shared by the tiering manager and this process's worker (tiers only;
        imports torch)."""
        if self._host is None:
            self._host = self._allocate_host()
        return self._host

    def _allocate_host(self) -> HostBuffer:
        """The host slots, or :class:`HostMemoryError` instead of the allocator's message."""
        from kvoffload.transfer.host import HostBuffer

        nbytes = self.host_bytes
        memory = host_memory_bytes()
        if memory is not None and nbytes > memory:
            raise HostMemoryError(
                nbytes, f"more than this machine's {memory} bytes ({format_size(memory)})"
            )
        try:
            return HostBuffer(self.slot_layout.slot_bytes, self.num_slots, self.config.pin_memory)
        except MemoryError:
            raise HostMemoryError(nbytes, "which the allocator refused") from None
        except RuntimeError as exc:
            if "alloc" not in str(exc).lower():  # not about memory: not ours to reword
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise HostMemoryError(nbytes, f"which the allocator refused ({first})") from None

    def _tier_params(self, config: TierConfig) -> TierConfig:
        """``config`` with its namespace bound to this layout (a user namespace is mixed in)."""
        params = dict(config.params)
        user = params.get("namespace")
        if isinstance(user, str):
            user = user.encode()
        params["namespace"] = (
            namespace_fingerprint(layout=self.tier_namespace, user=user)
            if user
            else self.tier_namespace
        )
        accepted = inspect.signature(config.cls.__init__).parameters
        if "namespace" not in accepted:
            params.pop("namespace")
        return TierConfig(config.type, config.cls, params, config.manager, config.index)

    @property
    def host_bytes(self) -> int:
        """Host bytes one worker allocates (``num_slots * slot_bytes``, no rounding)."""
        return self.num_slots * self.slot_layout.slot_bytes

    def get_manager(self) -> OffloadingManager:
        """The CPU manager, or with ``tiers`` a ``TieringManager`` over it and the host buffer."""
        if self._manager is None:
            c = self.config
            cpu = CPUOffloadingManager(
                self.num_slots,
                cache_policy=c.eviction_policy,
                cache_policy_module_path=c.cache_policy_module_path,
                cache_policy_params=c.cache_policy_params,
                enable_events=c.enable_kv_cache_events,
                store_threshold=c.store_threshold,
                max_tracker_size=c.max_tracker_size,
                skip_partial_tail=c.skip_partial_tail,
                partial_store=c.partial_store,
            )
            if not c.tiers:
                self._manager = cpu
            else:
                from kvoffload.tiers.manager import TieringManager

                host = self.host_buffer()
                secondaries = build_tiers([self._tier_params(t) for t in c.tiers], host)
                self._manager = TieringManager(cpu, host, secondaries)
        return self._manager

    def get_worker(self, kv_caches: Sequence[Any] | Mapping[str, Any]) -> TransferWorker:
        from kvoffload.transfer.factory import create_transfer_worker

        host = self.host_buffer() if self.config.tiers else self._allocate_host()
        return create_transfer_worker(
            self.layout,
            self.slot_layout,
            host,
            kv_caches,
            staging_bytes=self.config.staging_bytes,
        )


# ------------------------------------------------------------------------------ the registry

#: The one registry behind :class:`OffloadingSpecFactory` (names -> lazily loaded classes).
SPEC_REGISTRY: Registry[type[OffloadingSpec]] = Registry.of_subclasses(
    "offloading spec", OffloadingSpec, module_path_key="spec_module_path", logger=logger
)


class OffloadingSpecFactory:
    """Registry of offloading specs: names -> lazily imported classes (process-wide)."""

    registry = SPEC_REGISTRY

    @classmethod
    def register_spec(cls, name: str, module_path: str, class_name: str) -> None:
        """Register ``name`` -> ``module_path.class_name``; nothing is imported now."""
        parts = (("name", name), ("module_path", module_path), ("class_name", class_name))
        for what, value in parts:
            if not isinstance(value, str) or not value:
                raise ValueError(
                    f"Offloading spec {what} must be a non-empty string, got {value!r}"
                )
        cls.registry.register(name, f"{module_path}:{class_name}")

    @classmethod
    def unregister_spec(cls, name: str) -> None:
        """Remove ``name`` (for tests and plugin reloads)."""
        cls.registry.unregister(name)

    @classmethod
    def registered_names(cls) -> list[str]:
        """Registered names, in registration order."""
        return cls.registry.names()

    @classmethod
    def get_spec_cls(
        cls, spec_name: str = DEFAULT_SPEC, spec_module_path: str | None = None
    ) -> type[OffloadingSpec]:
        """Resolve: ``spec_module_path``, then a registered name, then ``"module:Class"``."""
        return cls.registry.resolve(spec_name, spec_module_path)

    @classmethod
    def create_spec(cls, config: OffloadingConfig, layout: KVCacheLayout) -> OffloadingSpec:
        """Build the spec ``config`` names."""
        spec_cls = cls.get_spec_cls(config.spec_name, config.spec_module_path)
        logger.debug("Creating offloading spec %s", spec_cls.__qualname__)
        return spec_cls(config, layout)

    @classmethod
    @contextmanager
    def registry_snapshot(cls) -> Iterator[None]:
        """Restore the registry to its current content on exit (for tests)."""
        with cls.registry.snapshot():
            yield


OffloadingSpecFactory.register_spec(DEFAULT_SPEC, __name__, "CPUOffloadingSpec")
# vLLM's name for a CPU tier with secondary tiers: the same spec here (tiers are a config key).
OffloadingSpecFactory.register_spec("TieringOffloadingSpec", __name__, "CPUOffloadingSpec")


__all__ = [
    "DEFAULT_SPEC",
    "SPEC_REGISTRY",
    "CPUOffloadingSpec",
    "HostMemoryError",
    "OffloadingConfig",
    "OffloadingSpec",
    "OffloadingSpecFactory",
]
