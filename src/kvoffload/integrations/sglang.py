"""kvoffload's tiers as an SGLang HiCache storage backend (L3), loaded by SGLang's own factory.

SGLang 0.5.23 loads a third-party backend with ``--hicache-storage-backend dynamic`` and three
keys of ``--hicache-storage-backend-extra-config``; the rest of that config is ours::

    {"backend_name": "kvoffload", "module_path": "kvoffload.integrations.sglang",
     "class_name": "KVOffloadStorage", "interface_v1": 1,
     "tier": {"type": "disk", "path": "/nvme/kv", "capacity_bytes": 549755813888}}

``tier`` is one entry of kvoffload's tiers config (``docs/tiers.md``): ``disk``, ``redis`` or
any registered or ``module:Class`` tier, with that tier's own keys. ``interface_v1: 1`` makes
SGLang call the zero-copy ``batch_get_v1`` / ``batch_set_v1``; without it SGLang copies each
page through ``batch_get`` / ``batch_set``. Both store the same records.

How SGLang's pages become our records:

* A page's bytes are cut where the host pool's own ``get_page_buffer_meta`` cuts them: K and V
  for an MHA pool in a page-contiguous layout (``page_first``, ``page_first_direct``,
  ``page_head``), one piece for MLA. Each piece is one record, keyed
  ``make_offload_key(page hash, piece)``, and one slot of our tier's memory *is* that piece in
  SGLang's host buffer: ``batch_*_v1`` copy between the medium and SGLang's pool with no
  intermediate buffer. ``layer_first`` pages are not contiguous: one record per page, through
  a staging buffer, and only the copying calls (``interface_v1`` is refused with the reason).
* A page is a hit only when all its pieces are; a failed, missing or corrupt piece (our tiers
  verify every record on read) makes the page a miss, never data.
* The namespace (in every record's header) is a fingerprint of the model, dtype, page size,
  layout, piece size and shard: TP size and rank and PP size and rank for an MHA pool, as
  SGLang's own ``file`` backend keys them; none for an MLA pool, whose KV every TP rank holds
  whole, so deployments of any TP size share its pages (SGLang lets only the storage-writer
  rank write them). ``namespace`` in ``tier`` overrides it.

SGLang calls a backend from its prefetch and backup threads at once and expects answers;
our tiers are asynchronous, so each call submits a job under one lock and waits for exactly
that job (never abandoned: a copy into SGLang's pool must be over before the call returns).
``get_stats`` returns SGLang's ``StorageMetrics`` (pages per batch, GB/s) when SGLang's storage
metrics are on; :meth:`KVOffloadStorage.tier_stats` has our tier's own counters.

Importing this module needs SGLang (and its import chain); our tiers do not.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from kvoffload.keys import OffloadKey, make_offload_key, namespace_fingerprint
from kvoffload.tiers.base import Presence, Tier, TierResult
from kvoffload.tiers.config import parse_tier

logger = logging.getLogger(__name__)

#: Keys of the extra config that SGLang itself reads (its factory, its controller).
SGLANG_KEYS = frozenset({"backend_name", "module_path", "class_name", "interface_v1"})
#: Our keys in the extra config.
OUR_KEYS = ("tier", "staging_pages")
#: Layouts whose pages are contiguous pieces of the host buffer (zero-copy records).
ZERO_COPY_LAYOUTS = ("page_first", "page_first_direct", "page_head")


def page_key_bytes(key: str) -> bytes:
    """SGLang's page key as our block hash: the hex digest's bytes, else the UTF-8 text."""
    if len(key) % 2 == 0:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return key.encode()


class _SplitSlots:
    """Our tier's ``SlotMemory``: SGLang's host buffer in ``piece``-byte slots, then staging.

    Slots ``[0, host_slots)`` are views of the host pool's buffer (zero-copy records); the
    ``staging`` slots after them are a buffer of our own for the copying calls.
    """

    def __init__(self, host: memoryview | None, piece: int, staging: int) -> None:
        self._host = host
        self._piece = piece
        self.host_slots = len(host) // piece if host is not None else 0
        self._staging = bytearray(piece * staging)
        self._staging_view = memoryview(self._staging)
        self._count = self.host_slots + staging

    @property
    def slot_bytes(self) -> int:
        return self._piece

    @property
    def num_slots(self) -> int:
        return self._count

    def slot_view(self, slot: int) -> memoryview:
        if not 0 <= slot < self._count:
            raise ValueError(f"slot must be in [0, {self._count}), got {slot}")
        if slot < self.host_slots:
            assert self._host is not None
            start = slot * self._piece
            return self._host[start : start + self._piece]
        start = (slot - self.host_slots) * self._piece
        return self._staging_view[start : start + self._piece]


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A CPU tensor's bytes, shared (no copy): the tensor must be contiguous."""
    flat = tensor.reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


class _PageGeometry:
    """Where a host pool's pages lie, and how they are cut into records."""

    def __init__(self, pool: Any) -> None:
        self.page_size = int(pool.page_size)
        self.layout = str(getattr(pool, "layout", "unknown"))
        self.dtype = str(pool.dtype).removeprefix("torch.")
        self.page_bytes = int(pool.get_dummy_flat_data_page().numel()) * pool.dtype.itemsize
        buffer = getattr(pool, "kv_buffer", None)
        self.zero_copy_reason = ""
        self.pieces = 1
        self.base = 0
        self.host: memoryview | None = None
        if self.layout not in ZERO_COPY_LAYOUTS:
            self.zero_copy_reason = (
                f"the {self.layout!r} layout's pages are not contiguous in the host buffer "
                f"(zero-copy layouts: {', '.join(ZERO_COPY_LAYOUTS)})"
            )
        elif not isinstance(buffer, torch.Tensor) or buffer.device.type != "cpu":
            self.zero_copy_reason = "the host pool has no CPU kv_buffer tensor"
        elif not buffer.is_contiguous():
            self.zero_copy_reason = "the host pool's kv_buffer is not contiguous"
        else:
            ptrs, sizes = pool.get_page_buffer_meta(torch.arange(self.page_size))
            piece = int(sizes[0])
            base = buffer.data_ptr()
            aligned = all(int(s) == piece for s in sizes) and all(
                (int(p) - base) % piece == 0 for p in ptrs
            )
            if not aligned or piece * len(ptrs) != self.page_bytes:
                self.zero_copy_reason = "the host pool's page pieces are not aligned"
            else:
                self.pieces = len(ptrs)
                self.base = base
                self.host = _bytes_of(buffer)
        self.piece_bytes = self.page_bytes // self.pieces

    @property
    def zero_copy(self) -> bool:
        return self.host is not None

    def slots_of_page(self, pool: Any, host_index: int) -> list[int]:
        """The host slots of the page starting at token ``host_index`` (zero-copy only)."""
        ptrs, _sizes = pool.get_page_buffer_meta(
            torch.arange(host_index, host_index + self.page_size)
        )
        return [(int(p) - self.base) // self.piece_bytes for p in ptrs]


@dataclass
class PageIOMetrics:
    """The fields of SGLang's ``StorageMetrics``: pages per batch and GB/s, per direction."""

    prefetch_pgs: list[int] = field(default_factory=list)
    backup_pgs: list[int] = field(default_factory=list)
    prefetch_bandwidth: list[float] = field(default_factory=list)
    backup_bandwidth: list[float] = field(default_factory=list)


class KVOffloadStorage(HiCacheStorage):  # type: ignore[misc]
    """One kvoffload tier behind SGLang's ``HiCacheStorage`` (see the module docstring).

    Built by SGLang's ``StorageBackendFactory`` as ``KVOffloadStorage(storage_config, kwargs)``;
    the tier itself is built when SGLang registers its host pool (its memory is the pool's).
    """

    #: How long a call waits between two polls of our tier at most (it starts shorter).
    max_poll_interval_s = 0.005

    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: Mapping[str, Any] | None = None
    ) -> None:
        extra = dict(storage_config.extra_config or {})
        unknown = [k for k in extra if k not in SGLANG_KEYS and k not in OUR_KEYS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], OUR_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"KVOffloadStorage: unknown extra-config key {unknown[0]!r}{hint} (ours: "
                f"{', '.join(OUR_KEYS)}; SGLang's: {', '.join(sorted(SGLANG_KEYS))})"
            )
        if "tier" not in extra:
            raise ValueError(
                "KVOffloadStorage: the extra config needs 'tier', one kvoffload tier entry, "
                'e.g. {"type": "disk", "path": "/nvme/kv", "capacity_bytes": 1099511627776}'
            )
        self.tier_config = parse_tier(extra["tier"])
        extras = {k: v for k, v in self.tier_config.manager.items() if k != "label" or v}
        if extras:
            raise ValueError(
                f"KVOffloadStorage: tier keys {sorted(extras)} belong to kvoffload's "
                "TieringManager and mean nothing behind SGLang"
            )
        staging = extra.get("staging_pages", 16)
        if isinstance(staging, bool) or not isinstance(staging, int) or staging < 1:
            raise ValueError(
                f"KVOffloadStorage: staging_pages must be an int >= 1, got {staging!r}"
            )
        self.staging_pages = staging
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        self.storage_config = storage_config
        self.tier: Tier | None = None
        self.geometry: _PageGeometry | None = None
        self._lock = threading.Lock()
        self._done: dict[int, TierResult] = {}
        self._staging_free: list[int] = []
        self._staging_ready = threading.Condition(self._lock)
        self._metrics: dict[str, list[float]] = {
            "prefetch_pgs": [],
            "backup_pgs": [],
            "prefetch_bandwidth": [],
            "backup_bandwidth": [],
        }

    # -- set-up ---------------------------------------------------------------------------

    def namespace(self, geometry: _PageGeometry) -> bytes:
        """Who may read these records: same model, format and shard (see the module doc)."""
        cfg = self.storage_config
        fields: dict[str, object] = {
            "engine": "sglang",
            "model": cfg.model_name or "",
            "dtype": geometry.dtype,
            "page_size": geometry.page_size,
            "layout": geometry.layout,
            "piece_bytes": geometry.piece_bytes,
            "pieces": geometry.pieces,
            "pp": (cfg.pp_size, cfg.pp_rank),
            "cp": (cfg.attn_cp_size, cfg.attn_cp_rank),
        }
        if not cfg.is_mla_model:
            fields["tp"] = (cfg.tp_size, cfg.tp_rank)
        return namespace_fingerprint(**fields)

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        geometry = _PageGeometry(mem_pool_host)
        if self.interface_v1 and not geometry.zero_copy:
            raise ValueError(
                f"KVOffloadStorage: interface_v1 needs page-contiguous host pages, but "
                f"{geometry.zero_copy_reason}; drop interface_v1 (pages are then copied) or "
                f"use --hicache-mem-layout {ZERO_COPY_LAYOUTS[0]}"
            )
        staging_slots = self.staging_pages * geometry.pieces
        memory = _SplitSlots(geometry.host, geometry.piece_bytes, staging_slots)
        params = dict(self.tier_config.params)
        if "namespace" in inspect.signature(self.tier_config.cls.__init__).parameters:
            params.setdefault("namespace", self.namespace(geometry))  # a tier without one
            # (the in-memory tier) keeps nothing beyond this process anyway
        if self.tier is not None:
            self.tier.close()
        self.tier = self.tier_config.cls(memory, **params)
        self.geometry = geometry
        self._staging_free = list(range(memory.host_slots, memory.num_slots))
        logger.info(
            "kvoffload %s tier for SGLang: %d-byte records, %d per page (%s)",
            self.tier_config.type,
            geometry.piece_bytes,
            geometry.pieces,
            "zero-copy" if geometry.zero_copy else f"copied: {geometry.zero_copy_reason}",
        )

    def _ready(self) -> tuple[Tier, _PageGeometry]:
        if self.tier is None or self.geometry is None:
            raise RuntimeError(
                "KVOffloadStorage: no host pool registered (SGLang calls "
                "register_mem_pool_host right after building the backend)"
            )
        return self.tier, self.geometry

    # -- waiting on our asynchronous tier --------------------------------------------------

    def _run(self, submit: Callable[[Tier], int]) -> TierResult:
        """Submit a job and wait for exactly its result (other threads' results are kept)."""
        tier, _ = self._ready()
        with self._lock:
            job = submit(tier)
        pause = 0.0002
        while True:
            with self._lock:
                for result in tier.poll():
                    self._done[result.job_id] = result
                found = self._done.pop(job, None)
            if found is not None:
                return found
            time.sleep(pause)
            pause = min(pause * 2, self.max_poll_interval_s)

    def _pieces(self, key: str) -> list[OffloadKey]:
        _, geometry = self._ready()
        block = page_key_bytes(key)
        return [make_offload_key(block, i) for i in range(geometry.pieces)]

    def _page_verdicts(self, result: TierResult, pages: int) -> list[bool]:
        _, geometry = self._ready()
        n = geometry.pieces
        return [all(result.ok[i * n : (i + 1) * n]) for i in range(pages)]

    def _presence(self, keys: Sequence[OffloadKey]) -> list[Presence]:
        """Each key's presence; a remote check still in flight is asked again until answered
        (our tiers answer MISS at their lookup deadline, so this ends)."""
        tier, _ = self._ready()
        pause = 0.0002
        while True:
            with self._lock:
                answers = tier.contains(keys)
            if Presence.UNKNOWN not in answers:
                return answers
            time.sleep(pause)
            pause = min(pause * 2, self.max_poll_interval_s)

    def _record(self, kind: str, pages: int, result: TierResult) -> None:
        if not self.storage_config.enable_storage_metrics or pages == 0:
            return
        with self._lock:
            self._metrics[f"{kind}_pgs"].append(pages)
            if result.seconds > 0:
                self._metrics[f"{kind}_bandwidth"].append(result.nbytes / result.seconds / 1e9)

    # -- zero-copy calls (interface_v1) ----------------------------------------------------

    def _host_slots(self, keys: Sequence[str], host_indices: torch.Tensor) -> list[int]:
        _, geometry = self._ready()
        if not geometry.zero_copy:
            raise ValueError(f"KVOffloadStorage: no zero-copy pages: {geometry.zero_copy_reason}")
        if host_indices.numel() != len(keys) * geometry.page_size:
            raise ValueError(
                f"KVOffloadStorage: {len(keys)} page keys need {len(keys) * geometry.page_size} "
                f"host indices, got {host_indices.numel()}"
            )
        starts = host_indices.reshape(-1)[:: geometry.page_size].tolist()
        return [
            slot for start in starts for slot in geometry.slots_of_page(self.mem_pool_host, start)
        ]

    def _zero_copy(self, keys: list[str], host_indices: torch.Tensor, what: str) -> list[bool]:
        """One job between the tier and SGLang's pool: a read (prefetch) or a write (backup)."""
        if not keys:
            return []
        slots = self._host_slots(keys, host_indices)
        ours = [piece for key in keys for piece in self._pieces(key)]
        if what == "prefetch":
            result = self._run(lambda tier: tier.submit_get(ours, slots))
        else:
            result = self._run(lambda tier: tier.submit_put(ours, slots))
        self._record(what, len(keys), result)
        return self._page_verdicts(result, len(keys))

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._zero_copy(keys, host_indices, "prefetch")

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._zero_copy(keys, host_indices, "backup")

    # -- copying calls (SGLang's generic path) ----------------------------------------------

    def _take_staging(self, count: int) -> list[int]:
        with self._staging_ready:
            while len(self._staging_free) < count:
                self._staging_ready.wait()
            taken, self._staging_free = self._staging_free[:count], self._staging_free[count:]
        return taken

    def _give_staging(self, slots: list[int]) -> None:
        with self._staging_ready:
            self._staging_free.extend(slots)
            self._staging_ready.notify_all()

    def _chunks(self, n: int) -> list[range]:
        step = self.staging_pages
        return [range(i, min(i + step, n)) for i in range(0, n, step)]

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        if values is None or len(values) != len(keys):
            return False
        tier, geometry = self._ready()
        memory = tier.memory
        ok = True
        for chunk in self._chunks(len(keys)):
            slots = self._take_staging(len(chunk) * geometry.pieces)
            try:
                ours: list[OffloadKey] = []
                for j, i in enumerate(chunk):
                    page = _bytes_of(values[i].contiguous())
                    if len(page) != geometry.page_bytes:
                        raise ValueError(
                            f"KVOffloadStorage: page {keys[i]!r} has {len(page)} bytes, "
                            f"expected {geometry.page_bytes}"
                        )
                    for p in range(geometry.pieces):
                        part = page[p * geometry.piece_bytes : (p + 1) * geometry.piece_bytes]
                        memory.slot_view(slots[j * geometry.pieces + p])[:] = part
                    ours.extend(self._pieces(keys[i]))
                result = self._run(lambda t, o=ours, s=slots: t.submit_put(o, s))
            finally:
                self._give_staging(slots)
            self._record("backup", len(chunk), result)
            ok = ok and result.all_ok
        return ok

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> list[torch.Tensor | None]:
        tier, geometry = self._ready()
        memory = tier.memory
        targets = target_locations or [None] * len(keys)
        out: list[torch.Tensor | None] = [None] * len(keys)
        for chunk in self._chunks(len(keys)):
            slots = self._take_staging(len(chunk) * geometry.pieces)
            try:
                ours = [piece for i in chunk for piece in self._pieces(keys[i])]
                result = self._run(lambda t, o=ours, s=slots: t.submit_get(o, s))
                self._record("prefetch", len(chunk), result)
                verdicts = self._page_verdicts(result, len(chunk))
                for j, i in enumerate(chunk):
                    if not verdicts[j]:
                        continue
                    target = targets[i]
                    if target is None:
                        target = self.mem_pool_host.get_dummy_flat_data_page()
                    if not target.is_contiguous():  # a reshape would copy: the bytes lost
                        raise ValueError("KVOffloadStorage: batch_get targets must be contiguous")
                    page = _bytes_of(target)
                    for p in range(geometry.pieces):
                        view = memory.slot_view(slots[j * geometry.pieces + p])
                        page[p * geometry.piece_bytes : (p + 1) * geometry.piece_bytes] = view
                    out[i] = target
            finally:
                self._give_staging(slots)
        return out

    def get(
        self, key: str, target_location: Any = None, target_sizes: Any = None
    ) -> torch.Tensor | None:
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        return self.batch_set([key], [value])

    # -- existence ------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        if not keys:
            return 0
        _, geometry = self._ready()
        ours = [piece for key in keys for piece in self._pieces(key)]
        answers = self._presence(ours)
        n = geometry.pieces
        for page in range(len(keys)):
            if any(a is not Presence.HIT for a in answers[page * n : (page + 1) * n]):
                return page
        return len(keys)

    # -- housekeeping ---------------------------------------------------------------------

    def clear(self) -> None:
        """Delete every record this tier lists (``scan``): all of a disk tier's namespace; a
        shared Redis tier lists nothing, so one engine never wipes what others share."""
        tier, _ = self._ready()
        keys = [block.key for block in tier.scan()]
        for start in range(0, len(keys), 1024):
            batch = keys[start : start + 1024]
            self._run(lambda t, b=batch: t.submit_delete(b))

    def tier_stats(self) -> dict[str, float]:
        """Our tier's own counters and gauges (``used_bytes``, ``corrupt_records``, ...)."""
        tier, _ = self._ready()
        with self._lock:
            return dict(tier.stats())

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` since the last call, or None when metrics are off.

        Where SGLang's metrics module does not import (it needs torchvision; a server always
        has it), a :class:`PageIOMetrics` with the same four lists.
        """
        if not self.storage_config.enable_storage_metrics:
            return None
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:
            metrics: Any = PageIOMetrics()
        else:
            metrics = StorageMetrics()
        with self._lock:
            for name, values in self._metrics.items():
                getattr(metrics, name).extend(values)
                values.clear()
        return metrics

    def close(self) -> None:
        if self.tier is not None:
            with self._lock:
                self.tier.close()


__all__ = ["KVOffloadStorage", "PageIOMetrics", "page_key_bytes"]
